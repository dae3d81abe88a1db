"""Programs the tests run from Debian packages the lab's dependencies install
(gpukit/lab/scripts/install-deps.sh): a missing one fails the test naming its package."""

from __future__ import annotations

import shutil

import pytest


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is missing: install Debian's prometheus package "
                    "(gpukit/lab/scripts/install-deps.sh)")
    return path
