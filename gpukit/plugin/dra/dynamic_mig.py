"""Dynamic MIG: a GPU declared dynamic (gpukit_dra_dynamic_mig) is published as partitionable
devices (KEP-4815; names and counters: gpukit.contracts.dra_dynamic_mig) and carved at prepare.

Publishing (`publish_gpu`): the GPU's counter set, its whole-GPU device consuming all of it, and
one device per allowed profile x placement consuming the profile's figures and the placement's
memory slices, whatever the GPU holds now: the scheduler keeps the books (what it allocated
consumes the counters), the node only carves what it is handed.

Carving (`Carver`, over the MIG manager's NVML backend): enable MIG mode when the GPU has none
(refused while processes run on it, or when the mode waits for a GPU reset), create the GPU
instance at the allocated placement and its compute instance spanning it, and find the MIG
device NVML then lists (its UUID and /dev/nvidia-caps nodes); destroy both on unprepare.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from gpukit.contracts import dra_dynamic_mig as contract
from gpukit.contracts import mig_profiles
from gpukit.contracts.dra import TYPE_MIG

from .. import nvml
from ..devices import Gpu, MigDevice, NodeDevices
from ..nvml.mig import PynvmlBackend
from ..resources import Unit, gpu_unit, mig_unit
from .slice_devices import Carve, SliceDevice, gpu_device, mig_name, quantity

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Carved:
    """What prepare created for a Carve: the instances' ids and the MIG device NVML lists."""

    gi: int
    ci: int
    uuid: str

    def as_json(self, carve: Carve) -> dict[str, Any]:
        return {"gpu": carve.gpu_index, "gpuUUID": carve.gpu_uuid, "gi": self.gi,
                "ci": self.ci, "uuid": self.uuid, "profile": carve.profile,
                "start": carve.start}


def _engines(p: mig_profiles.GpuInstanceProfile | mig_profiles.MigGpu) -> dict[str, int]:
    e = p.engines
    return {"copyEngines": e.copy, "decoders": e.decoder, "encoders": e.encoder,
            "jpegEngines": e.jpeg, "ofaEngines": e.ofa}


def _figures(p: mig_profiles.GpuInstanceProfile) -> dict[str, int]:
    """A profile's capacities (the static MIG device's names), memory in bytes."""
    return {"multiprocessors": p.multiprocessors, **_engines(p), "memory": p.memory_mb << 20}


def _counters(figures: Mapping[str, int], slices: Iterable[int]) -> dict[str, dict[str, str]]:
    out = {contract.CAPACITY_COUNTERS[k]: {"value": quantity(v)} for k, v in figures.items()}
    out.update({contract.memory_slice_counter(i): {"value": "1"} for i in slices})
    return out


def gpu_figures(table: mig_profiles.MigGpu) -> dict[str, int]:
    """The GPU's counters: each capacity the largest any profile has (as NVIDIA's driver sets
    them: a full-size GPU instance has every engine and SM MIG can hand out)."""
    out: dict[str, int] = {}
    for p in table.gpu_instance_profiles:
        for k, v in _figures(p).items():
            out[k] = max(out.get(k, 0), v)
    return out


def counter_set(gpu: Gpu, table: mig_profiles.MigGpu) -> dict[str, Any]:
    return {"name": contract.counter_set_name(gpu.minor),
            "counters": _counters(gpu_figures(table), range(table.memory_slices))}


def publish_gpu(gpu: Gpu, node: NodeDevices, profiles: Iterable[str],
                sysfs_root: str | None = None) -> tuple[dict[str, Any], list[SliceDevice]]:
    """The counter set of a dynamic GPU and its devices: the whole GPU consuming every counter
    and each allowed profile x placement. KeyError: the GPU has no MIG table."""
    table = mig_profiles.for_product(gpu.name)
    if table is None:
        raise KeyError(mig_profiles.no_table_reason(gpu.name))
    cset = counter_set(gpu, table)
    whole = gpu_device(gpu, node, sysfs_root)
    body = {**whole.body, "consumesCounters": [
        {"counterSet": cset["name"], "counters": cset["counters"]}]}
    devices = [SliceDevice(whole.name, whole.unit, body)]
    common = {k: v for k, v in whole.body["attributes"].items()
              if k not in ("type", "uuid", "index", "minor")}
    allowed = set(profiles)
    unknown = allowed - {p.name for p in table.gpu_instance_profiles} - {contract.ALL_PROFILES}
    if unknown:
        raise KeyError(f"profile(s) {', '.join(sorted(unknown))} are not {table.key}'s (known: "
                       f"{', '.join(p.name for p in table.gpu_instance_profiles)})")
    for p in table.gpu_instance_profiles:
        if p.name not in allowed and contract.ALL_PROFILES not in allowed:
            continue
        for pl in p.placements:
            name = mig_name(gpu, p.name, p.driver_id, pl.start)
            attrs = {"type": {"string": TYPE_MIG}, "parentUUID": {"string": gpu.uuid},
                     "profile": {"string": p.name}, "parentIndex": {"int": gpu.index},
                     "placementStart": {"int": pl.start}, "placementSize": {"int": pl.size},
                     **common}
            capacity = {k: {"value": quantity(v)} for k, v in _figures(p).items()}
            for i in range(pl.start, pl.start + pl.size):
                capacity[f"memorySlice{i}"] = {"value": "1"}
            consumes = [{"counterSet": cset["name"], "counters": _counters(
                _figures(p), range(pl.start, pl.start + pl.size))}]
            carve = Carve(gpu.index, gpu.uuid, gpu.minor, p.name, p.profile_id, pl.start,
                          pl.size)
            devices.append(SliceDevice(name, gpu_unit(gpu), {
                "name": name, "attributes": attrs, "capacity": capacity,
                "consumesCounters": consumes}, carve))
    return cset, devices


# -- carving -----------------------------------------------------------------------------------


class CarveError(RuntimeError):
    """A GPU or compute instance could not be created or destroyed; the message says which."""


class Carver(Protocol):
    def create(self, carve: Carve) -> Carved: ...

    def destroy(self, gpu_index: int, gi: int, ci: int) -> None: ...

    def instances(self, gpu_index: int) -> dict[int, tuple[int, ...]]:
        """GPU instance id -> its compute instance ids, on a GPU in MIG mode."""
        ...

    def unit(self, gpu_index: int, gi: int, ci: int) -> Unit | None:
        """The MIG device of that GPU and compute instance, as a health/CDI unit."""
        ...

    def release(self, gpu_index: int) -> None:
        """Leave MIG mode when nothing is carved (a whole-GPU claim needs the GPU out of it)."""
        ...


def default_reset() -> Callable[[int], None]:
    """How a GPU whose MIG mode waits for a reset is reset: as the MIG manager does it
    (`nvidia-smi -r -i N`; the lab's mock through the library)."""
    from ..mig import hooks

    return hooks.lab_mock_reset() if nvml.is_lab_mock() else \
        hooks.command_reset(hooks.NVIDIA_SMI_RESET)


@dataclass
class NvmlCarver:
    """The Carver over NVML (NVML initialised by the plugin). `reset`: resets an idle GPU
    whose MIG mode change waits for one (None: default_reset, chosen on first use)."""

    proc_root: str = "/"
    reset: Callable[[int], None] | None = None

    def __post_init__(self) -> None:
        self.backend = PynvmlBackend()

    def _mig_on(self, carve: Carve) -> None:
        state = self.backend.gpu(carve.gpu_index)
        if state.mig_current:
            return
        if state.processes:
            raise CarveError(f"GPU {carve.gpu_index} ({carve.gpu_uuid}): MIG mode is off and "
                             f"processes {[p.pid for p in state.processes]} run on it: not "
                             "enabled under them")
        self.backend.set_mig_mode(carve.gpu_index, True)
        if not self.backend.gpu(carve.gpu_index).mig_current:  # pending: the GPU is idle
            (self.reset or default_reset())(carve.gpu_index)
        if not self.backend.gpu(carve.gpu_index).mig_current:
            raise CarveError(f"GPU {carve.gpu_index} ({carve.gpu_uuid}): MIG mode set but "
                             "still pending after a GPU reset")
        log.info("GPU %d (%s): MIG mode enabled for dynamic MIG", carve.gpu_index,
                 carve.gpu_uuid)

    def create(self, carve: Carve) -> Carved:
        what = f"GPU {carve.gpu_index} ({carve.gpu_uuid}) {carve.profile} at {carve.start}"
        try:
            self._mig_on(carve)
            gi = self.backend.create_gpu_instance(carve.gpu_index, carve.profile_id,
                                                  carve.start, carve.size)
        except nvml.NvmlError as exc:
            raise CarveError(f"{what}: creating the GPU instance: {exc}") from exc
        try:
            table = mig_profiles.for_product(self.backend.gpu(carve.gpu_index).product)
            assert table is not None  # create_gpu_instance checked it
            p = table.gpu_instance_profile(carve.profile)
            full = p.compute_instance_profile(p.compute_slices).profile_id
            ci = self.backend.create_compute_instance(carve.gpu_index, gi, full)
        except (nvml.NvmlError, KeyError) as exc:
            self._undo_gi(carve.gpu_index, gi)
            raise CarveError(f"{what}: creating the compute instance: {exc}") from exc
        unit = self.unit(carve.gpu_index, gi, ci)
        if unit is None or unit.mig is None:
            self.destroy(carve.gpu_index, gi, ci)
            raise CarveError(f"{what}: GPU instance {gi} / compute instance {ci} created, but "
                             "NVML lists no MIG device for it: destroyed again")
        return Carved(gi, ci, unit.mig.uuid)

    def _undo_gi(self, index: int, gi: int) -> None:
        try:
            self.backend.destroy_gpu_instance(index, gi)
        except nvml.NvmlError as exc:
            log.error("GPU %d: GPU instance %d left behind: %s (destroyed at the next start)",
                      index, gi, exc)

    def destroy(self, gpu_index: int, gi: int, ci: int) -> None:
        try:
            present = self.instances(gpu_index)
            if gi not in present:
                return  # already gone (a reset, an earlier unprepare)
            if ci in present[gi]:
                self.backend.destroy_compute_instance(gpu_index, gi, ci)
            for other in present[gi]:  # nothing else may live in a GI gpukit carved
                if other != ci:
                    self.backend.destroy_compute_instance(gpu_index, gi, other)
            self.backend.destroy_gpu_instance(gpu_index, gi)
        except nvml.NvmlError as exc:
            raise CarveError(f"GPU {gpu_index}: destroying GPU instance {gi} (compute instance "
                             f"{ci}): {exc}") from exc

    def instances(self, gpu_index: int) -> dict[int, tuple[int, ...]]:
        state = self.backend.gpu(gpu_index)
        return {g.id: tuple(c.id for c in g.compute_instances) for g in state.gpu_instances}

    def unit(self, gpu_index: int, gi: int, ci: int) -> Unit | None:
        found = nvml.discover(with_topology=False)
        for gpu in found.gpus:
            if gpu.index != gpu_index:
                continue
            mig: MigDevice | None = next(
                (m for m in gpu.mig_devices if m.gi == gi and m.ci == ci), None)
            return None if mig is None else mig_unit(gpu, mig, self.proc_root)
        return None

    def release(self, gpu_index: int) -> None:
        state = self.backend.gpu(gpu_index)
        if state.mig_current and not state.gpu_instances and not state.processes:
            self.backend.set_mig_mode(gpu_index, False)
            if self.backend.gpu(gpu_index).mig_current:
                (self.reset or default_reset())(gpu_index)
            log.info("GPU %d (%s): MIG mode disabled for a whole-GPU claim", gpu_index,
                     state.uuid)
