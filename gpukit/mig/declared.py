"""A MIG layout against the GPUs a node declares (``gpukit_gpu``: product and count).

The inventory cannot see the node's GPUs, but it knows their model and number: enough to say
which GPUs each entry of a parsed layout selects, whether each profile exists in that model's
table and whether the GPU instances fit (the planner's own placement search, ``pack``), and
what every GPU is then to look like. The node's MIG manager plans the same layout against the
GPUs it finds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpukit.contracts import mig_profiles
from gpukit.contracts.mig_parted import MigConfigEntry

from .placement import PlacementError, pack


@dataclass(frozen=True)
class GpuMig:
    """What a declared layout means for one GPU."""

    index: int
    mig_enabled: bool
    profiles: tuple[str, ...] = ()  # one entry per GPU instance, sorted


@dataclass(frozen=True)
class LayoutProblem:
    """Where (the entry's path and field), which value, what is wrong."""

    path: str
    value: object
    message: str


def expand(counts: Mapping[str, int]) -> tuple[str, ...]:
    """{profile: n} as one sorted entry per GPU instance."""
    return tuple(sorted(p for p, n in counts.items() for _ in range(n)))


def _selects(entry: MigConfigEntry, index: int, product: str) -> bool:
    # A PCI-id filter cannot be judged from a declaration (the id is not declared): it is taken
    # to select the declared GPUs, which are all of one model.
    if any(f.pci_device_id is not None for f in entry.device_filter):
        return entry.devices is None or index in entry.devices
    return entry.matches(index, None, product)


def layout_gpus(
    entries: Sequence[MigConfigEntry], product: str, count: int
) -> tuple[tuple[GpuMig, ...], list[LayoutProblem]]:
    """Every declared GPU's target under ``entries`` (GPUs no entry selects: MIG disabled), and
    every problem: a GPU index the node lacks, a GPU two entries select, a profile the model's
    table lacks, MIG asked of a model without a table, instances that do not fit."""
    table = mig_profiles.for_product(product)
    problems: list[LayoutProblem] = []
    per = {i: GpuMig(i, False) for i in range(count)}
    covered: dict[int, str] = {}
    for entry in entries:
        where = entry.path
        for d in entry.devices or ():
            if d >= count:
                problems.append(LayoutProblem(
                    f"{where}.devices", d, f"is not a GPU of this node (gpukit_gpu.count is "
                    f"{count}: indices 0-{count - 1})" if count else
                    "is not a GPU of this node (gpukit_gpu.count is 0)"))
        selected = [i for i in range(count) if _selects(entry, i, product)]
        for d in selected:
            if d in covered:
                problems.append(LayoutProblem(f"{where}.devices", d,
                                              f"is already laid out by {covered[d]}"))
            covered[d] = where
        if not selected:
            continue  # as on the node: an entry that selects no GPU asks nothing of a table
        profiles = _profiles(entry, product, table, problems)
        for d in selected:
            per[d] = GpuMig(d, entry.mig_enabled, profiles)
    return tuple(per[i] for i in sorted(per)), problems


def _profiles(entry: MigConfigEntry, product: str, table: mig_profiles.MigGpu | None,
              problems: list[LayoutProblem]) -> tuple[str, ...]:
    where = f"{entry.path}.mig-devices"
    if table is None:
        if entry.mig_devices:
            problems.append(LayoutProblem(
                where, dict(entry.mig_devices),
                f"asks for MIG devices, but {mig_profiles.no_table_reason(product)}"))
        elif entry.mig_enabled:
            problems.append(LayoutProblem(f"{entry.path}.mig-enabled", True,
                                          f"but {mig_profiles.no_table_reason(product)}"))
        return ()
    counts: dict[str, int] = {}
    unknown = False
    for name, n in entry.mig_devices.items():
        try:
            canon = table.gpu_instance_profile(name).name
        except KeyError:
            names = ", ".join(p.name for p in table.gpu_instance_profiles)
            problems.append(LayoutProblem(where, name, f"is not a MIG profile of {table.key} "
                                          f"(known: {names})"))
            unknown = True
            continue
        counts[canon] = counts.get(canon, 0) + n
    if unknown:
        return ()
    try:
        pack(table, counts)
    except PlacementError as e:
        problems.append(LayoutProblem(where, dict(entry.mig_devices),
                                      f"does not fit on one {table.key} ({e})"))
        return ()
    return expand(counts)
