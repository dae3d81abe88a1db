"""Shared fixtures: the lab cluster (session-wide), brought up once when a test needs it;
a short temporary directory for unix sockets."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# --import-mode=importlib does not put test folders on sys.path; labtools.py (the lab tests'
# helper module, tests/lab and tests/roles alike) needs it.
sys.path.insert(0, os.path.dirname(__file__))

# tests/hardware need a real GPU (`make hardware` sets this); elsewhere they are not collected.
collect_ignore = [] if os.environ.get("GPUKIT_HARDWARE") == "1" else ["hardware"]


@pytest.fixture(scope="session")
def lab_cluster() -> Iterator[object]:
    from gpukit.lab.pytest_provider import LabManager

    manager = LabManager()
    manager.create()
    yield manager
    manager.delete()


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short temp dir: unix socket paths must stay under 108 bytes."""
    path = Path(tempfile.mkdtemp(prefix="gk-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
