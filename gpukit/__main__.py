"""`python -m gpukit`: the same command line as `gpukit`."""

from gpukit.cli import main

main()
