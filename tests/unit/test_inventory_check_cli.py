"""`gpukit inventory check INV` validates every GPU node's declaration on the controller, before
any host is touched (issue 15): the example fleet passes; broken copies fail naming host,
variable and value, every problem at once, with exit status 2."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "inventories" / "example"


def check(inventory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpukit", "inventory", "check", str(inventory)],
                          capture_output=True, text=True, timeout=120)


def test_the_example_fleet_passes() -> None:
    r = check(EXAMPLE)
    assert r.returncode == 0, r.stderr
    assert "13 GPU node(s), every declaration valid" in r.stdout
    assert "gpu-t4-01                nvidia.com/gpu=16" in r.stdout


@pytest.mark.parametrize(("file", "text", "needles"), [
    ("t4_nodes/hardware.yml", "gpukit_gpu: {product: Tesla T4, count: -1}\n",
     ["gpu-t4-01: gpukit_gpu.count", "gpu-t4-02: gpukit_gpu.count", "gpu-t4-03"]),
    ("t4_nodes/sharing.yml", "gpukit_device_plugin_config: nope\ngpukit_mig_config: null\n",
     ["host gpu-t4-01: gpukit_device_plugin_config: 'nope' is not a named config"]),
    ("t4_nodes/hardware.yml", "gpukit_gpu: {product: Tesla T4, count: 4, colour: red}\n",
     ["gpukit_gpu.colour"]),
    # a MIG-capable product gpukit has no table of: said so, never "not MIG capable" (issue 25)
    ("a100_nodes/hardware.yml", "gpukit_gpu: {product: NVIDIA GH200 144G HBM3e, count: 8}\n",
     ["host gpu-a100-01: gpukit_mig_configs.a100-80gb-mixed[0].mig-devices: ",
      "asks for MIG devices, but no MIG table for 'NVIDIA GH200 144G HBM3e' in gpukit (known: "]),
])
def test_a_broken_copy_fails_naming_host_variable_and_value(
        tmp_path: Path, file: str, text: str, needles: list[str]) -> None:
    inv = tmp_path / "inv"
    shutil.copytree(EXAMPLE, inv)
    (inv / "group_vars" / file).write_text(text)
    r = check(inv)
    assert r.returncode == 2, r.stdout + r.stderr
    for needle in needles:
        assert needle in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and "not MIG capable" not in r.stderr
