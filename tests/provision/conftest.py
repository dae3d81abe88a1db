"""Fixtures for gpukit.provision tests: a process environment pointing at the mock NVML;
real containerd binaries (the lab's builds) that judge gpukit's containerd configs."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from gpukit.lab import nvml as mock

# --import-mode=importlib does not put test dirs on sys.path; moduletest.py needs it.
sys.path.insert(0, os.path.dirname(__file__))
REPO = Path(__file__).resolve().parents[2]
# The containerd release that reads each config version: 3 is containerd 2's, 2 is 1.7's.
CONTAINERD_RELEASES = {3: "v2.2.9", 2: "v1.7.35"}


@pytest.fixture(scope="session")
def mock_lib() -> Path:
    return mock.build()


@pytest.fixture
def mock_env(mock_lib: Path, tmp_path: Path) -> dict[str, str]:
    """Environment for a subprocess that sees 8 mock A100s (own state directory)."""
    env = mock.env("a100-sxm4-40gb-x8", tmp_path / "nvml", library=mock_lib)
    env.pop(mock.ENV_SEED, None)
    return env


def containerd_binary(release: str) -> Path:
    """containerd `release` from the lab's build cache, built there when missing: `make test`
    builds only the lab's default release (the other one, once, takes about two minutes).
    A failed build fails the test; it never skips."""
    cache = Path(os.environ.get("GPUKIT_CACHE") or Path.home() / ".cache" / "gpukit")
    binary = cache / "containerd" / release / "bin" / "containerd"
    if os.access(binary, os.X_OK):
        return binary
    script = REPO / "gpukit/lab/scripts/build-containerd.sh"
    r = subprocess.run(["bash", str(script)], env={**os.environ, "GPUKIT_CONTAINERD_VERSION": release},
                       capture_output=True, text=True, timeout=570)  # fmt: skip
    if r.returncode != 0 or not os.access(binary, os.X_OK):
        pytest.fail(f"{binary} is missing and building it failed (exit {r.returncode}):"
                    f" {r.stderr[-2000:]}\nbuild it with: GPUKIT_CONTAINERD_VERSION={release}"
                    f" bash {script.relative_to(REPO)}", pytrace=False)  # fmt: skip
    return binary


@pytest.fixture(scope="session", params=sorted(CONTAINERD_RELEASES), ids=lambda v: f"v{v}")
def config_version(request: pytest.FixtureRequest) -> int:
    """A containerd config version (2, 3): tests run once per version."""
    return int(request.param)


@pytest.fixture(scope="session")
def containerd_for() -> Callable[[int], Path]:
    """The real containerd that reads a config version's files (CONTAINERD_RELEASES)."""
    return lambda version: containerd_binary(CONTAINERD_RELEASES[version])


@pytest.fixture(scope="session")
def containerd_bin(config_version: int, containerd_for: Callable[[int], Path]) -> Path:
    """The real containerd that reads `config_version`'s files."""
    return containerd_for(config_version)
