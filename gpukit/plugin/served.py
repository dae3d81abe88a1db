"""Served vs declared: does this node serve what the inventory declares for it?

Pure: the watchdog (declaration_watch.py, run by the agent and, on a DRA node, by the DRA
plugin) hands in the node's declaration (rendered by the device_plugin role from the
declaration check, gpukit.contracts.node_declaration) and what it serves now, and reports the
verdict as a node condition, an Event and gauges.

"Served" counts the healthy devices the agent advertises per resource, which is what the
kubelet makes allocatable: a lost GPU or one that fell off the bus stays advertised but
Unhealthy, so it counts as not served; a MIG layout that drifted shows as other MIG resources
or counts. A config fallback (the selected config refused, the last good or running one served,
see config_keeper.py) is a mismatch even where the counts agree: the node does not serve the
declared config. Config names are not compared: rollouts select versioned names of the same
declaration.

On a DRA node "served" counts the healthy devices the DRA plugin publishes per kind
(node_declaration.dra_kind: whole GPUs, MIG devices per profile; dra_served): a device
published tainted unhealthy (a critical XID, a lost GPU) or no longer published counts as not
served.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpukit.contracts import node_declaration as nd


@dataclass(frozen=True)
class Served:
    """What the agent serves now."""

    resources: Mapping[str, int]  # resource (DRA: device kind) -> healthy devices
    config_refused: str | None = None  # why the selected config is refused, while falling back


@dataclass(frozen=True)
class Verdict:
    mismatch: bool
    reason: str  # a node_declaration.REASON_*
    message: str
    declared: Mapping[str, int]  # every resource declared or served -> count (0: none)
    served: Mapping[str, int]


def dra_served(devices: Iterable[Mapping[str, Any]]) -> Served:
    """What a DRA node serves: its healthy published devices (ResourceSlice device bodies)
    counted by kind, from their `type` and `profile` attributes as the suite reads them; a
    dynamic MIG GPU's possible MIG devices are not counted (its whole GPU is)."""
    counts: dict[str, int] = {}
    for body in devices:
        attrs = body.get("attributes") or {}
        if body.get("consumesCounters") and "uuid" not in attrs:
            continue  # a dynamic MIG device: a possible carving, not a device the node has
        kind = nd.dra_kind(str((attrs.get("type") or {}).get("string") or ""),
                           str((attrs.get("profile") or {}).get("string") or "") or None)
        counts[kind] = counts.get(kind, 0) + 1
    return Served(counts)


def compare(declaration: nd.NodeDeclaration, served: Served) -> Verdict:
    want = declaration.counts()
    names = sorted(set(want) | set(served.resources))
    declared = {n: int(want.get(n, 0)) for n in names}
    got = {n: int(served.resources.get(n, 0)) for n in names}
    differ = [f"{n} declared {declared[n]}, served {got[n]}" for n in names
              if declared[n] != got[n]]
    problems = list(differ)
    if served.config_refused is not None:
        what = (f"config {declaration.device_plugin_config!r}"
                if declaration.device_plugin_config else "the selected config")
        problems.append(f"{what} declared, refused ({served.config_refused}); an earlier "
                        "config is served")
    node = declaration.node
    if not problems:
        return Verdict(False, nd.REASON_OK, nd.served_message(node, got), declared, got)
    reason = nd.REASON_CONFIG if served.config_refused is not None else nd.REASON_DEVICES
    return Verdict(True, reason, f"node {node}: " + "; ".join(problems), declared, got)
