"""`python -m gpukit.plugin.dra`: the DRA kubelet plugin (see cli.py)."""

import sys

from ..signals import INBOX, StopRequested

# Before the heavy imports: the plugin is its container's PID 1 (see gpukit/plugin/signals.py).
INBOX.install()
try:
    from .cli import main
except StopRequested:
    sys.exit(0)

sys.exit(main())
