"""The node's GPUs and MIG devices as ResourceSlice devices (resource.k8s.io/v1), named and
described as NVIDIA's DRA driver does, so selectors written for it match unchanged.

- a whole GPU: `gpu-<minor>`; attributes type "gpu", uuid, productName, architecture,
  cudaComputeCapability, driverVersion, cudaDriverVersion, resource.kubernetes.io/pciBusID,
  resource.kubernetes.io/pcieRoot (from sysfs, when it can tell: `pcie_root`), and the ones
  its earlier releases published and claims may still select on (index, minor, pcieBusID);
  capacity memory (bytes);
- a MIG device: `gpu-<parent minor>-mig-<profile without dots>-<GI profile id>-<placement
  start>`; type "mig", uuid, parentUUID, profile, the parent's product, architecture,
  versions, PCI address and root complex, index and parentIndex; capacity as the GPU
  instance profile gives it (multiprocessors, copyEngines, decoders, encoders, jpegEngines,
  ofaEngines, memory) and one `memorySlice<i>` per memory slice it occupies.
No NVLink fabric / clique attribute: NVIDIA's driver publishes none (see gpukit.contracts.dra).
A node declared shared (gpukit_dra_shares) publishes each device for several claims at once
(`shared`: consumable capacity); an unhealthy device carries taints (`tainted`).
Plain data: what NVML said comes in as `NodeDevices` and the GPU instances' placements.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpukit.contracts import gpu_architectures, mig_profiles
from gpukit.contracts.dra import (
    MEMORY_CAPACITY,
    PCI_BUS_ID_ATTRIBUTE,
    PCIE_ROOT_ATTRIBUTE,
    SHARES_CAPACITY,
    TYPE_GPU,
    TYPE_MIG,
    gpu_device_name,
    mig_device_name,
)

from ..devices import Gpu, MigDevice, NodeDevices
from ..labels import default_sysfs_root
from ..resources import Unit, gpu_unit, mig_unit
from . import pcie_root

_BINARY_SUFFIXES = (("Ei", 1 << 60), ("Pi", 1 << 50), ("Ti", 1 << 40), ("Gi", 1 << 30),
                    ("Mi", 1 << 20), ("Ki", 1 << 10))  # fmt: skip


@dataclass(frozen=True)
class Placement:
    """Where a GPU instance sits: its memory slices [start, start + size)."""

    start: int
    size: int


@dataclass(frozen=True)
class Carve:
    """A dynamic MIG device (dynamic_mig.py): which GPU, which profile (the table's), where."""

    gpu_index: int
    gpu_uuid: str
    gpu_minor: int
    profile: str
    profile_id: int  # NVML_GPU_INSTANCE_PROFILE_* (the table's profile_id)
    start: int
    size: int


@dataclass(frozen=True)
class SliceDevice:
    """One published device: its name, what it is on the node, and its API form. `carve`: a
    dynamic MIG device, created at prepare (its unit is then its parent GPU's until then)."""

    name: str
    unit: Unit
    body: dict[str, Any]
    carve: Carve | None = None


def quantity(value: int) -> str:
    """A non-negative integer as Kubernetes writes a BinarySI quantity (40Gi, 4864Mi, 14)."""
    for suffix, factor in _BINARY_SUFFIXES:
        if value and value % factor == 0:
            return f"{value // factor}{suffix}"
    return str(value)


def semver(text: str) -> str | None:
    """A version as NVIDIA's driver publishes it (Masterminds semver, loose): "550.90.07" ->
    "550.90.7", "12.4" -> "12.4.0"; None when it is not numeric."""
    parts = text.strip().split(".")
    if not text.strip() or len(parts) > 3 or not all(p.isdigit() for p in parts):
        return None
    numbers = [int(p) for p in parts] + [0] * (3 - len(parts))
    return ".".join(str(n) for n in numbers)


def gpu_name(gpu: Gpu) -> str:
    return gpu_device_name(gpu.minor)


def mig_name(parent: Gpu, profile: str, driver_profile_id: int, start: int) -> str:
    return mig_device_name(parent.minor, profile, driver_profile_id, start)


def _common(gpu: Gpu, node: NodeDevices, sysfs_root: str) -> dict[str, dict[str, Any]]:
    attrs: dict[str, dict[str, Any]] = {"productName": {"string": gpu.name}}
    if gpu.brand:
        attrs["brand"] = {"string": gpu.brand}
    if gpu.architecture:
        attrs["architecture"] = {"string": gpu_architectures.display_name(gpu.architecture)}
    versions = {
        "cudaComputeCapability": semver(f"{gpu.compute_major}.{gpu.compute_minor}")
        if gpu.compute_major else None,
        "driverVersion": semver(node.driver_version),
        "cudaDriverVersion": semver("{}.{}".format(*node.cuda_version))
        if node.cuda_driver_version else None,
    }
    attrs.update({k: {"version": v} for k, v in versions.items() if v})
    if gpu.pci_bus_id:
        attrs[PCI_BUS_ID_ATTRIBUTE] = {"string": gpu.pci_bus_id}
        attrs["pcieBusID"] = {"string": gpu.pci_bus_id}
        root = pcie_root.lookup(gpu.pci_bus_id, sysfs_root)
        if root:
            attrs[PCIE_ROOT_ATTRIBUTE] = {"string": root}
    return attrs


def gpu_device(gpu: Gpu, node: NodeDevices, sysfs_root: str | None = None) -> SliceDevice:
    name = gpu_name(gpu)
    attrs = {"type": {"string": TYPE_GPU}, "uuid": {"string": gpu.uuid},
             "index": {"int": gpu.index}, "minor": {"int": gpu.minor},
             **_common(gpu, node, sysfs_root or default_sysfs_root())}
    body = {"name": name, "attributes": attrs,
            "capacity": {"memory": {"value": quantity(gpu.memory_mb << 20)}}}
    return SliceDevice(name, gpu_unit(gpu), body)


def _gi_profile(gpu: Gpu, profile: str) -> mig_profiles.GpuInstanceProfile | None:
    table = mig_profiles.for_product(gpu.name)
    if table is None:
        return None
    return next((p for p in table.gpu_instance_profiles if p.name == profile), None)


def mig_device(gpu: Gpu, mig: MigDevice, placement: Placement, node: NodeDevices,
               proc_root: str = "/", sysfs_root: str | None = None) -> SliceDevice:
    """A MIG device, its PCI attributes its parent GPU's; the GPU instance profile's figures
    come from gpukit's MIG tables (the driver's nvmlGpuInstanceProfileInfo, which the MIG
    manager checks them against), the device's own attributes where no table knows the
    profile."""
    profile = _gi_profile(gpu, mig.profile)
    if profile is not None:
        driver_id, sms, memory_mb = profile.driver_id, profile.multiprocessors, profile.memory_mb
        e = profile.engines
        engines = (e.copy, e.decoder, e.encoder, e.jpeg, e.ofa)
    else:
        driver_id, sms, memory_mb = -1, mig.multiprocessors, mig.memory_mb
        engines = (mig.engines_copy, mig.engines_decoder, mig.engines_encoder,
                   mig.engines_jpeg, mig.engines_ofa)  # fmt: skip
    name = mig_name(gpu, mig.profile, driver_id, placement.start)
    attrs = {"type": {"string": TYPE_MIG}, "uuid": {"string": mig.uuid},
             "parentUUID": {"string": gpu.uuid}, "profile": {"string": mig.profile},
             "index": {"int": mig.index}, "parentIndex": {"int": gpu.index},
             **_common(gpu, node, sysfs_root or default_sysfs_root())}  # fmt: skip
    capacity: dict[str, dict[str, str]] = {
        key: {"value": quantity(v)} for key, v in zip(
            ("multiprocessors", "copyEngines", "decoders", "encoders", "jpegEngines",
             "ofaEngines"), (sms, *engines), strict=True)}
    capacity["memory"] = {"value": quantity(memory_mb << 20)}
    for i in range(placement.start, placement.start + placement.size):
        capacity[f"memorySlice{i}"] = {"value": "1"}
    body = {"name": name, "attributes": attrs, "capacity": capacity}
    return SliceDevice(name, mig_unit(gpu, mig, proc_root), body)


def node_slice_devices(node: NodeDevices, placements: Mapping[tuple[str, int], Placement],
                       proc_root: str = "/", sysfs_root: str | None = None
                       ) -> list[SliceDevice]:
    """Every device of the node's current layout: each GPU without MIG whole, each MIG-enabled
    GPU's MIG devices (the GPU itself is then not allocatable whole, as with NVIDIA's static
    MIG). `placements`: (GPU UUID, GPU instance id) -> placement; a MIG device whose GPU
    instance has none is left out (it cannot be named). `sysfs_root`: where the host's sysfs
    is read (default GPUKIT_SYSFS_ROOT, else /sys)."""
    sysfs_root = sysfs_root or default_sysfs_root()
    out: list[SliceDevice] = []
    for gpu in node.gpus:
        if not gpu.mig_enabled:
            out.append(gpu_device(gpu, node, sysfs_root))
            continue
        for mig in gpu.mig_devices:
            placement = placements.get((gpu.uuid, mig.gi))
            if placement is not None:
                out.append(mig_device(gpu, mig, placement, node, proc_root, sysfs_root))
    return sorted(out, key=lambda d: d.name)


def shared(device: SliceDevice, shares: int) -> SliceDevice:
    """`device` for up to `shares` claims at once (KEP-5075): allowMultipleAllocations, a
    `shares` capacity of which a claim consumes 1 unless it asks more
    (capacity.requests.shares), `memory` of which it consumes an equal part unless it asks a
    given amount, and every other capacity (a MIG device's engines and slices: what the device
    has, not what a claim takes) consumed 0, else a first claim would take it whole."""
    capacity: dict[str, dict[str, Any]] = {}
    for key, entry in device.body.get("capacity", {}).items():
        if key == MEMORY_CAPACITY:
            total = parse_quantity(entry["value"])
            part = quantity(total // shares >> 20 << 20)  # whole MiB
            policy = {"default": part, "validRange": {"min": "0", "max": entry["value"]}}
        else:
            policy = {"default": "0", "validValues": ["0"]}
        capacity[key] = {**entry, "requestPolicy": policy}
    capacity[SHARES_CAPACITY] = {"value": str(shares), "requestPolicy": {
        "default": "1", "validRange": {"min": "1", "max": str(shares), "step": "1"}}}
    body = {**device.body, "allowMultipleAllocations": True, "capacity": capacity}
    return SliceDevice(device.name, device.unit, body)


def parse_quantity(text: str) -> int:
    """A quantity as `quantity` writes it, back to an integer."""
    for suffix, factor in _BINARY_SUFFIXES:
        if text.endswith(suffix):
            return int(text[:-len(suffix)]) * factor
    return int(text)
