"""Allocate responses for every device list strategy, ID strategy and the error cases."""

from __future__ import annotations

from typing import Any

import pytest
from plugin_testlib import T4, cfg, gpu_uuid, make_gpu, make_inventory, mig_uuid

from gpukit.plugin.allocate import AllocationError, Allocator, DeviceNode, Mount
from gpukit.plugin.resources import build_resources


def allocator(doc: dict[str, Any] | None = None, name: str = "nvidia.com/gpu",
              gpus: list[Any] | None = None, existing: tuple[str, ...] = ()) -> Allocator:
    config = cfg(doc)
    inv = make_inventory(gpus or [make_gpu(0, T4), make_gpu(1, T4)])
    res = build_resources(inv, config).resources[name]
    return Allocator(res, config, exists=lambda p: p in existing, response_id=lambda: "rid")


def test_envvar_uuid() -> None:
    a = allocator().allocate([gpu_uuid(1), gpu_uuid(0)])
    assert a.envs == {"NVIDIA_VISIBLE_DEVICES": f"{gpu_uuid(1)},{gpu_uuid(0)}"}
    assert (a.mounts, a.devices, a.annotations, a.cdi_devices) == ([], [], {}, [])


def test_envvar_index() -> None:
    a = allocator({"flags": {"plugin": {"deviceIDStrategy": "index"}}}).allocate([gpu_uuid(1)])
    assert a.envs == {"NVIDIA_VISIBLE_DEVICES": "1"}


def test_mig_index_ids() -> None:
    al = allocator({"flags": {"migStrategy": "mixed", "plugin": {"deviceIDStrategy": "index"}}},
                   name="nvidia.com/mig-1g.5gb", gpus=[make_gpu(0, migs=("3g.20gb", "1g.5gb"))])
    assert al.allocate([mig_uuid(0, 1)]).envs == {"NVIDIA_VISIBLE_DEVICES": "0:1"}


def test_volume_mounts() -> None:
    a = allocator({"flags": {"plugin": {"deviceListStrategy": "volume-mounts"}}}).allocate(
        [gpu_uuid(0)])
    assert a.envs == {"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices"}
    assert a.mounts == [Mount(f"/var/run/nvidia-container-devices/{gpu_uuid(0)}", "/dev/null",
                              read_only=True)]


def test_cdi_annotations() -> None:
    a = allocator({"flags": {"plugin": {"deviceListStrategy": "cdi-annotations"}}}).allocate(
        [gpu_uuid(0), gpu_uuid(1)])
    assert a.annotations == {
        "cdi.k8s.io/gpukit-device-plugin_rid":
            f"nvidia.com/gpu={gpu_uuid(0)},nvidia.com/gpu={gpu_uuid(1)}"}
    assert a.envs == {}


def test_cdi_cri_and_envvar_together() -> None:
    a = allocator({"flags": {"plugin": {"deviceListStrategy": ["envvar", "cdi-cri"],
                                        "deviceIDStrategy": "index"}}}).allocate([gpu_uuid(1)])
    assert a.cdi_devices == ["nvidia.com/gpu=1"]
    assert a.envs == {"NVIDIA_VISIBLE_DEVICES": "1"}


def test_device_specs_under_device_root() -> None:
    al = allocator({"flags": {"plugin": {"passDeviceSpecs": True}},
                    "gpukit": {"deviceRoot": "/srv/node1", "deviceRootInPlugin": "/host/node1"}},
                   existing=("/host/node1/dev/nvidiactl", "/host/node1/dev/nvidia-uvm"))
    a = al.allocate([gpu_uuid(1)])
    assert a.devices == [
        DeviceNode("/dev/nvidia1", "/srv/node1/dev/nvidia1", "rw"),
        DeviceNode("/dev/nvidiactl", "/srv/node1/dev/nvidiactl", "rw"),
        DeviceNode("/dev/nvidia-uvm", "/srv/node1/dev/nvidia-uvm", "rw"),
    ]


def test_device_specs_for_mig_use_parent_node() -> None:
    al = allocator({"flags": {"migStrategy": "mixed", "plugin": {"passDeviceSpecs": True}}},
                   name="nvidia.com/mig-3g.20gb",
                   gpus=[make_gpu(0), make_gpu(1, migs=("3g.20gb", "3g.20gb"))],
                   existing=("/dev/nvidiactl",))
    a = al.allocate([mig_uuid(1, 0), mig_uuid(1, 1)])
    assert [d.container_path for d in a.devices] == ["/dev/nvidia1", "/dev/nvidiactl"]


def test_replicas_map_to_their_gpu() -> None:
    al = allocator({"sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 4}]}}})
    a = al.allocate([f"{gpu_uuid(0)}::0", f"{gpu_uuid(0)}::3", f"{gpu_uuid(1)}::2"])
    assert a.envs == {"NVIDIA_VISIBLE_DEVICES": f"{gpu_uuid(0)},{gpu_uuid(1)}"}


def test_unknown_id_is_refused() -> None:
    with pytest.raises(AllocationError) as err:
        allocator().allocate([gpu_uuid(0), "GPU-bogus"])
    assert str(err.value) == (
        "invalid allocation request for 'nvidia.com/gpu': unknown device: GPU-bogus")


def test_duplicate_and_empty_refused() -> None:
    with pytest.raises(AllocationError, match="requested twice"):
        allocator().allocate([gpu_uuid(0), gpu_uuid(0)])
    with pytest.raises(AllocationError, match="no device IDs"):
        allocator().allocate([])


def test_fail_requests_greater_than_one() -> None:
    doc = {"sharing": {"timeSlicing": {"failRequestsGreaterThanOne": True, "renameByDefault": True,
                                       "resources": [{"name": "gpu", "replicas": 4}]}}}
    al = allocator(doc, name="nvidia.com/gpu.shared")
    assert al.allocate([f"{gpu_uuid(0)}::1"]).envs["NVIDIA_VISIBLE_DEVICES"] == gpu_uuid(0)
    with pytest.raises(AllocationError) as err:
        al.allocate([f"{gpu_uuid(0)}::1", f"{gpu_uuid(1)}::0"])
    assert str(err.value) == ("request for 'nvidia.com/gpu.shared: 2' too large: maximum request "
                              "size for shared resources is 1")


def test_greater_than_one_allowed_by_default() -> None:
    al = allocator({"sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 2}]}}})
    assert al.allocate([f"{gpu_uuid(0)}::0", f"{gpu_uuid(0)}::1"]).envs


@pytest.mark.parametrize("strategies", [["cdi-annotations"], ["cdi-cri"], ["cdi-annotations", "cdi-cri"]])
def test_cdi_only_strategies_pass_no_device_specs(strategies: list[str]) -> None:
    """NVIDIA's plugin returns no DeviceSpecs when CDI injects the devices, passDeviceSpecs or not."""
    a = allocator({"flags": {"plugin": {"deviceListStrategy": strategies,
                                        "passDeviceSpecs": True}}}).allocate([gpu_uuid(1)])
    assert a.devices == [] and (a.annotations or a.cdi_devices)
    mixed = allocator({"flags": {"plugin": {"deviceListStrategy": ["volume-mounts", "cdi-cri"],
                                            "passDeviceSpecs": True}}}).allocate([gpu_uuid(1)])
    assert mixed.devices  # another strategy still needs the nodes from the kubelet
