"""Fixtures for the MIG manager tests: the mock NVML (built once per session) loaded into this
process's pynvml, each test with its own state directory and node profile."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # --import-mode=importlib: for migtest.py

from migtest import MockNode, shutdown_all

from gpukit.lab import nvml as mock


@pytest.fixture(scope="session")
def mock_lib() -> Path:
    try:
        return mock.build()
    except (RuntimeError, OSError) as e:  # pragma: no cover - no compiler / headers
        pytest.skip(f"mock NVML cannot be built: {e}")


@pytest.fixture
def node_factory(
    mock_lib: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., MockNode]]:
    """``node("a100-sxm4-40gb-x8")``: point this process's pynvml at a fresh mock node (own
    state dir) and initialise NVML; switching nodes shuts NVML down first."""
    nodes: list[MockNode] = []

    def start(profile: str, state_dir: Path | None = None) -> MockNode:
        shutdown_all()
        state = state_dir or tmp_path / f"nvml-{len(nodes)}"
        env = mock.env(profile, state, library=mock_lib)
        for key in (mock.ENV_PROFILE, mock.ENV_STATE_DIR, mock.ENV_LIB, "LD_LIBRARY_PATH"):
            monkeypatch.setenv(key, env[key])
        monkeypatch.delenv(mock.ENV_SEED, raising=False)
        node = MockNode(profile, state, mock_lib, env)
        node.init()
        nodes.append(node)
        return node

    yield start
    shutdown_all()


@pytest.fixture
def a100(node_factory: Callable[..., MockNode]) -> MockNode:
    return node_factory("a100-sxm4-40gb-x8")


@pytest.fixture
def h100(node_factory: Callable[..., MockNode]) -> MockNode:
    return node_factory("h100-80gb-x8")


@pytest.fixture
def t4(node_factory: Callable[..., MockNode]) -> MockNode:
    return node_factory("t4-x2")
