"""Every command gpukit installs answers --version with the package's version (issue 15)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpukit import __version__

BIN = Path(sys.executable).parent


@pytest.mark.parametrize("argv", [
    [str(BIN / "gpukit")],
    [sys.executable, "-m", "gpukit"],
    [str(BIN / "gpukit-device-plugin")],
    [sys.executable, "-m", "gpukit.plugin"],
    [sys.executable, "-m", "gpukit.plugin.mig"],
    [sys.executable, "-m", "gpukit.summary"],
    [str(BIN / "gpukit"), "plugin"],
    [str(BIN / "gpukit"), "mig"],
    [str(BIN / "gpukit"), "summary"],
])
def test_version(argv: list[str]) -> None:
    out = subprocess.run([*argv, "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith(f" {__version__}"), out.stdout


def test_the_package_version_is_spelled_once() -> None:
    import tomllib

    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert project["project"]["version"] == __version__
