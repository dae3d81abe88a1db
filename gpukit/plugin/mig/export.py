"""Read a node's current MIG layout back as a mig-parted ``version: v1`` config (like
``nvidia-mig-parted export``): GPUs with the same layout share one entry (``devices: all``
when every GPU does). Planning the exported config against the same node changes nothing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpukit.contracts import mig_profiles
from gpukit.mig.state import GpuState


def _key(name: str, table: mig_profiles.MigGpu | None) -> tuple[int, int, bool, str]:
    if table is None:
        return (0, 0, False, name)
    p = table.gpu_instance_profile(name)
    return (-p.memory_slices, -p.compute_slices, p.media_extensions, p.name)


def gpu_layout(g: GpuState) -> tuple[bool, tuple[tuple[str, int], ...]]:
    """(mig enabled, ((profile, count), ...)) as the config would say it."""
    if not g.mig_current:
        return (False, ())
    counts: dict[str, int] = {}
    for gi in g.gpu_instances:
        counts[gi.profile] = counts.get(gi.profile, 0) + 1
    table = g.table
    return (True, tuple(sorted(counts.items(), key=lambda kv: _key(kv[0], table))))


def export_warnings(gpus: Sequence[GpuState]) -> list[str]:
    """What the exported config cannot say (it would show up as a change when planned)."""
    out: list[str] = []
    for g in gpus:
        if g.mig_capable and g.mig_pending != g.mig_current:
            out.append(f"{g.label()}: {g.mode_text()}; exported as the current mode")
        for m in g.table_mismatches:
            out.append(f"{g.label()}: {m.text()}; the table does not describe this GPU, the "
                       "exported profile names may be wrong and planning it is refused")
        table = g.table
        for gi in g.gpu_instances:
            if table is None:
                continue
            p = table.gpu_instance_profile(gi.profile_id)
            full = p.compute_instance_profile(p.compute_slices).profile_id
            if [ci.profile_id for ci in gi.compute_instances] != [full]:
                out.append(f"{g.label()}: GPU instance {gi.describe()} does not have exactly one "
                           "full-size compute instance; exported as one MIG device")
    return out


def export_config(gpus: Sequence[GpuState], name: str = "current") -> dict[str, Any]:
    """The mig-parted document describing these GPUs under the config name ``name``."""
    groups: dict[tuple[bool, tuple[tuple[str, int], ...]], list[int]] = {}
    for g in sorted(gpus, key=lambda x: x.index):
        groups.setdefault(gpu_layout(g), []).append(g.index)
    entries: list[dict[str, Any]] = []
    for (enabled, devices), indices in groups.items():
        entry: dict[str, Any] = {"devices": "all" if len(groups) == 1 else indices,
                                 "mig-enabled": enabled}
        if enabled:
            entry["mig-devices"] = dict(devices)
        entries.append(entry)
    if not entries:  # a node without GPUs
        entries.append({"devices": "all", "mig-enabled": False})
    return {"version": "v1", "mig-configs": {name: entries}}
