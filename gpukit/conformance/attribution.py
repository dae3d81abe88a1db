"""Which running pod the agent's GPU series name: observed while the node's fill pods run.

dcgm-exporter attributes a device's series to the pod holding it (pod, namespace, container
labels, through the kubelet's PodResources API). The suite proves that on the pods it already
runs: the fill. The fill is released (its pods deleted) before the exclusive pods of the
timeslicing and workload areas, which run before the metrics area, so the observation is a
stage of its own, taken once per node while the fill stands: by the release itself when the run
has tests that read it, else by the first test that asks.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from gpukit.conformance.common import allocated_units
from gpukit.conformance.scraper import ScrapeError

Sample = tuple[str, dict[str, str], float]
FB_USED = "DCGM_FI_DEV_FB_USED"
WAIT_S = 20.0  # the agent reads the kubelet's PodResources at most every 5 s
PODS_PER_RESOURCE = 4  # a few pods prove the attribution


def scrape(suite: Any, node: str) -> list[Sample]:
    """The agent's /metrics as an authorised scraper (conformance.scraper); ScrapeError names
    node, address and what answered."""
    answer = suite.scrape(node)
    if answer.status != 200:
        raise ScrapeError(f"agent metrics at {answer.url} on node {node}: HTTP {answer.status} "
                          "for the scraper's token (allowed get nodes/metrics): "
                          f"{answer.body[:200]!r}")
    return [(s.name, dict(s.labels), s.value)
            for f in text_string_to_metric_families(answer.body) for s in f.samples]


@dataclass
class Attribution:
    """Per resource: pod -> the parent GPU UUIDs it holds (want) and those its series carry."""

    want: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    observed: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    error: str = ""


def _attributed(suite: Any, node: str, pods: set[str]) -> dict[str, list[str]]:
    got: dict[str, set[str]] = defaultdict(set)
    for name, labels, _ in scrape(suite, node):
        if (name == FB_USED and labels.get("namespace") == suite.namespace
                and labels.get("container") == "main"):
            got[labels.get("pod", "")].add(labels.get("UUID", ""))
    return {pod: sorted(got.get(pod, set())) for pod in pods}


def observe(suite: Any, node: str) -> Attribution:
    """The fill's running pods (a few per resource) and their series' labels, waited for up to
    WAIT_S until every pod is attributed as the kubelet allocated it."""
    probe = suite.probe(node)
    fill = suite.fill(node)
    out = Attribution()
    # The fill's record outlives the filler its isolation check deleted to make room.
    live = {p.metadata.name for p in suite.kube.core.list_namespaced_pod(suite.namespace).items
            if p.status.phase == "Running"}
    for resource in fill.fillers:
        pods = sorted((s for s in fill.running(resource) if s.pod in live),
                      key=lambda s: s.pod)[:PODS_PER_RESOURCE]
        out.want[resource] = {
            s.pod: sorted({probe.by_uuid[u][0].uuid if probe and u in probe.by_uuid else u
                           for u in allocated_units(s, probe)}) for s in pods}
    everyone = {pod for pods in out.want.values() for pod in pods}
    if not everyone:
        return out
    deadline = time.monotonic() + WAIT_S
    try:
        seen = _attributed(suite, node, everyone)
        while (any(seen[p] != w for want in out.want.values() for p, w in want.items())
               and time.monotonic() < deadline):
            time.sleep(1)
            seen = _attributed(suite, node, everyone)
    except ScrapeError as exc:
        out.error = str(exc)
        return out
    out.observed = {r: {p: seen[p] for p in want} for r, want in out.want.items()}
    return out
