"""What a node's GPUs look like, MIG-wise: plain frozen data, filled by a backend (pynvml, or a
fake in tests) and read by the planner, the applier and export."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpukit import mig_profiles


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
