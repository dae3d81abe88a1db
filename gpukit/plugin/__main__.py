"""`python -m gpukit.plugin`: the device plugin entry point (see cli.py)."""

import sys

from .signals import INBOX, StopRequested

# Before the heavy imports: the agent is its container's PID 1, and the kernel drops a
# SIGTERM that PID 1 has no handler for (signals.py).
INBOX.install()
try:
    from .cli import main
except StopRequested:
    sys.exit(0)

sys.exit(main())
