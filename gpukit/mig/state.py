"""What a node's GPUs look like, MIG-wise: plain frozen data, filled by a backend (pynvml, or a
fake in tests) and read by the planner, the applier and export."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpukit.contracts import mig_profiles


@dataclass(frozen=True)
class ComputeInstance:
    id: int
    profile_id: int  # NVML_COMPUTE_INSTANCE_PROFILE_* (the table's profile_id)
    start: int  # compute slice inside the GPU instance
    size: int


@dataclass(frozen=True)
class GpuInstance:
    id: int
    profile: str  # table name, e.g. "3g.20gb"
    profile_id: int  # NVML_GPU_INSTANCE_PROFILE_* (the table's profile_id)
    start: int  # memory slice
    size: int
    compute_instances: tuple[ComputeInstance, ...] = ()

    def describe(self) -> str:
        return f"{self.profile}@{self.start}"


@dataclass(frozen=True)
class Process:
    pid: int
    used_mb: int | None = None
    gi: int | None = None  # GPU instance it runs in (MIG), None when not known/applicable
    ci: int | None = None


@dataclass(frozen=True)
class TableMismatch:
    """Where a MIG table disagrees with what the GPU's driver reports for one GPU-instance
    profile (``nvmlDeviceGetGpuInstanceProfileInfo`` for the profile's constant, and
    ``nvmlDeviceGetGpuInstancePossiblePlacements_v2`` for the driver's id). ``field`` is NVML's
    name for it (``memorySizeMB``, ``sliceCount``, ``instanceCount``, ``placements``)."""

    table: str  # the MIG table's key, e.g. "H100-80GB"
    profile: str  # the table's profile name, e.g. "3g.40gb"
    field: str
    table_value: str
    driver_value: str

    def text(self) -> str:
        return (f"MIG table {self.table}, profile {self.profile}: {self.field} is "
                f"{self.table_value} in the table, {self.driver_value} by the driver")


@dataclass(frozen=True)
class GpuState:
    """One GPU as discovered. ``mig_current``/``mig_pending`` are None when the GPU is not MIG
    capable (NVML says NOT_SUPPORTED)."""

    index: int
    uuid: str
    product: str
    pci_device_id: int | None = None
    mig_current: bool | None = None
    mig_pending: bool | None = None
    gpu_instances: tuple[GpuInstance, ...] = ()
    processes: tuple[Process, ...] = ()
    # Filled by a backend that asked the driver (PynvmlBackend; left empty by fakes): the
    # table's profiles this GPU's driver does not offer (NOT_SUPPORTED: e.g. an older driver
    # without a newer profile), which cannot be planned on this GPU; and where the table
    # disagrees with the driver, which makes the planner refuse the GPU.
    unavailable_profiles: tuple[str, ...] = ()
    table_mismatches: tuple[TableMismatch, ...] = ()

    @property
    def mig_capable(self) -> bool:
        return self.mig_current is not None

    @property
    def table(self) -> mig_profiles.MigGpu | None:
        return mig_profiles.for_product(self.product)

    def label(self) -> str:
        return f"GPU {self.index} ({self.product})"

    def mode_text(self) -> str:
        if not self.mig_capable:
            return "not MIG capable"
        cur = "enabled" if self.mig_current else "disabled"
        if self.mig_pending != self.mig_current:
            return f"MIG {cur} ({'enable' if self.mig_pending else 'disable'} pending reset)"
        return f"MIG {cur}"

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "uuid": self.uuid,
            "product": self.product,
            "pci_device_id": f"0x{self.pci_device_id:08X}" if self.pci_device_id else None,
            "mig_capable": self.mig_capable,
            "mig_enabled": self.mig_current,
            "mig_pending": self.mig_pending,
            "unavailable_profiles": list(self.unavailable_profiles),
            "table_mismatches": [m.text() for m in self.table_mismatches],
            "gpu_instances": [
                {
                    "id": gi.id,
                    "profile": gi.profile,
                    "start": gi.start,
                    "size": gi.size,
                    "compute_instances": [
                        {"id": ci.id, "profile_id": ci.profile_id, "start": ci.start,
                         "size": ci.size}
                        for ci in gi.compute_instances
                    ],
                }
                for gi in self.gpu_instances
            ],
            "processes": [
                {"pid": p.pid, "used_mb": p.used_mb, "gi": p.gi, "ci": p.ci}
                for p in self.processes
            ],
        }
