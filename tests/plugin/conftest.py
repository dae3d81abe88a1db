"""Fixtures for the device plugin tests; factories live in plugin_testlib.py."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# --import-mode=importlib does not put test dirs on sys.path; the factories module needs it.
sys.path.insert(0, os.path.dirname(__file__))

from plugin_testlib import FakeKubelet

# Agents started by these tests (in-process or as processes) keep no last good config record
# on this machine; the tests that need one pass a temporary path.
os.environ["GPUKIT_LAST_GOOD_CONFIG"] = ""


@pytest.fixture
def kubelet(short_tmp: Path) -> Iterator[FakeKubelet]:
    """A stand-in kubelet Registration server in a short temporary directory."""
    k = FakeKubelet(short_tmp)
    k.start()
    yield k
    k.stop()
