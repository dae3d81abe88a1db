"""Fixtures for gpukit.provision tests: a process environment pointing at the mock NVML."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpukit.lab import nvml as mock


@pytest.fixture(scope="session")
def mock_lib() -> Path:
    return mock.build()


@pytest.fixture
def mock_env(mock_lib: Path, tmp_path: Path) -> dict[str, str]:
    """Environment for a subprocess that sees 8 mock A100s (own state directory)."""
    env = mock.env("a100-sxm4-40gb-x8", tmp_path / "nvml", library=mock_lib)
    env.pop(mock.ENV_SEED, None)
    return env
