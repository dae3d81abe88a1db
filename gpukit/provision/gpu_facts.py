"""GPU facts through NVML: driver version, GPUs, MIG mode (current and pending), MIG devices.

Read-only. Runs on the node in gpukit's environment (the `gpukit_gpu_facts` module); loads
the system's libnvidia-ml.so.1, or `library` when given (the lab's mock elsewhere).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

NOUVEAU_SYSFS = Path("/sys/module/nouveau")


@dataclass(frozen=True)
class GpuFact:
    index: int
    uuid: str
    name: str
    memory_mib: int
    pci_bus_id: str
    compute_capability: str
    mig_capable: bool
    mig_mode_current: str | None  # enabled | disabled | None (not MIG capable)
    mig_mode_pending: str | None
    mig_devices: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class GpuFacts:
    nvml: bool  # NVML answered
    error: str | None
    driver_version: str | None
    cuda_driver_version: str | None  # "12.4"
    gpu_count: int
    gpus: list[GpuFact]
    products: list[str]
    mig_enabled_gpus: list[int]
    mig_pending_change_gpus: list[int]
    nouveau_loaded: bool

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _mode(value: int | None) -> str | None:
    if value is None:
        return None
    return "enabled" if value == 1 else "disabled"


def gather(library: str | None = None, sysfs_nouveau: Path = NOUVEAU_SYSFS) -> GpuFacts:
    """Ask NVML; any failure is reported in `error`, never raised (facts must not fail a play
    on a node whose driver is not loaded yet)."""
    from gpukit.plugin import nvml

    nouveau = sysfs_nouveau.exists()
    try:
        if library:
            nvml.load_library(library)
        nvml.init()
    except nvml.NvmlError as e:
        return GpuFacts(False, str(e), None, None, 0, [], [], [], [], nouveau)
    try:
        inv = nvml.discover(with_topology=False)
        gpus: list[GpuFact] = []
        for g in inv.gpus:
            current: int | None = None
            pending: int | None = None
            if g.mig_capable:
                current, pending = nvml.mig_mode(g.index)
            gpus.append(
                GpuFact(
                    index=g.index,
                    uuid=g.uuid,
                    name=g.name,
                    memory_mib=g.memory_mb,
                    pci_bus_id=g.pci_bus_id,
                    compute_capability=f"{g.compute_major}.{g.compute_minor}",
                    mig_capable=g.mig_capable,
                    mig_mode_current=_mode(current),
                    mig_mode_pending=_mode(pending),
                    mig_devices=[
                        {
                            "index": m.index_id,
                            "uuid": m.uuid,
                            "profile": m.profile,
                            "memory_mib": m.memory_mb,
                        }
                        for m in g.mig_devices
                    ],
                )
            )
        major, minor = inv.cuda_version
        return GpuFacts(
            nvml=True,
            error=None,
            driver_version=inv.driver_version or None,
            cuda_driver_version=f"{major}.{minor}" if inv.cuda_driver_version else None,
            gpu_count=len(gpus),
            gpus=gpus,
            products=sorted({g.name for g in gpus}),
            mig_enabled_gpus=[g.index for g in gpus if g.mig_mode_current == "enabled"],
            mig_pending_change_gpus=[
                g.index for g in gpus if g.mig_mode_pending != g.mig_mode_current
            ],
            nouveau_loaded=nouveau,
        )
    except nvml.NvmlError as e:
        return GpuFacts(False, str(e), None, None, 0, [], [], [], [], nouveau)
    finally:
        nvml.shutdown()
