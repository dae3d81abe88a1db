"""A node's switch between the device plugin and DRA: what the kubelet's device manager
checkpoint and the node's status keep of the device plugin (gpukit.provision.dra_switch)."""

from __future__ import annotations

import json

from gpukit.provision import dra_switch


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
