"""A node's switch between the device plugin and DRA: what the kubelet's device manager
checkpoint and the node's status keep of the device plugin (gpukit.provision.dra_switch), and
when a DRA node's ResourceSlices serve its declaration (gpukit.provision.agent)."""

from __future__ import annotations

import json
from typing import Any

from gpukit import inventory as inv
from gpukit.provision import agent, dra_switch


def _checkpoint(entries: list[str], registered: list[str]) -> str:
    """The kubelet's kubelet_internal_checkpoint as it writes it (checkpoint v2)."""
    return json.dumps({"Data": {
        "PodDeviceEntries": [{"PodUID": "u1", "ContainerName": "c", "ResourceName": r,
                              "DeviceIDs": {"-1": ["GPU-1"]}, "AllocResp": "x"}
                             for r in entries],
        "RegisteredDevices": {r: ["GPU-1"] for r in registered}}, "Checksum": 1})


def test_the_checkpoint_names_what_the_device_plugin_left() -> None:
    text = _checkpoint(["nvidia.com/gpu", "example.com/fpga"], ["nvidia.com/mig-1g.5gb"])
    assert dra_switch.checkpoint_holds_device_plugin_resources(text) == [
        "nvidia.com/gpu", "nvidia.com/mig-1g.5gb"]
    assert dra_switch.checkpoint_holds_device_plugin_resources(
        _checkpoint([], ["example.com/fpga"])) == []
    assert dra_switch.checkpoint_holds_device_plugin_resources("") == []
    assert dra_switch.checkpoint_holds_device_plugin_resources("{cut sh") == []


def test_the_status_patch_removes_every_nvidia_resource_and_nothing_else() -> None:
    status = {"capacity": {"cpu": "4", "nvidia.com/gpu": "8", "nvidia.com/mig-1g.5gb": "4"},
              "allocatable": {"cpu": "4", "nvidia.com/gpu": "8"}}
    assert dra_switch.stale_resources(status) == ["nvidia.com/gpu", "nvidia.com/mig-1g.5gb"]
    assert dra_switch.status_patch(status) == [
        {"op": "remove", "path": "/status/capacity/nvidia.com~1gpu"},
        {"op": "remove", "path": "/status/capacity/nvidia.com~1mig-1g.5gb"},
        {"op": "remove", "path": "/status/allocatable/nvidia.com~1gpu"}]
    clean = {"capacity": {"cpu": "4"}, "allocatable": {"cpu": "4"}}
    assert dra_switch.stale_resources(clean) == [] and dra_switch.status_patch(clean) == []


def _slice(generation: int, *devices: dict[str, Any]) -> dict[str, Any]:
    return {"spec": {"driver": "gpu.nvidia.com", "nodeName": "n1",
                     "pool": {"name": "n1", "generation": generation, "resourceSliceCount": 1},
                     "devices": list(devices)}}


def _device(name: str, index: int, memory: str = "15Gi", product: str = "Tesla T4"
            ) -> dict[str, Any]:
    return {"name": name, "attributes": {"type": {"string": "gpu"}, "index": {"int": index},
                                         "productName": {"string": product},
                                         "uuid": {"string": f"GPU-{index}"}},
            "capacity": {"memory": {"value": memory}}}


def test_a_dra_node_serves_when_its_newest_slices_equal_the_declaration() -> None:
    decl = inv.node_from_vars("n1", {
        "gpukit_gpu": {"product": "Tesla T4", "count": 2, "memory_mib": 15360},
        "gpukit_gpu_allocation": "dra"})
    expected = inv.expected_dra_devices(decl)
    good = [_slice(1, _device("gpu-0", 0)), _slice(2, _device("gpu-0", 0), _device("gpu-1", 1))]
    assert agent.dra_slice_differences(good, expected) == []  # generation 1 is being replaced
    assert agent.dra_slice_differences([_slice(3, _device("gpu-0", 0))], expected) == [
        "GPU 1: expected a device, observed none"]
    wrong = [_slice(1, _device("gpu-0", 0, memory="16Gi"), _device("gpu-1", 1),
                    _device("gpu-2", 2))]
    assert agent.dra_slice_differences(wrong, expected) == [
        "GPU 0 (gpu-0): capacity memory expected 15Gi, observed 16Gi", "gpu-2: not declared"]
    assert agent.dra_slice_differences([], expected) == [
        "GPU 0: expected a device, observed none", "GPU 1: expected a device, observed none"]
