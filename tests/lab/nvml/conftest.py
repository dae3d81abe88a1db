"""Fixtures for the mock NVML tests: the library is built once per session (make), every test
gets its own state directory, and pynvml is used as a user would: in-process with the library
handle set by gpukit.lab.nvml.load_mock, or in a subprocess that finds libnvidia-ml.so.1 through
LD_LIBRARY_PATH."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

sys.path.insert(0, os.path.dirname(__file__))  # --import-mode=importlib: for nvmltest.py

from gpukit.lab import nvml as mock
from gpukit.lab.nvml.control import MockControl

DEFAULT_PROFILE = "a100-sxm4-40gb-x8"


@pytest.fixture(scope="session")
def mock_lib() -> Path:
    """Build the library (make: a no-op when up to date) into the repository's build dir."""
    return mock.build()


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "nvml-state"


@pytest.fixture
def profile_name() -> str:
    """Override with @pytest.mark.parametrize("profile_name", [...]) to use another node."""
    return DEFAULT_PROFILE


@pytest.fixture
def nvml_env(
    mock_lib: Path, state_dir: Path, profile_name: str, monkeypatch: pytest.MonkeyPatch
) -> dict[str, str]:
    """Point this process (and the subprocesses it starts with this env) at the mock GPUs."""
    env = mock.env(profile_name, state_dir, library=mock_lib)
    for key in (mock.ENV_PROFILE, mock.ENV_STATE_DIR, mock.ENV_LIB, "LD_LIBRARY_PATH"):
        monkeypatch.setenv(key, env[key])
    monkeypatch.delenv(mock.ENV_SEED, raising=False)
    return env


def _shutdown_all(pynvml: Any) -> None:
    while True:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            return


@pytest.fixture
def nvml(mock_lib: Path, nvml_env: dict[str, str]) -> Iterator[Any]:
    """pynvml, initialised against the mock with this test's profile and state dir."""
    import pynvml

    _shutdown_all(pynvml)
    mock.load_mock(mock_lib)
    pynvml.nvmlInit()
    yield pynvml
    _shutdown_all(pynvml)


@pytest.fixture
def ctl(mock_lib: Path, nvml_env: dict[str, str]) -> MockControl:
    """Lab control operations on the same library, profile and state dir."""
    return MockControl(mock_lib)


@pytest.fixture
def nvml_with_profile(mock_lib: Path, tmp_path: Path,
                      monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[dict[str, Any]], Any]]:
    """`nvml_with_profile(doc)`: pynvml initialised against the mock with the profile `doc`
    (written to a temporary file) and a fresh state dir; shut down after the test."""
    import pynvml

    def start(doc: dict[str, Any]) -> Any:
        path = tmp_path / "profile.yaml"
        path.write_text(yaml.safe_dump(doc))
        monkeypatch.setenv(mock.ENV_PROFILE, str(path))
        monkeypatch.setenv(mock.ENV_STATE_DIR, str(tmp_path / "state"))
        mock.load_mock(mock_lib)
        pynvml.nvmlInit()
        return pynvml

    yield start
    _shutdown_all(pynvml)
