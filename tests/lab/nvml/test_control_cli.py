"""`python -m gpukit.lab.nvml`: the lab's control CLI over the library's gpukitMock* entry
points, on the same state directory that NVML users see."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpukit.lab import nvml as mock

pytestmark = pytest.mark.nvml


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpukit.lab.nvml", *args], env=env,
                          capture_output=True, text=True, timeout=30)


def test_status_set_and_clear_processes(nvml: Any, nvml_env: dict[str, str]) -> None:
    r = cli(nvml_env, "set-processes", "--gpu", "0", "--pid", "1234", "--mem-mb", "100",
            "--name", "trainer")
    assert r.returncode == 0, r.stderr
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    procs = nvml.nvmlDeviceGetComputeRunningProcesses(h)
    assert [(p.pid, p.usedGpuMemory) for p in procs] == [(1234, 100 << 20)]
    st = json.loads(cli(nvml_env, "status").stdout)
    assert st["gpus"][0]["processes"] == [{"pid": 1234, "used_memory_bytes": 100 << 20,
                                           "gpu_instance_id": None, "compute_instance_id": None,
                                           "name": "trainer"}]
    assert st["gpus"][0]["uuid"] == nvml.nvmlDeviceGetUUID(h)
    r = cli(nvml_env, "reset", "--gpu", "0")
    assert r.returncode == 1 and "reset GPU 0: In use by another client" in r.stderr
    assert cli(nvml_env, "clear-processes").returncode == 0
    assert nvml.nvmlDeviceGetComputeRunningProcesses(h) == []
    assert cli(nvml_env, "reset", "--gpu", "0").returncode == 0


def test_reset_applies_pending_mig_mode(nvml: Any, nvml_env: dict[str, str]) -> None:
    h = nvml.nvmlDeviceGetHandleByIndex(7)
    nvml.nvmlDeviceSetMigMode(h, 1)
    assert cli(nvml_env, "reset", "--gpu", "7").returncode == 0
    assert nvml.nvmlDeviceGetMigMode(h) == [1, 1]


def test_lose_and_restore(nvml: Any, nvml_env: dict[str, str]) -> None:
    h = nvml.nvmlDeviceGetHandleByIndex(1)
    assert cli(nvml_env, "lose", "--gpu", "1").returncode == 0
    with pytest.raises(nvml.NVMLError_GpuIsLost):
        nvml.nvmlDeviceGetUUID(h)
    assert json.loads(cli(nvml_env, "status").stdout)["gpus"][1]["lost"] is True
    assert cli(nvml_env, "restore", "--gpu", "1").returncode == 0
    assert nvml.nvmlDeviceGetUUID(h).startswith("GPU-")


def test_explicit_profile_and_state_dir_options(mock_lib: Path, tmp_path: Path) -> None:
    env = mock.env("t4-x2", tmp_path / "unused", library=mock_lib)
    st = tmp_path / "t4-state"
    r = cli(env, "--profile", "t4-x2", "--state-dir", str(st), "set-processes", "--gpu", "1",
            "--pid", "42")
    assert r.returncode == 0, r.stderr
    assert "proc 1 42 bytes 0" in (st / "state").read_text()
    out = json.loads(cli(env, "--state-dir", str(st), "status").stdout)
    assert out["profile"] == "t4-x2" and out["gpus"][1]["processes"][0]["pid"] == 42


def test_errors_are_reported(nvml_env: dict[str, str], tmp_path: Path) -> None:
    r = cli(nvml_env, "inject-xid", "--gpu", "9", "--xid", "79")
    assert r.returncode == 1 and "Invalid Argument" in r.stderr
    r = cli({**nvml_env, mock.ENV_PROFILE: str(tmp_path / "missing.yaml")}, "status")
    assert r.returncode == 1 and "missing.yaml" in r.stderr and "Driver Not Loaded" in r.stderr
    r = cli(nvml_env, "set-processes", "--gpu", "0")
    assert r.returncode == 2  # usage: --pid is required


def test_refuses_a_library_that_is_not_the_mock(nvml_env: dict[str, str]) -> None:
    import ctypes.util

    libc = ctypes.util.find_library("c")
    assert libc
    r = cli(nvml_env, "--lib", libc, "status")
    assert r.returncode == 1 and "not the gpukit mock NVML" in r.stderr


def test_profiles_and_env(mock_lib: Path, tmp_path: Path) -> None:
    env = mock.env("t4-x2", tmp_path, library=mock_lib)
    names = cli(env, "profiles").stdout.split()
    assert {"a100-sxm4-40gb-x8", "a100-80gb-x4", "h100-80gb-x8", "t4-x2",
            "a100-sxm4-40gb-x16"} <= set(names)
    out = cli(env, "env", "h100-80gb-x8", "/var/lib/x").stdout
    assert f"export GPUKIT_NVML_PROFILE={mock.PROFILES_DIR / 'h100-80gb-x8.yaml'}" in out
    assert "export GPUKIT_NVML_STATE_DIR=/var/lib/x" in out
