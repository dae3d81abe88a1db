"""Helpers shared by the mock NVML tests (a plain module: conftest puts this directory on
sys.path)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import pytest

from gpukit.lab.nvml.control import MockControl


def nvml_error(pynvml: Any, code: int, fn: Callable[..., Any], *args: Any) -> None:
    """Assert that fn(*args) fails with exactly this NVML return code."""
    with pytest.raises(pynvml.NVMLError) as e:
        fn(*args)
    assert e.value.value == code, f"expected {pynvml.nvmlErrorString(code)}, got {e.value}"


def run_py(
    code: str, env: dict[str, str], timeout: float = 30, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run Python code in a fresh process with this environment (its pynvml finds the mock
    through LD_LIBRARY_PATH, unchanged)."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"subprocess failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def run_json(code: str, env: dict[str, str], timeout: float = 30) -> Any:
    """run_py, then parse the last line it printed as JSON."""
    out = run_py(code, env, timeout).stdout.strip().splitlines()
    return json.loads(out[-1])


def enable_mig(pynvml: Any, ctl: MockControl, index: int) -> Any:
    """Enable MIG as an operator does on an A100: set the mode, then reset the GPU."""
    h = pynvml.nvmlDeviceGetHandleByIndex(index)
    status = pynvml.nvmlDeviceSetMigMode(h, pynvml.NVML_DEVICE_MIG_ENABLE)
    assert status == pynvml.NVML_ERROR_RESET_REQUIRED
    assert pynvml.nvmlDeviceGetMigMode(h) == [0, 1]
    ctl.reset(index)
    assert pynvml.nvmlDeviceGetMigMode(h) == [1, 1]
    return h


def gi_placement(pynvml: Any, start: int, size: int) -> Any:
    """A placement argument as pynvml passes it on: by reference."""
    p = pynvml.c_nvmlGpuInstancePlacement_t()
    p.start, p.size = start, size
    return pynvml.byref(p)


def ci_placement(pynvml: Any, start: int, size: int) -> Any:
    p = pynvml.c_nvmlComputeInstancePlacement_t()
    p.start, p.size = start, size
    return pynvml.byref(p)
