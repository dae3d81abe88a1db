"""The GPU side of the MIG manager over pynvml (gpukit.plugin.mig.backend.MigBackend), for the
real libnvidia-ml.so.1 and the lab's mock alike.

The backend speaks the table's profile ids (``NVML_GPU_INSTANCE_PROFILE_*`` and
``NVML_COMPUTE_INSTANCE_PROFILE_*`` constants). Real drivers number the profiles they create
and list differently (an A100's 1g.5gb is profile id 19), so the pynvml backend maps constants to
the ids ``nvmlDeviceGetGpuInstanceProfileInfo`` reports and back. Handles are looked up again for
every call: a GPU reset invalidates them.

Before a MIG-capable GPU is planned, the pynvml backend holds the MIG table its product name
selected to what the driver reports (:func:`check_table`): for every table profile the driver
offers, ``sliceCount``, ``instanceCount``, ``memorySizeMB`` and the possible placements must be
the table's, else the GPU carries the disagreements (``GpuState.table_mismatches``) and the
planner refuses it; multiprocessor and engine counts, the driver's id and name are compared
and only logged. A table profile the driver does not offer (NOT_SUPPORTED: an older driver
without a newer profile) is ``GpuState.unavailable_profiles``: not planned on that GPU.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pynvml

from gpukit.contracts import mig_profiles
from gpukit.mig.state import ComputeInstance, GpuInstance, GpuState, Process, TableMismatch
from gpukit.plugin import nvml
from gpukit.plugin.nvml.calls import _text

NO_ID = 0xFFFFFFFF
_ENGINE_SHARED = 0  # NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
log = logging.getLogger("gpukit.plugin.mig")


def _opt_id(value: Any) -> int | None:
    v = int(value) if value is not None else NO_ID
    return None if v == NO_ID else v


# -- the table held to the driver ----------------------------------------------------------------


@dataclass(frozen=True)
class TableCheck:
    """What :func:`check_table` found for one GPU: profiles the driver does not offer, fields
    that must match and do not (the GPU is refused), and informational differences (logged)."""

    unavailable: tuple[str, ...] = ()
    mismatches: tuple[TableMismatch, ...] = ()
    warnings: tuple[str, ...] = ()


def _placements_text(placements: list[tuple[int, int]]) -> str:
    return "[" + ", ".join(f"{start}/{size}" for start, size in placements) + "] (start/size)"


def compare_profile(table: mig_profiles.MigGpu, p: mig_profiles.GpuInstanceProfile, info: Any,
                    placements: list[tuple[int, int]] | None
                    ) -> tuple[list[TableMismatch], list[str]]:
    """One table profile against the driver's profile info (``nvmlGpuInstanceProfileInfo_v2_t``
    or v1) and possible placements (None: the driver did not say). Returns (mismatches that
    make the table wrong for this GPU, informational differences)."""
    mismatches: list[TableMismatch] = []
    warnings: list[str] = []

    def must(field: str, table_value: object, driver_value: object) -> None:
        if table_value != driver_value:
            mismatches.append(TableMismatch(table.key, p.name, field, str(table_value),
                                            str(driver_value)))

    must("sliceCount", p.compute_slices, int(info.sliceCount))
    must("instanceCount", p.max_count, int(info.instanceCount))
    must("memorySizeMB", p.memory_mb, int(info.memorySizeMB))
    if placements is not None:
        ours = sorted((pl.start, pl.size) for pl in p.placements)
        if ours != sorted(placements):
            must("placements", _placements_text(ours), _placements_text(sorted(placements)))

    def note(field: str, table_value: object, driver_value: object) -> None:
        if table_value != driver_value:
            warnings.append(f"MIG table {table.key}, profile {p.name}: {field} is {table_value} "
                            f"in the table, {driver_value} by the driver (informational)")

    note("multiprocessorCount", p.multiprocessors, int(info.multiprocessorCount))
    for field, ours_count in (("copyEngineCount", p.engines.copy),
                              ("decoderCount", p.engines.decoder),
                              ("encoderCount", p.engines.encoder),
                              ("jpegCount", p.engines.jpeg), ("ofaCount", p.engines.ofa)):
        note(field, ours_count, int(getattr(info, field)))
    note("id (the driver's profile id)", p.driver_id, int(info.id))
    name = _text(getattr(info, "name", b""))
    if name:  # v2 only; "MIG 1g.10gb"
        note("name", f"MIG {p.name}", name)
    if placements is None:
        warnings.append(f"MIG table {table.key}, profile {p.name}: the driver did not report "
                        "its possible placements; placements not checked")
    return mismatches, warnings


def _possible_placements(index: int, h: Any, driver_id: int) -> list[tuple[int, int]] | None:
    """nvmlDeviceGetGpuInstancePossiblePlacements_v2 (pynvml's binding) for a driver profile id:
    asked for the count first (NULL array), then the placements. None if not reported."""
    subject = f"GPU {index}"
    count = ctypes.c_uint(0)
    fn = pynvml.nvmlDeviceGetGpuInstancePossiblePlacements
    name = "nvmlDeviceGetGpuInstancePossiblePlacements_v2"
    if nvml.optional(name, fn, h, driver_id, None, ctypes.byref(count), default=None,
                     subject=subject) is None:
        return None
    arr = (pynvml.c_nvmlGpuInstancePlacement_t * max(1, count.value))()
    if nvml.optional(name, fn, h, driver_id, arr, ctypes.byref(count), default=None,
                     subject=subject) is None:
        return None
    return [(int(arr[k].start), int(arr[k].size)) for k in range(count.value)]


def check_table(index: int, h: Any, table: mig_profiles.MigGpu) -> TableCheck:
    """Hold ``table`` to what the driver reports for GPU ``index`` (handle ``h``)."""
    unavailable: list[str] = []
    mismatches: list[TableMismatch] = []
    warnings: list[str] = []
    for p in table.gpu_instance_profiles:
        info = nvml.optional("nvmlDeviceGetGpuInstanceProfileInfo",
                             pynvml.nvmlDeviceGetGpuInstanceProfileInfo, h, p.profile_id,
                             default=None, subject=f"GPU {index}")
        if info is None:
            unavailable.append(p.name)
            continue
        m, w = compare_profile(table, p, info, _possible_placements(index, h, int(info.id)))
        mismatches.extend(m)
        warnings.extend(w)
    return TableCheck(tuple(unavailable), tuple(mismatches), tuple(warnings))


class PynvmlBackend:
    """MigBackend over pynvml. NVML must be initialised (see :func:`open_nvml`).

    The table check (:func:`check_table`) runs once per GPU (by UUID) and table for the
    backend's life; what it logs is logged once."""

    def __init__(self) -> None:
        self._checks: dict[tuple[str, mig_profiles.MigGpu], TableCheck] = {}

    def table_check(self, index: int, h: Any, uuid: str, product: str,
                    table: mig_profiles.MigGpu) -> TableCheck:
        key = (uuid, table)
        found = self._checks.get(key)
        if found is None:
            found = check_table(index, h, table)
            label = f"GPU {index} ({product})"
            for w in found.warnings:
                log.warning("%s: %s", label, w)
            if found.unavailable:
                log.warning("%s: the driver does not offer MIG profile(s) %s of table %s "
                            "(NOT_SUPPORTED); they cannot be planned on this GPU", label,
                            ", ".join(found.unavailable), table.key)
            for m in found.mismatches:
                log.error("%s: %s", label, m.text())
            self._checks[key] = found
        return found

    def _handle(self, index: int) -> Any:
        return nvml.call("nvmlDeviceGetHandleByIndex", pynvml.nvmlDeviceGetHandleByIndex, index,
                         subject=f"GPU {index}")

    @staticmethod
    def _table(index: int, handle: Any) -> mig_profiles.MigGpu:
        name = _text(nvml.call("nvmlDeviceGetName", pynvml.nvmlDeviceGetName, handle,
                               subject=f"GPU {index}"))
        table = mig_profiles.for_product(name)
        if table is None:
            raise nvml.NvmlError("mig tables", pynvml.NVML_ERROR_NOT_SUPPORTED,
                                 f"no MIG table for {name}", f"GPU {index}")
        return table

    # -- ids: table constants <-> the driver's profile ids -------------------------------------

    def _gi_ids(self, index: int, handle: Any, table: mig_profiles.MigGpu) -> dict[int, int]:
        """table profile_id -> driver profile id, for the profiles this GPU supports."""
        out: dict[int, int] = {}
        for p in table.gpu_instance_profiles:
            info = nvml.optional("nvmlDeviceGetGpuInstanceProfileInfo",
                                 pynvml.nvmlDeviceGetGpuInstanceProfileInfo, handle, p.profile_id,
                                 default=None, subject=f"GPU {index}")
            if info is not None:
                out[p.profile_id] = int(info.id)
        return out

    @staticmethod
    def _ci_id(index: int, gi: Any, profile_id: int) -> int:
        info = nvml.call("nvmlGpuInstanceGetComputeInstanceProfileInfo",
                         pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo, gi, profile_id,
                         _ENGINE_SHARED, subject=f"GPU {index}")
        return int(info.id)

    # -- reading ---------------------------------------------------------------------------------

    def gpus(self) -> tuple[GpuState, ...]:
        count = nvml.call("nvmlDeviceGetCount", pynvml.nvmlDeviceGetCount)
        return tuple(self.gpu(i) for i in range(int(count)))

    def gpu(self, index: int) -> GpuState:
        h = self._handle(index)
        subject = f"GPU {index}"
        uuid = _text(nvml.call("nvmlDeviceGetUUID", pynvml.nvmlDeviceGetUUID, h, subject=subject))
        name = _text(nvml.call("nvmlDeviceGetName", pynvml.nvmlDeviceGetName, h, subject=subject))
        pci = nvml.optional("nvmlDeviceGetPciInfo", pynvml.nvmlDeviceGetPciInfo, h, default=None,
                            subject=subject)
        mode = nvml.optional("nvmlDeviceGetMigMode", pynvml.nvmlDeviceGetMigMode, h,
                             default=None, subject=subject)
        current = pending = None
        if mode is not None:
            current = int(mode[0]) == pynvml.NVML_DEVICE_MIG_ENABLE
            pending = int(mode[1]) == pynvml.NVML_DEVICE_MIG_ENABLE
        table = mig_profiles.for_product(name)
        gis: tuple[GpuInstance, ...] = ()
        check = TableCheck()
        if mode is not None and table is not None:
            check = self.table_check(index, h, uuid, name, table)
        if current and table is not None:
            gis = self._gpu_instances(index, h, table)
        return GpuState(
            index=index, uuid=uuid, product=name,
            pci_device_id=int(pci.pciDeviceId) if pci is not None else None,
            mig_current=current, mig_pending=pending, gpu_instances=gis,
            processes=self._processes(index, h),
            unavailable_profiles=check.unavailable, table_mismatches=check.mismatches,
        )

    def _gpu_instances(self, index: int, h: Any, table: mig_profiles.MigGpu
                       ) -> tuple[GpuInstance, ...]:
        subject = f"GPU {index}"
        out: list[GpuInstance] = []
        for p in table.gpu_instance_profiles:
            info = nvml.optional("nvmlDeviceGetGpuInstanceProfileInfo",
                                 pynvml.nvmlDeviceGetGpuInstanceProfileInfo, h, p.profile_id,
                                 default=None, subject=subject)
            if info is None:
                continue
            arr = (pynvml.c_nvmlGpuInstance_t * max(1, int(info.instanceCount)))()
            n = ctypes.c_uint(0)
            nvml.call("nvmlDeviceGetGpuInstances", pynvml.nvmlDeviceGetGpuInstances, h,
                      int(info.id), arr, ctypes.byref(n), subject=subject)
            for k in range(n.value):
                gi = arr[k]
                gi_info = nvml.call("nvmlGpuInstanceGetInfo", pynvml.nvmlGpuInstanceGetInfo, gi,
                                    subject=subject)
                out.append(GpuInstance(
                    id=int(gi_info.id), profile=p.name, profile_id=p.profile_id,
                    start=int(gi_info.placement.start), size=int(gi_info.placement.size),
                    compute_instances=self._compute_instances(index, gi, p),
                ))
        return tuple(sorted(out, key=lambda g: (g.start, g.id)))

    def _compute_instances(self, index: int, gi: Any, p: mig_profiles.GpuInstanceProfile
                           ) -> tuple[ComputeInstance, ...]:
        subject = f"GPU {index}"
        out: list[ComputeInstance] = []
        for cp in p.compute_instance_profiles:
            info = nvml.optional("nvmlGpuInstanceGetComputeInstanceProfileInfo",
                                 pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo, gi,
                                 cp.profile_id, _ENGINE_SHARED, default=None, subject=subject)
            if info is None:
                continue
            arr = (pynvml.c_nvmlComputeInstance_t * max(1, int(info.instanceCount)))()
            n = ctypes.c_uint(0)
            nvml.call("nvmlGpuInstanceGetComputeInstances",
                      pynvml.nvmlGpuInstanceGetComputeInstances, gi, int(info.id), arr,
                      ctypes.byref(n), subject=subject)
            for k in range(n.value):
                ci_info = nvml.call("nvmlComputeInstanceGetInfo",
                                    pynvml.nvmlComputeInstanceGetInfo, arr[k], subject=subject)
                out.append(ComputeInstance(
                    id=int(ci_info.id), profile_id=cp.profile_id,
                    start=int(ci_info.placement.start), size=int(ci_info.placement.size),
                ))
        return tuple(sorted(out, key=lambda c: (c.start, c.id)))

    @staticmethod
    def _processes(index: int, h: Any) -> tuple[Process, ...]:
        seen: dict[int, Process] = {}
        for name, fn in (
            ("nvmlDeviceGetComputeRunningProcesses", pynvml.nvmlDeviceGetComputeRunningProcesses),
            ("nvmlDeviceGetGraphicsRunningProcesses",
             pynvml.nvmlDeviceGetGraphicsRunningProcesses),
        ):
            procs: list[Any] = nvml.optional(name, fn, h, default=[], subject=f"GPU {index}")
            for proc in procs:
                used = getattr(proc, "usedGpuMemory", None)
                seen.setdefault(int(proc.pid), Process(
                    pid=int(proc.pid),
                    used_mb=int(used) >> 20 if used is not None else None,
                    gi=_opt_id(getattr(proc, "gpuInstanceId", None)),
                    ci=_opt_id(getattr(proc, "computeInstanceId", None)),
                ))
        return tuple(sorted(seen.values(), key=lambda p: p.pid))

    # -- changing --------------------------------------------------------------------------------

    def set_mig_mode(self, index: int, enabled: bool) -> None:
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if enabled else pynvml.NVML_DEVICE_MIG_DISABLE
        # returns the activation status: RESET_REQUIRED (pending) or IN_USE are not failures;
        # the mode is read back by the caller.
        nvml.call("nvmlDeviceSetMigMode", pynvml.nvmlDeviceSetMigMode, self._handle(index), mode,
                  subject=f"GPU {index}")

    def create_gpu_instance(self, index: int, profile_id: int, start: int, size: int) -> int:
        h = self._handle(index)
        ids = self._gi_ids(index, h, self._table(index, h))
        if profile_id not in ids:
            raise nvml.NvmlError("nvmlDeviceCreateGpuInstanceWithPlacement",
                                 pynvml.NVML_ERROR_NOT_SUPPORTED,
                                 f"profile {profile_id} not supported", f"GPU {index}")
        where = pynvml.c_nvmlGpuInstancePlacement_t()
        where.start, where.size = start, size
        gi = nvml.call("nvmlDeviceCreateGpuInstanceWithPlacement",
                       pynvml.nvmlDeviceCreateGpuInstanceWithPlacement, h, ids[profile_id],
                       ctypes.byref(where), subject=f"GPU {index}")
        info = nvml.call("nvmlGpuInstanceGetInfo", pynvml.nvmlGpuInstanceGetInfo, gi,
                         subject=f"GPU {index}")
        return int(info.id)

    def _gi(self, index: int, gi_id: int) -> Any:
        return nvml.call("nvmlDeviceGetGpuInstanceById", pynvml.nvmlDeviceGetGpuInstanceById,
                         self._handle(index), gi_id, subject=f"GPU {index} GPU instance {gi_id}")

    def create_compute_instance(self, index: int, gi_id: int, profile_id: int) -> int:
        gi = self._gi(index, gi_id)
        ci = nvml.call("nvmlGpuInstanceCreateComputeInstance",
                       pynvml.nvmlGpuInstanceCreateComputeInstance, gi,
                       self._ci_id(index, gi, profile_id),
                       subject=f"GPU {index} GPU instance {gi_id}")
        info = nvml.call("nvmlComputeInstanceGetInfo", pynvml.nvmlComputeInstanceGetInfo, ci,
                         subject=f"GPU {index} GPU instance {gi_id}")
        return int(info.id)

    def destroy_compute_instance(self, index: int, gi_id: int, ci_id: int) -> None:
        subject = f"GPU {index} GPU instance {gi_id} compute instance {ci_id}"
        ci = nvml.call("nvmlGpuInstanceGetComputeInstanceById",
                       pynvml.nvmlGpuInstanceGetComputeInstanceById, self._gi(index, gi_id), ci_id,
                       subject=subject)
        nvml.call("nvmlComputeInstanceDestroy", pynvml.nvmlComputeInstanceDestroy, ci,
                  subject=subject)

    def destroy_gpu_instance(self, index: int, gi_id: int) -> None:
        nvml.call("nvmlGpuInstanceDestroy", pynvml.nvmlGpuInstanceDestroy, self._gi(index, gi_id),
                  subject=f"GPU {index} GPU instance {gi_id}")


@contextlib.contextmanager
def open_nvml(library: str | None = None) -> Iterator[PynvmlBackend]:
    """nvmlInit (loading ``library`` first when given, e.g. the lab mock) ... nvmlShutdown."""
    if library:
        nvml.load_library(library)
    nvml.init()
    try:
        yield PynvmlBackend()
    finally:
        nvml.shutdown()
