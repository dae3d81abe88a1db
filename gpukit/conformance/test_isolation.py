"""Allocation isolation: a node filled with one pod per device gives every container its own
devices, shows it only those, agrees with the kubelet's PodResources API, keeps one more pod
Pending with an Insufficient reason, hands a freed device to the next pod, and shows a pod that
requests no GPU none at all."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from gpukit.conformance.checks import Check
from gpukit.conformance.common import allocated_units, visible_uuids
from gpukit.conformance.fill import NodeFill, Seen
from gpukit.contracts.device_ids import strip_replica

pytestmark = pytest.mark.isolation


def _fill(suite: Any, node: str, resource: str, check: Check) -> NodeFill:
    f: NodeFill = suite.fill(node)
    if resource not in f.counts:
        check.record("devices to fill with (allocatable)", "> 0", 0, False, resource)
        check.verify()
    return f


def _running(f: NodeFill, resource: str, check: Check) -> list[Seen]:
    seen = f.running(resource)
    if not seen:
        check.record("filler pods Running", f.counts.get(resource, 0), 0, False, resource)
        check.verify()
    return seen


@pytest.mark.stages("fill")
@pytest.mark.per_resource("all")
def test_node_fills_to_capacity(gpukit_suite: Any, node: str, resource: str,
                                check: Check) -> None:
    """One pod per advertised device is admitted and starts."""
    f = _fill(gpukit_suite, node, resource, check)
    seen = f.fillers.get(resource, [])
    running = sum(s.requested for s in seen if s.state.state == "Running")
    check.equal("devices held by Running pods", f.counts[resource], running, resource)
    for s in seen:
        if s.state.state != "Running":
            check.record(f"pod {s.pod} (requests {s.requested})", "Running", str(s.state), False,
                         resource)
    check.verify()


@pytest.mark.stages("fill", "probe")
@pytest.mark.per_resource("all")
def test_devices_are_disjoint(gpukit_suite: Any, node: str, resource: str,
                              check: Check) -> None:
    """No device ID (and no whole device, unless time-sliced) goes to two containers."""
    f = _fill(gpukit_suite, node, resource, check)
    seen = _running(f, resource, check)
    probe = gpukit_suite.probe(node)
    if gpukit_suite.decl(node) is not None:  # declared sharing only: anything else overlaps
        shared = resource in gpukit_suite.shared_resources(node)
    else:
        shared = any("::" in i for s in seen for i in (s.kubelet_ids or ()))
    if all(s.kubelet_ids for s in seen):
        ids = Counter(i for s in seen for i in s.kubelet_ids or ())
        dup = sorted(i for i, n in ids.items() if n > 1)
        check.equal("device IDs given to more than one container (PodResources)", [], dup,
                    resource)
        check.equal("device IDs given out", f.counts[resource], sum(ids.values()), resource)
    else:
        check.record("PodResources device IDs of every container", "read",
                     f.podresources_error or "missing for some containers", False, resource)
    if not shared:
        units = Counter(u for s in seen for u in allocated_units(s, probe))
        dup = sorted(u for u, n in units.items() if n > 1)
        check.equal("physical devices shared by containers", [], dup, resource)
    check.verify()


@pytest.mark.stages("fill", "probe")
@pytest.mark.per_resource("all")
def test_containers_see_only_their_devices(gpukit_suite: Any, node: str, resource: str,
                                           check: Check) -> None:
    """NVIDIA_VISIBLE_DEVICES names exactly the container's devices, and its only GPU device
    nodes are those of its devices (of their parent GPU, for MIG devices), with the MIG
    capability nodes of its MIG devices and no others."""
    f = _fill(gpukit_suite, node, resource, check)
    probe = gpukit_suite.probe(node)
    shared = resource in gpukit_suite.shared_resources(node)
    for s in _running(f, resource, check):
        if s.error:
            check.record(f"pod {s.pod}: observe", "exec works", s.error, False, resource)
            continue
        units = allocated_units(s, probe)
        visible = sorted(set(visible_uuids(s, probe)))
        if not shared or s.requested == 1:
            check.equal(f"pod {s.pod}: devices in NVIDIA_VISIBLE_DEVICES",
                        s.requested if not shared else 1, len(visible), resource)
        if probe is not None:
            parents = {probe.parent(u) for u in units}
            want = sorted(f"/dev/nvidia{p.minor}" for p in parents if p is not None)
            if None in parents:
                check.record(f"pod {s.pod}: devices known to NVML on the node", units,
                             [u for u in units if probe.parent(u) is None], False, resource)
        else:  # without NVML on the node: one GPU node per whole GPU, 1+ for MIG devices
            whole = len([u for u in units if u.startswith("GPU-")])
            migs = len(units) - whole
            low, high = whole + min(migs, 1), whole + migs
            check.true(f"pod {s.pod}: number of GPU device nodes", low <= len(s.gpu_nodes) <= high,
                       str(low) if low == high else f"{low}..{high}", len(s.gpu_nodes), resource)
            continue
        check.equal(f"pod {s.pod}: GPU device nodes", want, sorted(s.gpu_nodes), resource)
        # A MIG device is usable only with the capability nodes of its GPU and compute
        # instance; a container gets those and no other (none for whole GPUs).
        caps = sorted({f"nvidia-cap{c}" for u in units if (m := probe.mig(u)) for c in m.caps})
        check.equal(f"pod {s.pod}: MIG capability nodes (/dev/nvidia-caps)", caps,
                    list(s.cap_entries), resource)
    check.verify()


@pytest.mark.stages("fill", "probe")
@pytest.mark.per_resource("all")
def test_kubelet_podresources_agrees(gpukit_suite: Any, node: str, resource: str,
                                     check: Check) -> None:
    """The kubelet's PodResources API lists each filler with the devices it saw, and the
    right number of them."""
    f = _fill(gpukit_suite, node, resource, check)
    probe = gpukit_suite.probe(node)
    if f.podresources_error:
        check.record("PodResources List", "an answer", f.podresources_error, False, resource)
        check.verify()
    for s in _running(f, resource, check):
        kubelet = list(s.kubelet_ids or ())
        check.equal(f"pod {s.pod}: device IDs in PodResources", s.requested, len(kubelet),
                    resource)
        check.equal(f"pod {s.pod}: PodResources devices vs container's view",
                    sorted(set(visible_uuids(s, probe))),
                    sorted({strip_replica(i) for i in kubelet}), resource)
    check.verify()


@pytest.mark.stages("fill")
@pytest.mark.per_resource("all")
def test_over_request_stays_pending(gpukit_suite: Any, node: str, resource: str,
                                    check: Check) -> None:
    """With every device taken, one more pod is not scheduled: Insufficient <resource>."""
    f = _fill(gpukit_suite, node, resource, check)
    extra = f.extra.get(resource)
    if extra is None:
        check.record("over-request pod", "created once the node was full",
                     "; ".join(f.errors.get(resource, [])) or "node not full", False, resource)
        check.verify()
    assert extra is not None
    check.equal(f"pod {extra.pod} requesting 1 more", "Unschedulable", extra.state.state,
                resource)
    check.true("scheduler's reason", f"Insufficient {resource}" in extra.state.message,
               f"... Insufficient {resource} ...", extra.state.message or extra.state.reason,
               resource)
    check.verify()


@pytest.mark.stages("fill", "probe")
@pytest.mark.per_resource("all")
def test_freed_devices_are_reused(gpukit_suite: Any, node: str, resource: str,
                                  check: Check) -> None:
    """Deleting one filler lets the Pending pod run, on exactly the freed device."""
    f = _fill(gpukit_suite, node, resource, check)
    reused, freed = f.reused.get(resource), f.freed.get(resource)
    if reused is None or freed is None:
        check.record("a freed device", "handed to the Pending pod", "; ".join(
            f.errors.get(resource, [])) or "no pod was Pending to take it", False, resource)
        check.verify()
    assert reused is not None and freed is not None
    check.equal(f"pod {reused.pod} after {freed.pod} was deleted", "Running",
                reused.state.state if not reused.state.message else str(reused.state), resource)
    if reused.state.state == "Running":
        if reused.kubelet_ids is not None and freed.kubelet_ids is not None:
            check.equal("device IDs it got (PodResources)", sorted(freed.kubelet_ids),
                        sorted(reused.kubelet_ids), resource)
        probe = gpukit_suite.probe(node)
        check.equal("device it sees", allocated_units(freed, probe),
                    sorted(set(visible_uuids(reused, probe))), resource)
    check.verify()


@pytest.mark.stages("fill")
def test_pod_without_gpu_sees_none(gpukit_suite: Any, node: str, check: Check) -> None:
    """A pod requesting no GPU (even with NVIDIA_VISIBLE_DEVICES=all, as CUDA images set it)
    gets no NVIDIA device node."""
    resources = gpukit_suite.resources(node)
    if not resources:
        check.skip("advertises no GPU resources")
    f: NodeFill = gpukit_suite.fill(node)
    s = f.nogpu
    assert s is not None
    check.equal(f"pod {s.pod}", "Running", str(s.state))
    if s.state.state == "Running":
        check.equal(f"pod {s.pod}: exec", "", s.error)
        check.equal(f"pod {s.pod}: /dev/nvidia* entries", [], list(s.dev_entries))
        check.equal(f"pod {s.pod}: /dev/nvidia-caps entries", [], list(s.cap_entries))
    check.verify()
