"""Fixtures for the device plugin tests; factories live in plugin_testlib.py."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# --import-mode=importlib does not put test dirs on sys.path; the factories module needs it.
sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short temp dir: unix socket paths must stay under 108 bytes."""
    path = Path(tempfile.mkdtemp(prefix="gk-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
