"""`python -m gpukit.plugin.mig`: the MIG manager (see cli.py)."""

import sys

from .cli import main

sys.exit(main())
