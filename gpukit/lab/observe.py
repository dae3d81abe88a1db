"""Watch the lab's nodes and pods while something (a rollout) runs, and answer afterwards.

A Kubernetes watch sees every update, so short states (a node labelled `draining` for a
second) are not missed the way polling would miss them. Used by the rolling-upgrade lab
tests and benchmark: the order of a node's upgrade states, how many nodes were
unschedulable at once, how long each was, and what happened to pods.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from kubernetes import client, watch

from gpukit.contracts.label_names import DEVICE_PLUGIN_CONFIG as CONFIG_LABEL
from gpukit.provision.upgrade import DRIVER_LABEL, STATE_LABEL


@dataclass(frozen=True)
class NodeEvent:
    at: float  # time.monotonic()
    node: str
    unschedulable: bool
    state: str
    driver: str
    # The device plugin config the node selects, and its allocatable nvidia.com/gpu.
    config: str = ""
    gpus: int = -1


@dataclass(frozen=True)
class PodEvent:
    at: float
    kind: str  # ADDED, MODIFIED, DELETED (or LISTED for the initial list)
    name: str
    uid: str
    node: str
    phase: str
    deleting: bool
    labels: dict[str, str]


class _Watcher:
    """Runs list-then-watch on a thread until stopped; `record` gets each object."""

    def __init__(self, list_fn: Callable[..., Any], record: Callable[[str, Any], None],
                 **kwargs: Any) -> None:  # fmt: skip
        self._list_fn = list_fn
        self._record = record
        self._kwargs = kwargs
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.errors: list[str] = []

    def start(self) -> None:
        listed = self._list_fn(**self._kwargs)
        for obj in listed.items:
            self._record("LISTED", obj)
        self._version = listed.metadata.resource_version
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)

    def _stream(self) -> Iterator[dict[str, Any]]:
        w = watch.Watch()
        yield from w.stream(self._list_fn, resource_version=self._version,
                            timeout_seconds=2, **self._kwargs)  # fmt: skip

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for ev in self._stream():
                    obj = ev["object"]
                    self._version = obj.metadata.resource_version
                    self._record(ev["type"], obj)
                    if self._stop.is_set():
                        return
            except Exception as exc:  # a dropped watch is resumed, and reported
                self.errors.append(repr(exc))
                if "410" in str(exc):  # resource version too old: list again
                    listed = self._list_fn(**self._kwargs)
                    for obj in listed.items:
                        self._record("LISTED", obj)
                    self._version = listed.metadata.resource_version
                time.sleep(0.5)


class Timeline:
    """Node and pod events from start() to stop()."""

    def __init__(self, core: client.CoreV1Api, namespace: str | None = None) -> None:
        self.nodes: list[NodeEvent] = []
        self.pods: list[PodEvent] = []
        self._lock = threading.Lock()
        self._watchers = [_Watcher(core.list_node, self._node)]
        if namespace:
            self._watchers.append(
                _Watcher(core.list_namespaced_pod, self._pod, namespace=namespace))

    def __enter__(self) -> Timeline:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        for w in self._watchers:
            w.start()

    def stop(self) -> None:
        time.sleep(1)  # let the last updates arrive
        for w in self._watchers:
            w.stop()

    @property
    def errors(self) -> list[str]:
        return [e for w in self._watchers for e in w.errors]

    def _node(self, kind: str, obj: Any) -> None:
        labels = obj.metadata.labels or {}
        allocatable = (obj.status.allocatable if obj.status else None) or {}
        text = str(allocatable.get("nvidia.com/gpu", "0"))
        gpus = int(text) if text.isdigit() else -1
        ev = NodeEvent(time.monotonic(), obj.metadata.name, bool(obj.spec.unschedulable),
                       labels.get(STATE_LABEL, ""), labels.get(DRIVER_LABEL, ""),
                       labels.get(CONFIG_LABEL, ""), gpus)  # fmt: skip
        with self._lock:
            last = next((e for e in reversed(self.nodes) if e.node == ev.node), None)
            if last is None or (last.unschedulable, last.state, last.driver, last.config,
                                last.gpus) != (ev.unschedulable, ev.state, ev.driver,
                                               ev.config, ev.gpus):  # fmt: skip
                self.nodes.append(ev)

    def _pod(self, kind: str, obj: Any) -> None:
        ev = PodEvent(time.monotonic(), kind, obj.metadata.name, obj.metadata.uid,
                      obj.spec.node_name or "", (obj.status.phase if obj.status else "") or "",
                      obj.metadata.deletion_timestamp is not None,
                      dict(obj.metadata.labels or {}))  # fmt: skip
        with self._lock:
            self.pods.append(ev)

    # ---- questions asked afterwards

    def node_events(self, node: str) -> list[NodeEvent]:
        return [e for e in self.nodes if e.node == node]

    def states(self, node: str) -> list[str]:
        """The node's upgrade states in order, each once per change (initial state first)."""
        out: list[str] = []
        for e in self.node_events(node):
            if not out or out[-1] != e.state:
                out.append(e.state)
        return out

    def first(self, node: str, state: str) -> float | None:
        return next((e.at for e in self.node_events(node) if e.state == state), None)

    def max_unschedulable(self) -> int:
        """Most nodes unschedulable at the same moment."""
        current: dict[str, bool] = {}
        worst = 0
        for e in self.nodes:
            current[e.node] = e.unschedulable
            worst = max(worst, sum(current.values()))
        return worst

    def unschedulable_periods(self, node: str) -> list[tuple[float, float | None]]:
        """(from, to) of each period the node was cordoned; `to` None when it still is."""
        periods: list[tuple[float, float | None]] = []
        since: float | None = None
        for e in self.node_events(node):
            if e.unschedulable and since is None:
                since = e.at
            elif not e.unschedulable and since is not None:
                periods.append((since, e.at))
                since = None
        if since is not None:
            periods.append((since, None))
        return periods

    def pod_events(self, name_prefix: str = "") -> list[PodEvent]:
        return [e for e in self.pods if e.name.startswith(name_prefix)]
