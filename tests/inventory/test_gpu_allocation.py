"""`gpukit_gpu_allocation`: which API serves a node's GPUs (device plugin or DRA), validated by
the model, and what a DRA node must then serve (the oracle: ResourceSlice devices, no
nvidia.com/ extended resources, no GFD labels), in the preflight's fact and `inventory check`."""

from __future__ import annotations

import re
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpukit import inventory as inv
from gpukit.cli import app
from gpukit.conformance import expect
from gpukit.inventory.model import DEFAULT_GPU_ALLOCATION, GPU_ALLOCATIONS
from gpukit.provision import declaration

LAB = Path(__file__).resolve().parents[2] / "inventories" / "lab"
A100 = "NVIDIA A100-SXM4-40GB"


def _decl(**raw: Any) -> inv.NodeDecl:
    raw.setdefault("gpukit_gpu", {"product": "Tesla T4", "count": 2, "memory_mib": 15360})
    raw.setdefault("gpukit_runtime_accept_envvar_unprivileged", True)
    return inv.node_from_vars("n1", raw)


def test_default_is_the_device_plugin() -> None:
    d = _decl()
    assert (d.gpu_allocation, d.dra) == (DEFAULT_GPU_ALLOCATION, False) == ("device-plugin",
                                                                           False)
    assert expect.expected_dra_devices(d) == []
    assert expect.expected_resources(d) == {"nvidia.com/gpu": 2}


@pytest.mark.parametrize("value", ["DRA", "both", "", 1, True, ["dra"]])
def test_a_bad_value_names_host_variable_and_value(value: object) -> None:
    with pytest.raises(inv.InventoryError) as exc:
        _decl(gpukit_gpu_allocation=value)
    text = str(exc.value)
    assert f"host n1: gpukit_gpu_allocation: {value!r}" in text
    assert (f"is not one of {', '.join(GPU_ALLOCATIONS)}" in text
            or "is not a non-empty string" in text)


def test_a_dra_node_serves_slices_not_extended_resources() -> None:
    d = _decl(gpukit_gpu_allocation="dra")
    assert d.dra
    assert expect.expected_resources(d) == {}  # no nvidia.com/ capacity on a DRA node
    assert expect.expected_labels(d) == {}
    devices = expect.expected_dra_devices(d)
    assert [(x.type, x.gpu_index) for x in devices] == [("gpu", 0), ("gpu", 1)]
    assert devices[0].attributes() == {"type": {"string": "gpu"},
                                       "productName": {"string": "Tesla T4"},
                                       "index": {"int": 0}}
    assert devices[0].capacity() == {"memory": "15Gi"}
    assert re.fullmatch(devices[0].name_pattern, "gpu-0")


def test_a_dra_node_serves_the_mig_devices_of_its_layout() -> None:
    layout = [{"devices": [0], "mig-enabled": True,
               "mig-devices": {"3g.20gb": 1, "1g.5gb": 2}},
              {"devices": [1], "mig-enabled": False}]
    d = _decl(gpukit_gpu={"product": A100, "count": 2, "memory_mib": 40960},
              gpukit_mig_configs={"l": layout}, gpukit_mig_config="l",
              gpukit_gpu_allocation="dra")
    devices = expect.expected_dra_devices(d)
    assert [(x.type, x.gpu_index, x.profile) for x in devices] == [
        ("mig", 0, "1g.5gb"), ("mig", 0, "1g.5gb"), ("mig", 0, "3g.20gb"), ("gpu", 1, None)]
    mig = devices[2]
    assert mig.attributes()["profile"] == {"string": "3g.20gb"}
    assert mig.attributes()["parentIndex"] == {"int": 0}
    assert mig.capacity() == {"memory": "19968Mi", "multiprocessors": "42"}
    # NVIDIA's MIG device names: profile without dots, GI profile id, placement start.
    assert re.fullmatch(mig.name_pattern, "gpu-0-mig-3g20gb-9-4")
    assert not re.fullmatch(mig.name_pattern, "gpu-0-mig-1g5gb-19-4")
    assert re.fullmatch(devices[0].name_pattern, "gpu-0-mig-1g5gb-19-6")


def test_a_dra_node_ignores_the_device_plugin_strategy() -> None:
    """migStrategy single over mixed profiles is refused for a device plugin node; on DRA the
    device plugin config does not apply, so the same layout is served as MIG devices."""
    layout = [{"devices": "all", "mig-enabled": True,
               "mig-devices": {"3g.20gb": 1, "2g.10gb": 1}}]
    raw: dict[str, Any] = {
        "gpukit_gpu": {"product": A100, "count": 1},
        "gpukit_mig_configs": {"l": layout}, "gpukit_mig_config": "l",
        "gpukit_device_plugin_configs": {"s": {"version": "v1",
                                               "flags": {"migStrategy": "single"}}},
        "gpukit_device_plugin_config": "s"}
    with pytest.raises(inv.InventoryError, match="migStrategy single"):
        expect.expected_resources(_decl(**raw))
    d = _decl(**raw, gpukit_gpu_allocation="dra")
    assert expect.expected_resources(d) == {}
    assert sorted(x.profile or "" for x in expect.expected_dra_devices(d)) == ["2g.10gb",
                                                                                "3g.20gb"]


def test_the_preflight_fact_and_inventory_check_say_dra() -> None:
    checked = inv.check(LAB, host_vars={"gpu-t4": {"gpukit_gpu_allocation": "dra"}})
    assert not checked.problems
    assert checked.resources["gpu-t4"] == {}
    facts = declaration.facts(checked)
    t4, a100 = facts["gpu-t4"], facts["gpu-a100"]
    assert (t4["gpu_allocation"], a100["gpu_allocation"]) == ("dra", "device-plugin")
    assert [x["attributes"]["index"] for x in t4["expected_dra_devices"]] == [
        {"int": 0}, {"int": 1}]
    assert a100["expected_dra_devices"] == []
    assert t4["inputs"]["gpukit_gpu_allocation"] == "dra"


def test_inventory_check_prints_what_a_dra_node_serves(tmp_path: Path) -> None:
    root = tmp_path / "lab"
    shutil.copytree(LAB, root)
    (root / "host_vars").mkdir(exist_ok=True)
    # gpu-t4 on DRA: the lab's quotas name only resources gpu-a100 still serves
    (root / "host_vars" / "gpu-t4.yml").write_text("gpukit_gpu_allocation: dra\n")
    result = CliRunner().invoke(app, ["inventory", "check", str(root)])
    out = result.output
    assert result.exit_code == 0, out
    assert re.search(r"gpu-t4 +DRA gpu\.nvidia\.com: gpu=2", out), out
    assert re.search(r"gpu-a100 +nvidia\.com/gpu=6, nvidia\.com/mig-1g\.5gb=4", out), out


def test_a_dra_mig_layout_is_printed_per_profile() -> None:
    layout = [{"devices": [0], "mig-enabled": True, "mig-devices": {"3g.20gb": 1, "1g.5gb": 2}}]
    d = _decl(gpukit_gpu={"product": A100, "count": 2}, gpukit_mig_configs={"l": layout},
              gpukit_mig_config="l", gpukit_gpu_allocation="dra")
    assert Counter(x["profile"] or "gpu" for x in inv.expected_dra_devices(d)) == {
        "1g.5gb": 2, "3g.20gb": 1, "gpu": 1}
