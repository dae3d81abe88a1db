"""Where each GPU instance of a layout goes: a search over the real placement tables.

``pack(gpu, wanted, existing)`` returns a concrete placement for every wanted instance, or
raises PlacementError saying why none exists (too many of one profile, not enough compute or
memory slices, media engines, or no non-overlapping arrangement). The search tries the largest
profiles first, each at its allowed starts in table order, and backtracks; among all packings it
keeps the one that reuses the most existing GPU instances (so a partially matching GPU changes as
little as possible, and a second apply changes nothing), ties broken by search order, which
gives the conventional layouts (4g at 0 then 3g at 4; 3g at 0 and 4; 1g at 0..6).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from gpukit.contracts.mig_profiles import GpuInstanceProfile, MigGpu, Placement


class PlacementError(ValueError):
    """No packing exists; the message says which profiles and why."""


@dataclass(frozen=True, order=True)
class Slot:
    """A GPU instance of the target layout: profile at a start memory slice."""

    start: int
    size: int
    profile: str

    def describe(self) -> str:
        return f"{self.profile}@{self.start}"


def _order_key(p: GpuInstanceProfile) -> tuple[int, int, bool, str]:
    # largest first; among equals the plain profile before +me, then by name
    return (-p.memory_slices, -p.compute_slices, p.media_extensions, p.name)


_ENGINES = (("ofa", "OFA"), ("jpeg", "JPEG"), ("decoder", "decoder"), ("encoder", "encoder"),
            ("copy", "copy"))


def layout_text(wanted: Mapping[str, int]) -> str:
    return " + ".join(f"{c} x {n}" if c > 1 else n for n, c in wanted.items()) or "no instances"


def capacity_problems(gpu: MigGpu, wanted: Mapping[GpuInstanceProfile, int]) -> list[str]:
    """Reasons the counts alone cannot fit (before any placement search)."""
    problems: list[str] = []
    for p, n in wanted.items():
        if n > p.max_count:
            problems.append(f"{p.name}: {n} requested, at most {p.max_count} per GPU")
    compute = sum(p.compute_slices * n for p, n in wanted.items())
    if compute > gpu.compute_slices:
        problems.append(f"needs {compute} compute slices, the GPU has {gpu.compute_slices}")
    memory = sum(p.memory_slices * n for p, n in wanted.items())
    if memory > gpu.memory_slices:
        problems.append(f"needs {memory} memory slices, the GPU has {gpu.memory_slices}")
    if problems:
        return problems
    for engine, label in _ENGINES:
        need = sum(getattr(p.engines, engine) * n for p, n in wanted.items())
        have = getattr(gpu.engines, engine)
        if need > have:
            users = ", ".join(p.name for p in wanted if getattr(p.engines, engine))
            problems.append(f"needs {need} {label} engines ({users}), the GPU has {have}")
    return problems


def pack(
    gpu: MigGpu,
    wanted: Mapping[str, int],
    existing: Collection[Slot] = (),
) -> list[Slot]:
    """Place ``wanted`` (profile name -> count) on a GPU of this table, reusing as many of the
    ``existing`` slots as possible. Returns slots sorted by start. Raises PlacementError."""
    profiles: dict[GpuInstanceProfile, int] = {}
    for name, count in wanted.items():
        try:
            p = gpu.gpu_instance_profile(name)
        except KeyError:
            known = ", ".join(q.name for q in gpu.gpu_instance_profiles)
            raise PlacementError(f"{name}: unknown profile (known: {known})") from None
        if count > 0:
            profiles[p] = profiles.get(p, 0) + count
    problems = capacity_problems(gpu, profiles)
    if problems:
        raise PlacementError("; ".join(problems))
    items = [p for p in sorted(profiles, key=_order_key) for _ in range(profiles[p])]
    have = Counter((s.profile, s.start) for s in existing)
    reusable = sum(
        min(n, sum(have[(p.name, pl.start)] for pl in p.placements)) for p, n in profiles.items()
    )
    best: list[tuple[GpuInstanceProfile, Placement]] | None = None
    best_kept = -1
    chosen: list[tuple[GpuInstanceProfile, Placement]] = []

    def search(i: int, kept: int) -> bool:
        """DFS; True to stop (an optimal packing was found)."""
        nonlocal best, best_kept
        if kept + (len(items) - i) <= best_kept:
            return False  # cannot beat what we have
        if i == len(items):
            if gpu.fits(chosen):
                best, best_kept = list(chosen), kept
                return kept >= min(reusable, len(items))
            return False
        p = items[i]
        # identical profiles are interchangeable: place them in increasing start order
        floor = chosen[-1][1].start if chosen and chosen[-1][0] == p else -1
        for pl in p.placements:
            if pl.start <= floor or any(pl.overlaps(q) for _, q in chosen):
                continue
            chosen.append((p, pl))
            stop = search(i + 1, kept + (1 if have[(p.name, pl.start)] else 0))
            chosen.pop()
            if stop:
                return True
        return False

    search(0, 0)
    if best is None:
        raise PlacementError(
            f"no arrangement of {layout_text({p.name: n for p, n in profiles.items()})} fits "
            "the allowed placements ("
            + "; ".join(
                f"{p.name} starts at {', '.join(str(pl.start) for pl in p.placements)}"
                for p in sorted(profiles, key=_order_key)
            )
            + ")"
        )
    return sorted(Slot(pl.start, pl.size, p.name) for p, pl in best)
