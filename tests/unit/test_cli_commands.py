"""`gpukit plugin|mig|summary` are the existing entry points under one command: the same
arguments, output and exit status as `gpukit-device-plugin`, `python -m gpukit.plugin.mig` and
`python -m gpukit.summary`, which keep working."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

BIN = Path(sys.executable).parent
GPUKIT = [str(BIN / "gpukit")]


def run(argv: list[str]) -> tuple[int, str, str]:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout, r.stderr


def same(old: list[str], new: list[str], tmp_path: Path) -> tuple[int, str, str]:
    """Both commands: the same exit status and output (stderr names the command run)."""
    a, b = run(old), run(new)
    assert a[0] == b[0] and a[1] == b[1], (a, b)
    return a


@pytest.mark.parametrize("config", [
    "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
    "    - {name: nvidia.com/gpu, replicas: 3}\n",
    "version: v1\nsharing:\n  timeSlicng: {}\n",
])
def test_plugin(tmp_path: Path, config: str) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(config)
    args = ["--check-config", "--config-file", str(f)]
    for old in ([str(BIN / "gpukit-device-plugin")], [sys.executable, "-m", "gpukit.plugin"]):
        rc, out, err = same([*old, *args], [*GPUKIT, "plugin", *args], tmp_path)
    if "timeSlicng" in config:
        assert rc == 2 and "timeSlicng: unknown field" in err
    else:
        assert rc == 0 and '"replicas": 3' in out


def test_mig(tmp_path: Path) -> None:
    f = tmp_path / "mig.yaml"
    f.write_text(yaml.safe_dump({"version": "v1", "mig-configs": {"x": [
        {"devices": "all", "mig-enabled": True, "mig-devices": {"9g.99gb": 1}}]}}))
    args = ["plan", "--config-file", str(f), "--selected", "nope"]
    rc, _, err = same([sys.executable, "-m", "gpukit.plugin.mig", *args],
                      [*GPUKIT, "mig", *args], tmp_path)
    assert rc == 2 and "nope" in err
    # --help is the MIG manager's own, naming the command it was called as.
    rc, out, _ = run([*GPUKIT, "mig", "--help"])
    assert rc == 0 and out.startswith("usage: gpukit mig ") and "{plan,apply,assert,export}" in out


def test_summary(tmp_path: Path) -> None:
    junit = tmp_path / "j.xml"
    junit.write_text(
        "<testsuites><testsuite time='3'><testcase classname='c' name='test_a[n1]'>"
        "<properties><property name='node' value='n1'/></properties>"
        "<failure message='node n1: expected 2, observed 1'/></testcase></testsuite>"
        "</testsuites>")
    args = ["--junit", str(junit), "--strict"]
    rc, out, _ = same([sys.executable, "-m", "gpukit.summary", *args],
                      [*GPUKIT, "summary", *args], tmp_path)
    assert rc == 1 and "failed:      test_a[n1]: node n1: expected 2, observed 1" in out
