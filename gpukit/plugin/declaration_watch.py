"""The served-vs-declared watchdog of the agent and of the DRA plugin: reads its node's
declaration (the device_plugin role's ConfigMap entry, gpukit.contracts.node_declaration),
compares it with what it serves (served.py) at every manager tick (the DRA plugin: every loop
turn, so after every republish) and reports the verdict where operators look:

- the node condition `GpuDeclarationMismatch` (node-problem-detector's shape: True with a
  reason and a message naming declared and served per resource, False with reason
  `ServesDeclaration` once the node serves its declaration again), through a status patch the
  admission policy narrows to this one condition on its own node;
- one Event on the node per distinct mismatch, and one when it is served again;
- the gauges gpukit_node_gpus_declared / gpukit_node_gpus_served per resource.

Without a declaration entry (a node the play did not declare, a plain host process) nothing is
reported and the gauges are absent; so too with an entry of the other kind (a DRA node's entry
for the agent, a device plugin node's for the DRA plugin: whoever serves the node reports).
A report that fails (API down) is tried again at the next tick; it never stops the node
serving.
"""

from __future__ import annotations

import datetime
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from gpukit.contracts import node_declaration as nd

from .metrics import PluginMetrics
from .served import Served, Verdict, compare

log = logging.getLogger(__name__)


class ConditionSink(Protocol):
    """The part of node_api.NodeClient this needs."""

    def set_condition(self, node_name: str, condition: dict[str, Any]) -> None: ...

    def event(self, node_name: str, reason: str, message: str,
              type_: str = "Warning") -> None: ...


def _stamp(when: datetime.datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(verdict: Verdict, now: datetime.datetime,
              since: datetime.datetime | None = None) -> dict[str, Any]:
    """The node condition for `verdict`, as node-problem-detector writes its own; `since`:
    when its status last changed (default now)."""
    return {"type": nd.CONDITION_TYPE, "status": "True" if verdict.mismatch else "False",
            "reason": verdict.reason, "message": verdict.message[:1024],
            "lastHeartbeatTime": _stamp(now), "lastTransitionTime": _stamp(since or now)}


class DeclarationWatch:
    def __init__(self, directory: str | None, node_name: str, metrics: PluginMetrics,
                 sink: ConditionSink | None, reread_seconds: float = 2.0,
                 clock: Callable[[], float] = time.monotonic, dra: bool = False) -> None:
        self.path = Path(directory, node_name) if directory and node_name else None
        self.dra = dra  # the DRA plugin's watch: compares only a DRA node's entry
        self.node_name = node_name
        self.metrics = metrics
        self.sink = sink
        self.reread_seconds = reread_seconds
        self._clock = clock
        self._next_read = 0.0
        self._stamp: tuple[int, int] | None = None  # the entry's (inode, mtime) last read
        self.declaration: nd.NodeDeclaration | None = None
        self._problem: str | None = None  # the last unusable entry's message, logged once
        self.verdict: Verdict | None = None
        self._reported: tuple[str, str] | None = None  # (status, message) on the node
        self._mismatch_reported = False
        self._since: datetime.datetime | None = None  # the reported status's transition

    def check(self, served: Callable[[], Served]) -> Verdict | None:
        """Compare and report; `served` is asked only when there is a declaration."""
        decl = self._read()
        if decl is None:
            if self.verdict is not None:
                self.metrics.set_declared_served({}, {})
                self.verdict = None
            return None
        verdict = compare(decl, served())
        if verdict != self.verdict:
            self.metrics.set_declared_served(verdict.declared, verdict.served)
            if verdict.mismatch:
                log.warning("%s", verdict.message)
            elif self.verdict is not None and self.verdict.mismatch:
                log.info("%s", verdict.message)
            self.verdict = verdict
        self._report(verdict)
        return verdict

    def _read(self) -> nd.NodeDeclaration | None:
        """This node's entry, re-read when the mounted file changed (the kubelet swaps a
        ConfigMap volume's files), at most every `reread_seconds`."""
        if self.path is None:
            return None
        now = self._clock()
        if now < self._next_read:
            return self.declaration
        self._next_read = now + self.reread_seconds
        try:
            st = os.stat(self.path)  # follows the ConfigMap volume's symlinks
        except FileNotFoundError:
            self._stamp, self.declaration = None, None
            return None
        except OSError as exc:
            self._unusable(f"declaration {self.path}: {exc}")
            return None
        stamp = (st.st_ino, st.st_mtime_ns)
        if stamp == self._stamp:
            return self.declaration
        self._stamp = stamp
        try:
            from gpukit.contracts import bounded_yaml  # PyYAML off the way to registering

            decl = nd.parse(bounded_yaml.read_text(self.path), str(self.path))
            if decl.node != self.node_name:
                raise nd.DeclarationError(f"{self.path}.node: {decl.node!r} is not this node "
                                          f"({self.node_name!r})")
        except (OSError, ValueError) as exc:  # ValueError: DeclarationError, UnreadableText
            self._unusable(str(exc) if isinstance(exc, nd.DeclarationError)
                           else f"declaration {self.path}: {exc}")
            self.declaration = None
            return None
        self._problem = None
        if decl.dra != self.dra:
            log.info("node %s is declared %s: not comparing here", self.node_name,
                     "a DRA node (the DRA plugin compares)" if decl.dra
                     else "a device plugin node (the node agent compares)")
            self.declaration = None
            return None
        self.declaration = decl
        return decl

    def _unusable(self, problem: str) -> None:
        if problem != self._problem:
            log.error("cannot use this node's declaration, not comparing: %s", problem)
            self.metrics.errors.labels(kind="declaration").inc()
            self._problem = problem

    def _report(self, verdict: Verdict) -> None:
        status = "True" if verdict.mismatch else "False"
        if self.sink is None or self._reported == (status, verdict.message):
            return
        now = datetime.datetime.now(datetime.UTC)
        same = self._reported is not None and self._reported[0] == status
        since = self._since if same else now
        try:
            self.sink.set_condition(self.node_name, condition(verdict, now, since))
            if verdict.mismatch:
                self.sink.event(self.node_name, nd.EVENT_MISMATCH, verdict.message)
            elif self._mismatch_reported:
                self.sink.event(self.node_name, nd.EVENT_CLEARED, verdict.message, "Normal")
        except Exception as exc:  # reporting must never take the node's GPUs down with it
            log.error("cannot report condition %s on node %s: %s", nd.CONDITION_TYPE,
                      self.node_name, exc)
            self.metrics.errors.labels(kind="declaration").inc()
            return
        self._reported = (status, verdict.message)
        self._since = since
        self._mismatch_reported = verdict.mismatch
