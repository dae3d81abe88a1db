"""Restart stability (opt-in: --disruptive, it restarts the node's kubelet): a running pod keeps
the devices it was given, as the kubelet's e2e device plugin tests assert, after its container
restarts and after a kubelet restart (which makes every device plugin register again), both in
the container and in the kubelet's PodResources API. The node's GPU resources come back to the
declared counts after the restart."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import pytest

from gpukit.conformance import expect
from gpukit.conformance.checks import Check
from gpukit.conformance.cluster import PodState, pod_manifest
from gpukit.conformance.common import need_decl, need_host
from gpukit.contracts import label_names as ln
from gpukit.k8s.nodes import allocatable, ready, reported_after

pytestmark = [pytest.mark.restarts, pytest.mark.exclusive]

# PID 1 exits 3 on SIGTERM (a `kill 1` from an exec restarts the container), else holds.
HOLD = 'trap "exit 3" TERM; while :; do sleep 1; done'
# What the container sees of its devices: the device nodes and what the runtime was told.
SEEN = ('ls /dev | grep -E "^nvidia[0-9]+$" | sort | tr "\\n" " "; '
        'echo "| NVIDIA_VISIBLE_DEVICES=${NVIDIA_VISIBLE_DEVICES-<unset>}"')


def _running(restarts: int) -> Any:
    def done(s: PodState) -> bool:
        statuses = (s.pod.status.container_statuses or []) if s.pod is not None else []
        return s.state == "Running" and any(
            c.restart_count >= restarts and c.ready for c in statuses)
    return done


@pytest.mark.stages("probe", "release", "helper")
def test_a_pod_keeps_its_devices_across_restarts(gpukit_suite: Any, node: str,
                                                 check: Check) -> None:
    suite = gpukit_suite
    decl = need_decl(suite, node)
    need_host(suite, node)
    if decl.dra:
        check.skip("gpukit_gpu_allocation dra: no device plugin resource to hold")
    declared = {r: n for r, n in expect.expected_resources(decl).items() if n > 0}
    if not declared:
        check.skip("declares no GPU resources")
    resource = sorted(declared, key=lambda r: (r != ln.GPU_RESOURCE, r))[0]
    kube, ns = suite.kube, suite.namespace
    name = suite.pod_name("restarts", node, resource)
    kube.create_pod(ns, pod_manifest(
        name, run_id=kube.run_id, role="restarts", node=node, image=suite.options.shell_image,
        command=["sh", "-c", HOLD], limits={resource: 1}, restart="Always",
        host_network=suite.options.host_network))
    timeout = suite.options.pod_timeout

    def seen(when: str) -> tuple[str, list[str]]:
        got = kube.exec(ns, name, ["sh", "-c", SEEN])
        view, error = suite.podresources(node)
        ids = sorted(view.devices(ns, name).get(resource, [])) if view else [error]
        check.record(f"{when}: the container answers", "rc 0", f"rc {got.rc}", got.rc == 0)
        return got.stdout.strip(), ids

    try:
        state = kube.wait_pods(ns, [name], timeout, done=_running(0), node=node)[name]
        check.equal(f"pod holding 1 {resource}", "Running", str(state), resource)
        check.verify()
        first_dev, first_ids = seen("at start")
        check.true("devices in PodResources", len(first_ids) == 1, "1 ID", first_ids, resource)
        # The container restarts (its PID 1 exits): the kubelet gives it the same devices.
        kube.exec(ns, name, ["sh", "-c", "kill 1"])
        state = kube.wait_pods(ns, [name], timeout + 30, done=_running(1), node=node)[name]
        check.equal("after a container restart: pod", "Running (restarted)",
                    "Running (restarted)" if _running(1)(state) else str(state), resource)
        check.verify()
        dev, ids = seen("after a container restart")
        check.equal("after a container restart: devices in the container", first_dev, dev,
                    resource)
        check.equal("after a container restart: devices in PodResources", first_ids, ids,
                    resource)
        # The kubelet restarts: the plugins register again, the pod keeps its devices.
        since = dt.datetime.now(dt.UTC).replace(microsecond=0)
        out = suite.host(node).run("systemctl restart kubelet")
        check.equal("systemctl restart kubelet", 0, out.rc)
        check.verify()
        back = _wait_served(suite, node, declared, since, timeout + 60)
        check.equal("after a kubelet restart: allocatable (the plugins registered again)",
                    declared, back, resource)
        state = kube.wait_pods(ns, [name], timeout, done=_running(1), node=node)[name]
        check.equal("after a kubelet restart: pod", "Running", state.state, resource)
        check.verify()
        dev, ids = seen("after a kubelet restart")
        check.equal("after a kubelet restart: devices in the container", first_dev, dev, resource)
        check.equal("after a kubelet restart: devices in PodResources", first_ids, ids, resource)
    finally:
        kube.delete_pods(ns, [name], timeout, node=node)
    check.verify()


def _wait_served(suite: Any, node: str, declared: dict[str, int], since: dt.datetime,
                 timeout: float) -> dict[str, int]:
    """The node's GPU allocatable once the kubelet reported after `since` with the declared
    counts (or what it shows at the deadline)."""
    deadline = time.monotonic() + timeout
    seen: dict[str, int] = {}
    while time.monotonic() < deadline:
        obj = suite.kube.node(node)
        if obj is not None:
            seen = {r: n for r, n in allocatable(obj).items() if n > 0}
            if ready(obj)[0] and reported_after(obj, since) and seen == declared:
                return seen
        time.sleep(2)
    return seen
