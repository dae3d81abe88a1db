"""A pytest plugin the interruption test loads into a child conformance run (`-p`).

After the run's first test, the child writes $GPUKIT_TEST_HOLD_FILE and waits there (at
most 120 s), so the parent's signal lands while the run's pods still hold the node's
devices. Without it the signal races the run's end: the suite can finish first.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest


def pytest_runtest_teardown(item: pytest.Item) -> None:
    marker = os.environ.get("GPUKIT_TEST_HOLD_FILE")
    if marker and not Path(marker).exists():
        Path(marker).write_text(item.nodeid)
        time.sleep(120)
