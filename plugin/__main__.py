"""`python -m gpukit.plugin`: the device plugin entry point (see cli.py)."""

import sys

from .cli import main

sys.exit(main())
