"""ResourceSlice devices named and described as NVIDIA's DRA driver publishes them."""

from __future__ import annotations

import dataclasses

from plugin_testlib import T4, gpu_uuid, make_gpu, make_inventory, mig_uuid

from gpukit.plugin.devices import Fabric
from gpukit.plugin.dra.slice_devices import (
    Placement,
    node_slice_devices,
    parse_quantity,
    quantity,
    semver,
    shared,
)


def test_whole_gpus_carry_nvidias_names_attributes_and_memory() -> None:
    node = make_inventory([make_gpu(0), make_gpu(1, name=T4)])
    devices = node_slice_devices(node, {})
    assert [d.name for d in devices] == ["gpu-0", "gpu-1"]
    a100 = devices[0].body
    assert a100["attributes"] == {
        "type": {"string": "gpu"}, "uuid": {"string": gpu_uuid(0)},
        "index": {"int": 0}, "minor": {"int": 0},
        "productName": {"string": "NVIDIA A100-SXM4-40GB"}, "architecture": {"string": "Ampere"},
        "cudaComputeCapability": {"version": "8.0.0"}, "driverVersion": {"version": "550.54.15"},
        "cudaDriverVersion": {"version": "12.4.0"},
        "resource.kubernetes.io/pciBusID": {"string": "0000:07:00.0"},
        "pcieBusID": {"string": "0000:07:00.0"},
    }
    assert a100["capacity"] == {"memory": {"value": "40Gi"}}
    assert devices[1].body["attributes"]["architecture"] == {"string": "Turing"}
    assert devices[1].unit.device_nodes == ("/dev/nvidia1",)


def test_a_blackwell_gpu_is_described_as_nvidias_driver_describes_it() -> None:
    """A B200 (compute capability 10.0, NVML architecture Blackwell): the architecture as
    go-nvlib spells it, the capability as a version, the name as NVML gives it."""
    b200 = dataclasses.replace(make_gpu(0), name="NVIDIA B200", memory_mb=183359,
                               compute_major=10, compute_minor=0, architecture="blackwell")
    attrs = node_slice_devices(make_inventory([b200]), {})[0].body["attributes"]
    assert attrs["productName"] == {"string": "NVIDIA B200"}
    assert attrs["architecture"] == {"string": "Blackwell"}
    assert attrs["cudaComputeCapability"] == {"version": "10.0.0"}


def test_a_gb200_in_an_nvlink_clique_gets_no_fabric_attribute() -> None:
    """NVIDIA's DRA driver publishes no clique or cluster UUID on GPU devices (its
    gpu-kubelet-plugin has none; the clique is the node label): neither does gpukit, so a
    fabric-attached GPU is described exactly as one without a fabric."""
    gb200 = dataclasses.replace(make_gpu(0), name="NVIDIA GB200", memory_mb=189471,
                                compute_major=10, compute_minor=0, architecture="blackwell")
    attached = dataclasses.replace(
        gb200, fabric=Fabric("6f1c2a9e-3b7d-4e58-a0c4-9d21e5b7f360", 32766))
    with_fabric = node_slice_devices(make_inventory([attached]), {})[0].body
    without = node_slice_devices(make_inventory([gb200]), {})[0].body
    assert with_fabric == without
    assert not any("clique" in k.lower() or "cluster" in k.lower() or "fabric" in k.lower()
                   for k in with_fabric["attributes"])


def test_mig_devices_replace_their_gpu_named_by_profile_id_and_placement() -> None:
    gpu = make_gpu(0, migs=("3g.20gb", "1g.5gb"))
    node = make_inventory([gpu, make_gpu(1)])
    # GI ids 1 and 2 (make_gpu numbers them from 1) at slices 4-7 and 0.
    placements = {(gpu.uuid, 1): Placement(4, 4), (gpu.uuid, 2): Placement(0, 1)}
    devices = {d.name: d for d in node_slice_devices(node, placements)}
    assert sorted(devices) == ["gpu-0-mig-1g5gb-19-0", "gpu-0-mig-3g20gb-9-4", "gpu-1"]
    mig = devices["gpu-0-mig-3g20gb-9-4"].body
    assert mig["attributes"]["type"] == {"string": "mig"}
    assert mig["attributes"]["uuid"] == {"string": mig_uuid(0, 0)}
    assert mig["attributes"]["parentUUID"] == {"string": gpu.uuid}
    assert mig["attributes"]["profile"] == {"string": "3g.20gb"}
    assert mig["attributes"]["productName"] == {"string": "NVIDIA A100-SXM4-40GB"}
    # The A100-40GB table's 3g.20gb GPU instance profile, as NVML's profile info gives it.
    assert mig["capacity"] == {
        "multiprocessors": {"value": "42"}, "copyEngines": {"value": "3"},
        "decoders": {"value": "2"}, "encoders": {"value": "0"}, "jpegEngines": {"value": "0"},
        "ofaEngines": {"value": "0"}, "memory": {"value": "19968Mi"},
        "memorySlice4": {"value": "1"}, "memorySlice5": {"value": "1"},
        "memorySlice6": {"value": "1"}, "memorySlice7": {"value": "1"},
    }
    assert devices["gpu-0-mig-3g20gb-9-4"].unit.mig is not None


def test_a_mig_device_without_a_known_placement_is_left_out() -> None:
    gpu = make_gpu(0, migs=("1g.5gb",))
    assert node_slice_devices(make_inventory([gpu]), {}) == []


def test_quantities_and_versions_as_kubernetes_and_nvidia_write_them() -> None:
    assert quantity(40 << 30) == "40Gi"
    assert quantity(4864 << 20) == "4864Mi"
    assert quantity(14) == "14"
    assert quantity(0) == "0"
    assert semver("550.90.07") == "550.90.7"
    assert semver("12.4") == "12.4.0"
    assert semver("") is None
    assert semver("r550") is None


def test_a_shared_device_takes_several_claims_within_its_capacity() -> None:
    """KEP-5075: allowMultipleAllocations, `shares` of which a claim consumes 1 by default,
    memory an equal part (whole MiB) unless a claim asks an amount, and a MIG device's other
    capacities consumed 0 (else the first claim would take them whole)."""
    gpu = make_gpu(0, migs=("1g.5gb",))
    node = make_inventory([gpu, make_gpu(1, name=T4)])
    devices = {d.name: d for d in node_slice_devices(node, {(gpu.uuid, 1): Placement(0, 1)})}
    t4 = shared(devices["gpu-1"], 3).body
    assert t4["allowMultipleAllocations"] is True
    assert t4["capacity"] == {
        "memory": {"value": "15Gi", "requestPolicy": {
            "default": "5Gi", "validRange": {"min": "0", "max": "15Gi"}}},
        "shares": {"value": "3", "requestPolicy": {
            "default": "1", "validRange": {"min": "1", "max": "3", "step": "1"}}},
    }
    assert t4["attributes"] == devices["gpu-1"].body["attributes"]
    mig = shared(devices["gpu-0-mig-1g5gb-19-0"], 2).body["capacity"]
    assert mig["memory"]["requestPolicy"]["default"] == "2432Mi"
    assert mig["multiprocessors"] == {"value": "14", "requestPolicy": {
        "default": "0", "validValues": ["0"]}}
    assert mig["memorySlice0"]["requestPolicy"] == {"default": "0", "validValues": ["0"]}
    assert mig["shares"]["value"] == "2"
    assert "allowMultipleAllocations" not in devices["gpu-1"].body  # unshared as it was
    assert parse_quantity("15Gi") == 15 << 30 and parse_quantity("14") == 14
