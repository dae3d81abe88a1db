"""From a selected config and the node's GPUs to a validated plan: per GPU the target (MIG mode
and a concrete placement for every GPU instance) and the fewest actions that get there.

The whole layout is validated for every GPU before anything is touched: :func:`plan` raises
LayoutError listing every problem (GPU, profile, why). Instances that already match are kept,
so planning against a node that matches gives no actions (a second apply does nothing), and
planning from any intermediate state (mode pending, some instances created) gives exactly the
rest of the work: that is what makes apply converge after a crash.

Action order per GPU. Enabling: set (or withdraw a pending disable of) the MIG mode, reset when
the mode changes, destroy what does not belong (compute instances before their GPU
instances), create GPU instances at their placements, then one full-size compute instance in
each. Disabling: destroy every instance, set the mode, reset.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gpukit.contracts import mig_profiles
from gpukit.contracts.mig_parted import MigConfigEntry, MigConfigError, MigConfigs

from .placement import PlacementError, Slot, layout_text, pack
from .state import GpuInstance, GpuState, Process

log = logging.getLogger(__name__)


class LayoutError(ValueError):
    """The selected layout cannot be applied to this node; ``problems`` names GPU, profile and
    why for each."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


class ActionKind(StrEnum):
    SET_MIG_MODE = "set-mig-mode"
    RESET_GPU = "reset-gpu"
    DESTROY_COMPUTE_INSTANCE = "destroy-compute-instance"
    DESTROY_GPU_INSTANCE = "destroy-gpu-instance"
    CREATE_GPU_INSTANCE = "create-gpu-instance"
    CREATE_COMPUTE_INSTANCE = "create-compute-instance"


@dataclass(frozen=True)
class Action:
    """One change to one GPU. GPU instances are named by profile and start slice (their id is
    only known once created); ``gi``/``ci`` ids are set for instances that exist."""

    kind: ActionKind
    gpu: int
    enabled: bool | None = None
    profile: str | None = None
    start: int | None = None
    gi: int | None = None
    ci: int | None = None

    def text(self) -> str:
        g = f"GPU {self.gpu}"
        where = f"{self.profile} at slice {self.start}"
        match self.kind:
            case ActionKind.SET_MIG_MODE:
                return f"{g}: set MIG mode {'enabled' if self.enabled else 'disabled'}"
            case ActionKind.RESET_GPU:
                return f"{g}: reset the GPU (applies the pending MIG mode)"
            case ActionKind.DESTROY_COMPUTE_INSTANCE:
                return (f"{g}: destroy compute instance {self.ci} of GPU instance {self.gi} "
                        f"({where})")
            case ActionKind.DESTROY_GPU_INSTANCE:
                return f"{g}: destroy GPU instance {self.gi} ({where})"
            case ActionKind.CREATE_GPU_INSTANCE:
                return f"{g}: create GPU instance {where}"
            case ActionKind.CREATE_COMPUTE_INSTANCE:
                return f"{g}: create compute instance {self.profile} in the GPU instance at " \
                       f"slice {self.start}"
        raise AssertionError(self.kind)  # pragma: no cover

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"action": self.kind.value, "gpu": self.gpu}
        for key in ("enabled", "profile", "start", "gi", "ci"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        out["text"] = self.text()
        return out


@dataclass(frozen=True)
class Target:
    mig_enabled: bool
    slots: tuple[Slot, ...] = ()

    def describe(self) -> str:
        if not self.mig_enabled:
            return "MIG disabled"
        return "MIG enabled: " + (" ".join(s.describe() for s in self.slots) or "no instances")

    def to_json(self) -> dict[str, Any]:
        return {
            "mig_enabled": self.mig_enabled,
            "devices": [{"profile": s.profile, "start": s.start, "size": s.size}
                        for s in self.slots],
        }


def describe_current(gpu: GpuState) -> str:
    if not gpu.mig_capable:
        return "not MIG capable"
    text = gpu.mode_text()
    if gpu.mig_current:
        parts = []
        for gi in gpu.gpu_instances:
            full = _full_ci_profile_id(gpu, gi)
            cis = gi.compute_instances
            ok = len(cis) == 1 and cis[0].profile_id == full
            parts.append(gi.describe() + ("" if ok else f" ({len(cis)} compute instances"
                                              f"{'' if not cis else ', not full size'})"))
        text += ": " + (" ".join(parts) or "no instances")
    return text


def _full_ci_profile_id(gpu: GpuState, gi: GpuInstance) -> int | None:
    table = gpu.table
    if table is None:
        return None
    p = table.gpu_instance_profile(gi.profile_id)
    return p.compute_instance_profile(p.compute_slices).profile_id


@dataclass(frozen=True)
class GpuPlan:
    gpu: GpuState
    entry: str | None  # path of the config entry selecting this GPU; None: not selected
    target: Target | None  # None: the config does not manage this GPU
    kept: tuple[Slot, ...] = ()
    actions: tuple[Action, ...] = ()
    note: str = ""

    @property
    def changed(self) -> bool:
        return bool(self.actions)

    @property
    def reset_required(self) -> bool:
        return any(a.kind is ActionKind.RESET_GPU for a in self.actions)

    @property
    def blocking_processes(self) -> tuple[Process, ...]:
        """Processes on a GPU that must change (apply refuses unless forced)."""
        return self.gpu.processes if self.actions else ()

    def to_json(self) -> dict[str, Any]:
        g = self.gpu
        return {
            "index": g.index,
            "uuid": g.uuid,
            "product": g.product,
            "entry": self.entry,
            "managed": self.target is not None,
            "changed": self.changed,
            "reset_required": self.reset_required,
            "note": self.note or None,
            "unavailable_profiles": list(g.unavailable_profiles),
            "current": {
                "mig_capable": g.mig_capable,
                "mig_enabled": g.mig_current,
                "mig_pending": g.mig_pending,
                "devices": [
                    {"profile": gi.profile, "start": gi.start, "size": gi.size, "gi": gi.id,
                     "ci": [ci.id for ci in gi.compute_instances]}
                    for gi in g.gpu_instances
                ],
            },
            "target": self.target.to_json() if self.target is not None else None,
            "kept": [s.describe() for s in self.kept],
            "actions": [a.to_json() for a in self.actions],
            "diff": {"before": describe_current(g),
                     "after": self.target.describe() if self.target else describe_current(g)},
            "blocking_processes": [p.pid for p in self.blocking_processes],
        }


@dataclass(frozen=True)
class Plan:
    config: str
    gpus: tuple[GpuPlan, ...]

    @property
    def changed(self) -> bool:
        return any(g.changed for g in self.gpus)

    @property
    def actions(self) -> tuple[Action, ...]:
        return tuple(a for g in self.gpus for a in g.actions)

    @property
    def changed_gpus(self) -> tuple[GpuPlan, ...]:
        return tuple(g for g in self.gpus if g.changed)

    def blocking_processes(self) -> dict[int, tuple[Process, ...]]:
        return {g.gpu.index: g.blocking_processes for g in self.gpus if g.blocking_processes}

    def diff_text(self) -> dict[str, str]:
        """Ansible-style diff: one line per changed GPU, before and after."""
        before = "".join(f"GPU {g.gpu.index}: {describe_current(g.gpu)}\n"
                         for g in self.changed_gpus)
        after = "".join(f"GPU {g.gpu.index}: {g.target.describe() if g.target else ''}\n"
                        for g in self.changed_gpus)
        return {"before": before, "after": after,
                "before_header": "current MIG layout", "after_header": f"MIG config {self.config}"}

    def to_json(self) -> dict[str, Any]:
        return {
            "selected": self.config,
            "changed": self.changed,
            "reset_required": [g.gpu.index for g in self.gpus if g.reset_required],
            "gpus": [g.to_json() for g in self.gpus],
            "actions": [a.to_json() for a in self.actions],
            "blocking_processes": {str(i): [p.pid for p in ps]
                                   for i, ps in self.blocking_processes().items()},
            "diff": self.diff_text(),
        }


# -- planning ------------------------------------------------------------------------------------


def select_entries(
    entries: Sequence[MigConfigEntry], gpus: Sequence[GpuState]
) -> tuple[dict[int, MigConfigEntry], list[str]]:
    """GPU index -> the one entry selecting it. Problems: an index the node lacks, a GPU selected
    by two entries."""
    problems: list[str] = []
    indices = {g.index for g in gpus}
    for e in entries:
        for i in e.devices or ():
            if i not in indices:
                have = f"GPUs 0-{max(indices)}" if indices else "no GPUs"
                problems.append(f"{e.path}.devices: GPU {i} does not exist on this node ({have})")
    chosen: dict[int, MigConfigEntry] = {}
    for g in gpus:
        for e in entries:
            if not e.matches(g.index, g.pci_device_id, g.product):
                continue
            if g.index in chosen:
                problems.append(f"{g.label()}: selected by both {chosen[g.index].path} and "
                                f"{e.path}; make the entries' devices or device-filter disjoint")
                continue
            chosen[g.index] = e
    return chosen, problems


def plan(
    configs: MigConfigs | Sequence[MigConfigEntry], selected: str, gpus: Sequence[GpuState],
    excluded: Mapping[int, str] | None = None,
) -> Plan:
    """Plan ``selected`` for these GPUs. Raises MigConfigError (no such config) or LayoutError
    (the layout does not fit this node; every problem listed). ``excluded``: GPU index -> who
    else manages it (the DRA plugin's dynamic MIG): left as it is, whatever the layout says."""
    entries = configs.select(selected) if isinstance(configs, MigConfigs) else tuple(configs)
    excluded = excluded or {}
    chosen, problems = select_entries(entries, gpus)
    plans: list[GpuPlan] = []
    for g in sorted(gpus, key=lambda x: x.index):
        if g.index in excluded:
            log.info("GPU %d (%s): skipped, %s", g.index, g.uuid, excluded[g.index])
            plans.append(GpuPlan(gpu=g, entry=None, target=None,
                                 note=f"skipped: {excluded[g.index]}"))
            continue
        entry = chosen.get(g.index)
        if entry is None:
            plans.append(GpuPlan(gpu=g, entry=None, target=None, note="not selected by the config"))
            continue
        try:
            plans.append(plan_gpu(g, entry))
        except LayoutError as e:
            problems.extend(e.problems)
    if problems:
        raise LayoutError(problems)
    return Plan(config=selected, gpus=tuple(plans))


def _resolve(gpu: GpuState, entry: MigConfigEntry, table: mig_profiles.MigGpu) -> dict[str, int]:
    problems: list[str] = []
    out: dict[str, int] = {}
    known = ", ".join(p.name for p in table.gpu_instance_profiles)
    for name, count in entry.mig_devices.items():
        try:
            profile = table.gpu_instance_profile(name)
        except KeyError:
            problems.append(f"{entry.path}.mig-devices.{name}: unknown profile for {gpu.product} "
                            f"(GPU {gpu.index}; known: {known})")
            continue
        if count > 0 and profile.name in gpu.unavailable_profiles:
            offered = ", ".join(p.name for p in table.gpu_instance_profiles
                                if p.name not in gpu.unavailable_profiles) or "none"
            problems.append(f"{entry.path}.mig-devices.{name}: {gpu.label()}: the driver does "
                            f"not offer MIG profile {profile.name} on this GPU (NOT_SUPPORTED; "
                            f"an older driver may lack it; offered: {offered})")
            continue
        out[profile.name] = count
    if problems:
        raise LayoutError(problems)
    return out


def plan_gpu(gpu: GpuState, entry: MigConfigEntry) -> GpuPlan:
    """The plan for one GPU selected by ``entry``. Raises LayoutError."""
    if not gpu.mig_capable:
        if entry.mig_enabled:
            raise LayoutError([
                f"{gpu.label()}: {entry.path} sets mig-enabled: true, but this GPU is not MIG "
                "capable (NVML reports no MIG mode); select it with mig-enabled: false or leave "
                "it out of the entry's devices/device-filter"
            ])
        return GpuPlan(gpu=gpu, entry=entry.path, target=Target(False), note="not MIG capable")
    table = gpu.table
    if table is None or gpu.table_mismatches:
        # no table, or one the driver contradicts: nothing can be planned on this GPU but
        # leaving MIG off where it is off (which needs no table)
        if not entry.mig_enabled and not gpu.mig_current and not gpu.mig_pending:
            return GpuPlan(gpu=gpu, entry=entry.path, target=Target(False),
                           note="" if table is None else "MIG table disagrees with the driver")
        if table is None:
            known = ", ".join(t.product_names[0] for t in mig_profiles.tables().gpus.values())
            raise LayoutError([f"{gpu.label()}: no MIG profile table for this product, cannot "
                               f"plan {entry.path} (tables: {known})"])
        raise LayoutError([
            f"{gpu.label()}: {m.text()}; the table does not describe this GPU, refusing to "
            f"plan {entry.path} on it" for m in gpu.table_mismatches
        ])
    if not entry.mig_enabled:
        return _plan_disable(gpu, entry)
    wanted = _resolve(gpu, entry, table)
    existing = gpu.gpu_instances if gpu.mig_current else ()
    try:
        slots = pack(table, wanted, [Slot(gi.start, gi.size, gi.profile) for gi in existing])
    except PlacementError as e:
        raise LayoutError([f"{gpu.label()}: {entry.path}.mig-devices "
                           f"({layout_text(wanted)}) does not fit: {e}"]) from None
    return _plan_enable(gpu, entry, table, tuple(slots))


def _destroy(gpu: GpuState, gi: GpuInstance) -> list[Action]:
    out = [
        Action(ActionKind.DESTROY_COMPUTE_INSTANCE, gpu.index, profile=gi.profile, start=gi.start,
               gi=gi.id, ci=ci.id)
        for ci in gi.compute_instances
    ]
    out.append(Action(ActionKind.DESTROY_GPU_INSTANCE, gpu.index, profile=gi.profile,
                      start=gi.start, gi=gi.id))
    return out


def _plan_disable(gpu: GpuState, entry: MigConfigEntry) -> GpuPlan:
    actions: list[Action] = []
    if gpu.mig_current:
        for gi in gpu.gpu_instances:
            actions.extend(_destroy(gpu, gi))
    if gpu.mig_pending:
        actions.append(Action(ActionKind.SET_MIG_MODE, gpu.index, enabled=False))
    if gpu.mig_current:
        actions.append(Action(ActionKind.RESET_GPU, gpu.index))
    return GpuPlan(gpu=gpu, entry=entry.path, target=Target(False), actions=tuple(actions))


def _plan_enable(
    gpu: GpuState, entry: MigConfigEntry, table: mig_profiles.MigGpu, slots: tuple[Slot, ...]
) -> GpuPlan:
    actions: list[Action] = []
    if not gpu.mig_pending:
        actions.append(Action(ActionKind.SET_MIG_MODE, gpu.index, enabled=True))
    kept: list[Slot] = []
    fix_ci: list[Action] = []
    if gpu.mig_current:
        wanted = set(slots)
        for gi in gpu.gpu_instances:
            slot = Slot(gi.start, gi.size, gi.profile)
            if slot not in wanted:
                actions.extend(_destroy(gpu, gi))
                continue
            wanted.discard(slot)
            kept.append(slot)
            full = table.gpu_instance_profile(gi.profile_id)
            full_ci = full.compute_instance_profile(full.compute_slices).profile_id
            has_full = False
            for ci in gi.compute_instances:
                if ci.profile_id == full_ci and not has_full:
                    has_full = True
                    continue
                actions.append(Action(ActionKind.DESTROY_COMPUTE_INSTANCE, gpu.index,
                                      profile=gi.profile, start=gi.start, gi=gi.id, ci=ci.id))
            if not has_full:
                fix_ci.append(Action(ActionKind.CREATE_COMPUTE_INSTANCE, gpu.index,
                                     profile=gi.profile, start=gi.start, gi=gi.id))
    else:
        actions.append(Action(ActionKind.RESET_GPU, gpu.index))
    new = [s for s in slots if s not in kept]
    actions.extend(fix_ci)
    actions.extend(Action(ActionKind.CREATE_GPU_INSTANCE, gpu.index, profile=s.profile,
                          start=s.start) for s in new)
    actions.extend(Action(ActionKind.CREATE_COMPUTE_INSTANCE, gpu.index, profile=s.profile,
                          start=s.start) for s in new)
    return GpuPlan(gpu=gpu, entry=entry.path, target=Target(True, slots), kept=tuple(kept),
                   actions=tuple(actions))


__all__ = [
    "Action", "ActionKind", "GpuPlan", "LayoutError", "MigConfigError", "Plan", "Target",
    "plan", "plan_gpu", "select_entries",
]
