"""Fixtures for the device plugin tests; factories live in plugin_testlib.py."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

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


@pytest.fixture
def mock_node(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Callable[[str], Any]:
    """`mock_node(profile)`: this process's pynvml on the mock with that profile and a fresh
    state dir; returns the mock's control handle."""
    from gpukit.lab.nvml import ENV_LIB, ENV_PROFILE, ENV_STATE_DIR, build, load_mock, profile_path
    from gpukit.lab.nvml.control import MockControl

    lib = build()

    def start(profile: str) -> Any:
        monkeypatch.setenv(ENV_PROFILE, str(profile_path(profile)))
        monkeypatch.setenv(ENV_STATE_DIR, str(tmp_path / "nvml-state"))
        monkeypatch.setenv(ENV_LIB, str(lib))
        load_mock(lib)
        return MockControl(lib)

    return start
