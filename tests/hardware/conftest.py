"""Tests that need a real NVIDIA GPU and driver: `make hardware` on a GPU machine.

`make test` does not collect this directory (CI has no GPU). Run anywhere else, they stop the
session with an error instead of skipping: a skipped test must never read as a pass.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "plugin"))  # plugin_testlib

SMI_FIELDS = ("index", "uuid", "name", "memory.total", "pci.bus_id", "compute_cap",
              "driver_version", "mig.mode.current")


def _real_driver() -> str | None:
    """Why this machine cannot run these tests, or None."""
    if shutil.which("nvidia-smi") is None:
        return "no nvidia-smi"
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        return f"NVML does not initialise: {e}"
    try:
        pynvml.nvmlDeviceGetHandleByIndex(0)
        # The lab mock has extra entry points; the driver's library does not.
        lib = pynvml.nvmlLib
        if hasattr(lib, "gpukitMockInjectXid") or os.environ.get("GPUKIT_NVML_PROFILE"):
            return "NVML is the gpukit lab mock"
    except (pynvml.NVMLError, AttributeError) as e:
        return f"no GPU: {e}"
    finally:
        pynvml.nvmlShutdown()
    return None


def pytest_configure(config: pytest.Config) -> None:
    why = _real_driver()
    if why:
        pytest.exit(f"tests/hardware need a real NVIDIA GPU and driver ({why})", returncode=3)


@pytest.fixture(scope="session")
def smi() -> list[dict[str, str]]:
    """nvidia-smi's view of every GPU: the independent witness the tests compare with."""
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, check=True,
    ).stdout
    return [dict(zip(SMI_FIELDS, (v.strip() for v in line.split(",")), strict=True))
            for line in out.strip().splitlines()]
