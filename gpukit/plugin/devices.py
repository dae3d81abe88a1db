"""What a node has: GPUs, their MIG devices and how GPUs are linked. Plain data, no NVML.

Discovery (`nvml.py`) fills it from pynvml; resources, allocation, preferred allocation and
labels read only this, so they are tested with hand-made inventories.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

# NVML topology levels (nvmlGpuTopologyLevel_t): lower is closer.
TOPOLOGY_INTERNAL = 0
TOPOLOGY_SINGLE = 10  # one PCIe switch
TOPOLOGY_MULTIPLE = 20  # several PCIe switches, no host bridge
TOPOLOGY_HOSTBRIDGE = 30
TOPOLOGY_NODE = 40  # same NUMA node / CPU socket
TOPOLOGY_SYSTEM = 50  # across sockets (SMP interconnect)


@dataclass(frozen=True)
class MigDevice:
    uuid: str
    parent_uuid: str
    parent_index: int
    index: int  # position among the parent's MIG devices: the j of "i:j"
    gi: int
    ci: int
    profile: str  # e.g. "3g.20gb", "1g.5gb+me"
    memory_mb: int
    multiprocessors: int = 0
    slices_gi: int = 0
    slices_ci: int = 0
    engines_copy: int = 0
    engines_decoder: int = 0
    engines_encoder: int = 0
    engines_jpeg: int = 0
    engines_ofa: int = 0

    @property
    def index_id(self) -> str:
        return f"{self.parent_index}:{self.index}"


# NVML_GPU_FABRIC_STATE_* (nvml.h): where a GPU is in registering with the NVLink fabric manager
FABRIC_STATE_NOT_SUPPORTED = 0
FABRIC_STATE_NOT_STARTED = 1
FABRIC_STATE_IN_PROGRESS = 2
FABRIC_STATE_COMPLETED = 3
_NIL_UUID = "00000000-0000-0000-0000-000000000000"


@dataclass(frozen=True)
class Fabric:
    """A GPU's NVLink fabric registration as nvmlDeviceGetGpuFabricInfo reports it (multi-node
    NVLink systems such as GB200 NVL72; other GPUs have none)."""

    cluster_uuid: str  # the 16 bytes in UUID form, lower case (xxxxxxxx-xxxx-...)
    clique_id: int
    state: int = FABRIC_STATE_COMPLETED  # a FABRIC_STATE_*
    status: int = 0  # nvmlReturn_t of the registration; meaningful once completed

    @property
    def attached(self) -> bool:
        """Registered: state completed, status success and a cluster UUID (not all zero), the
        conditions NVIDIA's go-nvlib (IsFabricAttached) checks before GFD and the DRA driver
        use the clique."""
        return (self.state == FABRIC_STATE_COMPLETED and self.status == 0
                and self.cluster_uuid != _NIL_UUID)

    @property
    def clique(self) -> str:
        """`<cluster UUID>.<clique id>`: how NVIDIA's tools name the GPU's clique."""
        return f"{self.cluster_uuid}.{self.clique_id}"


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    minor: int
    name: str  # product name, e.g. "NVIDIA A100-SXM4-40GB"
    memory_mb: int  # total memory in MiB
    pci_bus_id: str = ""
    numa_node: int | None = None
    compute_major: int = 0
    compute_minor: int = 0
    architecture: str = ""
    brand: str = ""  # nvmlDeviceGetBrand as NVIDIA's tools name it ("Tesla"); "" unknown
    mig_capable: bool = False
    mig_enabled: bool = False
    mig_devices: tuple[MigDevice, ...] = ()
    fabric: Fabric | None = None  # NVLink fabric registration; None: the GPU has none

    @property
    def device_node(self) -> str:
        return f"/dev/nvidia{self.minor}"


@dataclass(frozen=True)
class Link:
    """How two GPUs talk: active NVLinks between them and their PCIe common ancestor."""

    nvlinks: int = 0
    ancestor: int | None = None  # a TOPOLOGY_* level, None when NVML cannot tell


@dataclass(frozen=True)
class NodeDevices:
    gpus: tuple[Gpu, ...] = ()
    driver_version: str = ""
    cuda_driver_version: int = 0  # NVML encoding: 12040 -> 12.4
    links: Mapping[frozenset[str], Link] = field(default_factory=dict)
    # GPUs NVML reported as lost (by index) while enumerating; see manager for carry-over.
    lost_indices: tuple[int, ...] = ()

    def gpu_by_uuid(self, uuid: str) -> Gpu | None:
        return next((g for g in self.gpus if g.uuid == uuid), None)

    def mig_devices(self) -> Iterator[MigDevice]:
        for gpu in self.gpus:
            yield from gpu.mig_devices

    def link(self, a: str, b: str) -> Link:
        return self.links.get(frozenset((a, b)), Link())

    @property
    def cuda_version(self) -> tuple[int, int]:
        v = self.cuda_driver_version
        return v // 1000, (v % 1000) // 10


def mig_memory_gb(total_memory_bytes: int, mig_memory_mb: int) -> int:
    """go-nvlib's rounding of a MIG device's memory to the GB figure in its profile name."""
    one_mb, one_gb = 1024 * 1024, 1024 * 1024 * 1024
    if total_memory_bytes <= 0:
        return round(mig_memory_mb / 1024)
    fraction = (mig_memory_mb * one_mb) / total_memory_bytes
    fraction = math.ceil(fraction * 8) / 8
    total_gb = (total_memory_bytes + one_gb - 1) // one_gb
    return round(fraction * total_gb)


def profile_name(slices_gi: int, slices_ci: int, memory_gb: int) -> str:
    """`3g.20gb`, or `1c.3g.20gb` for a compute instance smaller than its GPU instance."""
    base = f"{slices_gi}g.{memory_gb}gb"
    return base if slices_ci in (0, slices_gi) else f"{slices_ci}c.{base}"
