"""Time-slicing: the declared replicas per GPU, `<uuid>::<n>` device IDs, renamed `.shared`
resources, requests above one rejected at admission when configured, and pods spread over the
physical GPUs as the replicas say."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from gpukit import inventory as inv
from gpukit.conformance import expect
from gpukit.conformance.checks import Check
from gpukit.conformance.common import allocated_units, need_decl, need_expected
from gpukit.contracts.device_ids import ReplicaId, strip_replica
from gpukit.k8s.nodes import allocatable

pytestmark = pytest.mark.timeslicing


def _units(decl: inv.NodeDecl, resource: str) -> list[expect.ExpectedUnit]:
    return [u for u in expect.expected_units(decl) if u.resource == resource]


@pytest.mark.stages("helper")
@pytest.mark.per_resource("shared")
def test_replica_counts(gpukit_suite: Any, node: str, resource: str, check: Check) -> None:
    """allocatable = sum of replicas; the kubelet's device IDs are `<device>::<n>`, n from 0,
    with each device's declared number of replicas."""
    decl = need_decl(gpukit_suite, node)
    expected = need_expected(gpukit_suite, node)
    observed = allocatable(gpukit_suite.listed_node(node))
    check.equal("allocatable (devices x replicas)", expected[resource],
                observed.get(resource, 0), resource)
    view, error = gpukit_suite.podresources(node)
    if view is None:
        check.record("PodResources GetAllocatableResources", "an answer", error, False, resource)
        check.verify()
    ids = view.allocatable.get(resource, [])
    replicas = {i: ReplicaId.parse(i) for i in ids}
    bad = sorted(i for i, r in replicas.items() if r is None)
    check.equal("device IDs not of the form <device>::<n>", [], bad, resource)
    per_device = Counter(strip_replica(i) for i in ids)
    check.equal("replicas per device", sorted(u.replicas for u in _units(decl, resource)),
                sorted(per_device.values()), resource)
    for device, n in sorted(per_device.items()):
        numbers = sorted(r.replica for r in replicas.values() if r and r.device == device)
        check.equal(f"replica numbers of {device}", list(range(n)), numbers, resource)
    check.verify()


def test_shared_resource_names(gpukit_suite: Any, node: str, check: Check) -> None:
    """Renamed (or renameByDefault) shared resources appear under their new name, and the
    original name keeps only the devices that are not shared."""
    decl = need_decl(gpukit_suite, node)
    ts = decl.plugin_config.sharing
    if not ts.resources:
        check.skip(f"config {decl.plugin_config_name!r} declares no sharing (time-slicing or MPS)")
    expected = need_expected(gpukit_suite, node)
    observed = allocatable(gpukit_suite.listed_node(node))
    names = sorted({u.resource for u in expect.expected_units(decl)}
                   | {u.base_resource for u in expect.expected_units(decl)})
    for name in names:
        check.equal("allocatable", expected.get(name, 0), observed.get(name, 0), name)
    renamed = sorted(n for n in expected if n.endswith(".shared"))
    check.equal("renamed '.shared' resources", renamed,
                sorted(n for n, c in observed.items() if n.endswith(".shared") and c))
    check.verify()


@pytest.mark.stages("fill", "probe")
@pytest.mark.per_resource("shared")
def test_replicas_spread_over_gpus(gpukit_suite: Any, node: str, resource: str,
                                   check: Check) -> None:
    """With every replica taken, each physical device serves exactly its declared replicas."""
    decl = need_decl(gpukit_suite, node)
    f = gpukit_suite.fill(node)
    probe = gpukit_suite.probe(node)
    running = f.running(resource)
    if not running:
        check.record("filler pods Running", f.counts.get(resource, 0), 0, False, resource)
        check.verify()
    per_device: Counter[str] = Counter()
    for s in running:
        for device_id in (s.kubelet_ids or allocated_units(s, probe)):
            per_device[strip_replica(device_id)] += 1
    units = _units(decl, resource)
    check.equal("pods per physical device", sorted(u.replicas for u in units),
                sorted(per_device.values()), resource)
    if probe is not None:
        want = expect.replicas_per_gpu(decl, resource)
        got: Counter[int] = Counter()
        for device, n in per_device.items():
            parent = probe.parent(device)
            got[parent.index if parent else -1] += n
        if want:
            check.equal("pods per GPU index", want, dict(sorted(got.items())), resource)
    check.verify()


@pytest.mark.exclusive
@pytest.mark.stages("release", "gt1")
@pytest.mark.per_resource("shared")
def test_request_above_one(gpukit_suite: Any, node: str, resource: str, check: Check) -> None:
    """A container asking for 2 replicas fails admission with UnexpectedAdmissionError when
    failRequestsGreaterThanOne is set, and runs otherwise."""
    decl = need_decl(gpukit_suite, node)
    fail_gt_one = decl.plugin_config.sharing.fail_requests_greater_than_one
    run = gpukit_suite.request_above_one(node, resource)
    name, state = run.pod, run.state
    if fail_gt_one:
        check.equal(f"pod {name} requesting 2 (failRequestsGreaterThanOne: true)",
                    "Failed (UnexpectedAdmissionError)",
                    f"{state.state} ({state.reason})" if state.reason else state.state, resource)
        check.true("admission message", "maximum request size for shared resources is 1"
                   in state.message or "too large" in state.message,
                   "... maximum request size for shared resources is 1", state.message,
                   resource)
    else:
        check.equal(f"pod {name} requesting 2 (failRequestsGreaterThanOne: false)", "Running",
                    str(state), resource)
    check.verify()
