"""Shared fixtures: the lab cluster (session-wide), brought up once when a test needs it."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

# tests/hardware need a real GPU (`make hardware` sets this); elsewhere they are not collected.
collect_ignore = [] if os.environ.get("GPUKIT_HARDWARE") == "1" else ["hardware"]


@pytest.fixture(scope="session")
def lab_cluster() -> Iterator[object]:
    from gpukit.lab.pytest_provider import LabManager

    manager = LabManager()
    manager.create()
    yield manager
    manager.delete()
