"""Per-node work of a run: done once per node, ahead of the tests where the cluster allows.

A node's slow steps are *stages*: the NVML probe over SSH, the PodResources reader pod, the host
facts, filling the node with pods, giving its devices back, the exclusive pods of the timeslicing
and workload areas. Each is computed once per (node, stage, resource) and its result (or error)
kept: by the first test that needs it (sequential, as with --node-parallelism 1), or ahead of the
tests by a bounded pool of node workers (--node-parallelism N), each taking one node at a time
and running its stages in the order the run's tests first use them.

Nodes are independent (every test pod is pinned to one node); the stages of one node are not
(filling, releasing and the exclusive pods share its devices): so parallelism is across nodes
only, and a node's stages run in the order sequential tests would run them. Tests still run one
after the other in collection order and only read the stages' results: the report (outcomes,
messages, comparisons, order) is the same either way.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

# What a test's marker `stages(...)` may name, in no particular order (the plan orders them).
STAGES = ("probe", "host", "helper", "scraper", "fill", "attribution", "release", "gt1",
          "workload")
# Stages done per (node, resource); the others once per node.
PER_RESOURCE = frozenset({"gt1", "workload"})
# What each stage needs of a node besides its API object: a cluster of API-only nodes (a
# simulated fleet, --api-only) has none of it, and the tests reading these stages skip there.
NEEDS = {
    "probe": "NVML on the host over SSH",
    "host": "the host over SSH",
    "helper": "the kubelet's PodResources API (a pod on the node)",
    "scraper": "a pod on the node and the agent's metrics",
    "fill": "pods running on the node",
    "attribution": "pods running on the node and the agent's metrics",
    "release": "pods running on the node",
    "gt1": "the kubelet's admission of a pod",
    "workload": "a workload pod on the node",
}
# The default of --node-parallelism: see the README's "Scale" section and
# benchmarks/fleet_scale.py for the figures it rests on.
DEFAULT_NODE_PARALLELISM = 4


@dataclass(frozen=True, order=True)
class StageKey:
    stage: str
    resource: str = ""

    def __str__(self) -> str:
        return f"{self.stage}[{self.resource}]" if self.resource else self.stage


@dataclass(frozen=True)
class Use:
    """One collected test's use of stages: its node, resource and its marker's stage names."""

    node: str
    resource: str
    stages: tuple[str, ...]


def key_for(stage: str, resource: str = "") -> StageKey:
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r} (known: {', '.join(STAGES)})")
    return StageKey(stage, resource if stage in PER_RESOURCE else "")


def plan(uses: Iterable[Use]) -> dict[str, list[StageKey]]:
    """Per node, the stages the tests use, in the order of their first use (tests in their
    run order). Nodes in the order of their first test."""
    out: dict[str, list[StageKey]] = {}
    seen: set[tuple[str, StageKey]] = set()
    for use in uses:
        steps = out.setdefault(use.node, [])
        for stage in use.stages:
            key = key_for(stage, use.resource)
            if (use.node, key) not in seen:
                seen.add((use.node, key))
                steps.append(key)
    return out


class Stages:
    """Once-per-(node, stage) results, shared by the tests and the node workers.

    `once` computes a stage in the calling thread unless someone already has (or is): then it
    waits for that result. An error is kept like a result and raised to every caller."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._futures: dict[tuple[str, StageKey], Future[Any]] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._workers: list[Future[None]] = []
        self._stop = threading.Event()

    def once(self, node: str, key: StageKey, compute: Callable[[], T]) -> T:
        with self._lock:
            fut = self._futures.get((node, key))
            mine = fut is None
            if fut is None:
                fut = Future()
                fut.set_running_or_notify_cancel()
                self._futures[(node, key)] = fut
        if mine:
            try:
                fut.set_result(compute())
            except BaseException as exc:  # kept for every caller, raised to this one too
                fut.set_exception(exc)
        result: T = fut.result()
        return result

    def done(self, node: str, key: StageKey) -> bool:
        with self._lock:
            fut = self._futures.get((node, key))
        return fut is not None and fut.done()

    def start(self, steps: dict[str, list[StageKey]], run: Callable[[str, StageKey], Any],
              parallelism: int) -> None:
        """Work the nodes' stages ahead, at most `parallelism` nodes at once (each node's
        stages in order; an error in one stage is kept for its tests, the next still run).
        `run(node, key)` computes a stage through `once` (as the tests' calls do), so a
        stage a test is computing is waited for, not done twice."""
        if parallelism <= 1 or not steps or self._pool is not None:
            return
        self._pool = ThreadPoolExecutor(max_workers=min(parallelism, len(steps)),
                                        thread_name_prefix="gpukit-node")
        for node, keys in steps.items():
            self._workers.append(self._pool.submit(self._work, node, keys, run))

    def _work(self, node: str, keys: Sequence[StageKey],
              run: Callable[[str, StageKey], Any]) -> None:
        for key in keys:
            if self._stop.is_set():
                return
            try:
                run(node, key)
            except Exception:  # kept in the stage's future for its tests
                continue

    def stop(self) -> None:
        """No new stage starts; wait for those running (each bounded by its own timeouts)."""
        self._stop.set()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
