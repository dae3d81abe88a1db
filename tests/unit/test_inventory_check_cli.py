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
     # a group's value is one problem, naming its hosts (issue 29: not once per host)
     ["hosts gpu-t4-01, gpu-t4-02, gpu-t4-03: gpukit_gpu.count"]),
    ("t4_nodes/sharing.yml", "gpukit_device_plugin_config: nope\ngpukit_mig_config: null\n",
     ["gpu-t4-03: gpukit_device_plugin_config: 'nope' is not a named config"]),
    ("t4_nodes/hardware.yml", "gpukit_gpu: {product: Tesla T4, count: 4, colour: red}\n",
     ["gpukit_gpu.colour"]),
    # a MIG-capable product gpukit has no table of: said so, never "not MIG capable" (issue 25)
    ("a100_nodes/hardware.yml", "gpukit_gpu: {product: NVIDIA GH200 144G HBM3e, count: 8}\n",
     ["gpu-a100-01", ": gpukit_mig_configs.a100-80gb-mixed[0].mig-devices: ",
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


def _alias_bomb(levels: int = 7, width: int = 9) -> str:
    """width**levels values once expanded, in a few hundred bytes (issue 29: > 60 s at 9^7)."""
    lines = ["l0: &l0 [" + ", ".join(["x"] * width) + "]"]
    lines += [f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]"
              for i in range(1, levels + 1)]
    return "\n".join(lines) + f"\ngpukit_device_plugin_configs: {{bomb: *l{levels}}}\n"


UNREADABLE = {  # group_vars file content -> what the one line says (issue 29, measured cases)
    "alias-bomb": (_alias_bomb().encode(), "bad.yml:1: is refused: the document is more than"),
    "deep": (b"gpukit_node_labels: " + b"[" * 10_000 + b"]" * 10_000 + b"\n",
             "bad.yml:1: is refused: the document is nested deeper than 100 levels"),
    "nul": (b"gpukit_gpu_allocation: dra\0\n", "bad.yml: is refused: the file is binary"),
    "binary": (bytes(range(256)) * 4, "bad.yml: is refused: the file is binary"),
    "latin-1": ("gpukit_gpu_allocation: café\n".encode("latin-1"),
                "bad.yml: is refused: the file is not UTF-8 text (byte 0xe9"),
    "syntax": (b"gpukit_gpu_allocation: [dra\n", "bad.yml:2: is not valid YAML"),
}


@pytest.mark.parametrize("command", [["inventory", "check", "{inv}"], ["manifests", "-i", "{inv}"]],
                         ids=["inventory-check", "manifests"])
@pytest.mark.parametrize("case", sorted(UNREADABLE))
def test_an_unreadable_group_vars_file_is_one_line_naming_it(
        tmp_path: Path, case: str, command: list[str]) -> None:
    """Bounded before Ansible's parser: no hang, no traceback, one line naming the file (and
    line where known), the value echoed truncated, exit 2."""
    content, needle = UNREADABLE[case]
    _one_line_exit_2(tmp_path, content, command, needle)


def test_a_five_mb_value_is_echoed_truncated_once(tmp_path: Path) -> None:
    """A 5 MB value is shown truncated, and once for the three hosts of its group."""
    _one_line_exit_2(tmp_path, b"gpukit_gpu_allocation: " + b"x" * 5_000_000 + b"\n",
                     ["inventory", "check", "{inv}"],
                     "hosts gpu-t4-01, gpu-t4-02, gpu-t4-03: gpukit_gpu_allocation: 'xxx")


def _one_line_exit_2(tmp_path: Path, content: bytes, command: list[str], needle: str) -> None:
    inv = tmp_path / "inv"
    shutil.copytree(EXAMPLE, inv)
    (inv / "group_vars" / "t4_nodes" / "bad.yml").write_bytes(content)
    r = subprocess.run([sys.executable, "-m", "gpukit", *(a.format(inv=inv) for a in command)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert needle in r.stderr, r.stderr
    assert len(r.stderr.splitlines()) == 1 and len(r.stderr) < 1000, r.stderr[:2000]


def test_a_shared_config_prints_its_replicas_and_mps_limits(tmp_path: Path) -> None:
    """Issue 26: what each MPS client of a replica gets, before any host is touched."""
    inventory = tmp_path / "lab"
    shutil.copytree(REPO / "inventories" / "lab", inventory)
    t4 = inventory / "group_vars" / "t4_nodes.yml"
    t4.write_text(t4.read_text().replace(
        "gpukit_device_plugin_config: time-sliced", "gpukit_device_plugin_config: mps2")
        + "gpukit_device_plugin_configs:\n  mps2:\n    version: v1\n"
          "    flags: {plugin: {deviceListStrategy: cdi-annotations}}\n"
          "    sharing: {mps: {resources: [{name: nvidia.com/gpu, replicas: 2}]}}\n")
    r = check(inventory)
    assert r.returncode == 0, r.stderr
    assert ("gpu-t4                   nvidia.com/gpu=4 (MPS: nvidia.com/gpu 2 replicas per "
            "device, each 7680 MiB pinned memory, 50 % of the threads)") in r.stdout, r.stdout
    r = check(REPO / "inventories" / "lab")
    assert "nvidia.com/gpu=8 (time-slicing: nvidia.com/gpu 4 replicas per device)" in r.stdout
