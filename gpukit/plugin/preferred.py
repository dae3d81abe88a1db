"""GetPreferredAllocation: which of the available devices a container should get.

- Replicas (time-slicing): pick per physical device. `distributed` (default) takes the device
  with the fewest replicas already handed out, spreading load; `packed` the one with the most,
  keeping other GPUs free. Allocated = replicas of a device not in the kubelet's available list.
- Whole GPUs: the set with the best pairwise links: NVLinks first (100 per link), then PCIe
  distance (same switch > several switches > host bridge > same NUMA node > across sockets),
  and same NUMA node when NVML gives no topology. Exhaustive for small searches, greedy beyond.
  On an NVSwitch node (DGX A100/H100) every pair has the same NVLinks through the switches
  (NV12/NV18, see nvml.discovery._nvlinks_between), so PCIe distance and the socket decide.
- MIG devices: fill parents in order, so fewer GPUs are touched.

The answer always contains `must_include` and never an unknown or unavailable ID; it is a
hint, so it never fails: with too few devices it returns what there is.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Sequence

from .devices import TOPOLOGY_SYSTEM, NodeDevices
from .resources import PluginDevice, Resource, Unit

MAX_EXHAUSTIVE_SETS = 5000
NVLINK_WEIGHT = 100


def pair_score(node_devices: NodeDevices, a: Unit, b: Unit) -> int:
    link = node_devices.link(a.uuid, b.uuid)
    score = link.nvlinks * NVLINK_WEIGHT
    if link.ancestor is not None:
        score += max(0, TOPOLOGY_SYSTEM - link.ancestor)  # 40 same switch ... 0 across sockets
    elif a.numa_node is not None and a.numa_node == b.numa_node:
        score += 10
    return score


def set_score(node_devices: NodeDevices, units: Sequence[Unit]) -> int:
    return sum(pair_score(node_devices, a, b) for a, b in itertools.combinations(units, 2))


def preferred(
    resource: Resource,
    node_devices: NodeDevices,
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    policy: str = "distributed",
) -> list[str]:
    by_id = resource.by_id()
    avail = [by_id[i] for i in dict.fromkeys(available) if i in by_id]
    required = [by_id[i] for i in dict.fromkeys(must_include) if i in by_id]
    if size <= len(required):
        return [d.id for d in required[: max(size, 0)]]
    required_ids = {d.id for d in required}
    candidates = [d for d in avail if d.id not in required_ids]
    needed = min(size - len(required), len(candidates))
    if any(d.is_replica for d in resource.devices):
        picked = _replicas(resource, avail, required, candidates, needed, policy)
    elif any(d.unit.mig is not None for d in candidates):
        picked = sorted(candidates, key=lambda d: (d.unit.gpu.index, d.unit.index_id))[:needed]
    else:
        picked = _whole_gpus(node_devices, required, candidates, needed)
    return [d.id for d in required] + [d.id for d in picked]


def _replicas(
    resource: Resource,
    available: list[PluginDevice],
    required: list[PluginDevice],
    candidates: list[PluginDevice],
    needed: int,
    policy: str,
) -> list[PluginDevice]:
    total: dict[str, int] = {}
    for d in resource.devices:
        total[d.unit.uuid] = total.get(d.unit.uuid, 0) + 1
    free: dict[str, int] = {}
    for d in candidates:
        free[d.unit.uuid] = free.get(d.unit.uuid, 0) + 1
    touched: dict[str, int] = {}
    for d in required:  # a required replica's GPU counts as used by this allocation
        touched[d.unit.uuid] = touched.get(d.unit.uuid, 0) + 1
    queues: dict[str, list[PluginDevice]] = {}
    for d in candidates:
        queues.setdefault(d.unit.uuid, []).append(d)
    sign = -1 if policy == "packed" else 1
    order = {u: i for i, u in enumerate(queues)}

    def key(unit: str) -> tuple[int, int, int]:
        allocated = total[unit] - free[unit]
        return (sign * allocated, touched.get(unit, 0), order[unit])

    heap = [(key(u), u) for u in queues]
    heapq.heapify(heap)
    picked: list[PluginDevice] = []
    while len(picked) < needed and heap:
        _, unit = heapq.heappop(heap)
        picked.append(queues[unit].pop(0))
        free[unit] -= 1
        touched[unit] = touched.get(unit, 0) + 1
        if queues[unit]:
            heapq.heappush(heap, (key(unit), unit))
    return picked


def _whole_gpus(
    node_devices: NodeDevices, required: list[PluginDevice], candidates: list[PluginDevice],
    needed: int) -> list[PluginDevice]:
    candidates = sorted(candidates, key=lambda d: d.unit.gpu.index)
    if needed <= 0:
        return []
    base = [d.unit for d in required]
    if math.comb(len(candidates), needed) <= MAX_EXHAUSTIVE_SETS:
        best: tuple[PluginDevice, ...] = ()
        best_score = -1
        for combo in itertools.combinations(candidates, needed):
            score = set_score(node_devices, base + [d.unit for d in combo])
            if score > best_score:  # strict: earliest (lowest indices) wins ties
                best, best_score = combo, score
        return list(best)
    picked: list[PluginDevice] = []
    pool = list(candidates)
    units = list(base)
    while len(picked) < needed:
        choice = max(pool, key=lambda d: (sum(pair_score(node_devices, d.unit, u) for u in units),
                                          -d.unit.gpu.index))
        pool.remove(choice)
        picked.append(choice)
        units.append(choice.unit)
    return picked
