"""Tenancy: the GPU quotas, LimitRanges and PriorityClasses the inventory declares
(gpukit_gpu_quotas, gpukit_gpu_limit_ranges, gpukit_gpu_priority_classes) hold in the cluster.

Read from the API as any quota is, not by gpukit's object names: a declared namespace's quotas
cap each declared resource at the declared count; pods up to the quota are admitted and the
quota's used count equals the GPU requests of the namespace's live pods; one more is refused by
the apiserver with the quota error naming the resource; a container naming no GPU gets the
declared default, one above the declared max is refused; each class exists as declared. Test
pods go into the declared namespaces with the run's labels and are deleted by the test (and by
the run's cleanup of labelled pods)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpukit.conformance.checks import Check
from gpukit.conformance.cluster import pod_manifest
from gpukit.conformance.fill import HOLD
from gpukit.conformance.plugin import get_suite
from gpukit.inventory.quotas import LimitRangeDecl, NamespaceQuota, PriorityClassDecl, Tenancy

pytestmark = pytest.mark.tenancy

QUOTA_PREFIX = "requests."


def _tenancy(config: pytest.Config) -> Tenancy:
    suite = get_suite(config)
    return suite.inventory.tenancy if suite.inventory is not None else Tenancy()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """One case per declared namespace quota (and resource), LimitRange, PriorityClass."""
    names = metafunc.fixturenames
    if not {"quota", "limit_range", "priority_class"} & set(names):
        return
    t = _tenancy(metafunc.config)
    if "quota" in names and "quota_resource" in names:
        pairs = [(q, r) for q in t.quotas for r in sorted(q.hard)]
        metafunc.parametrize(["quota", "quota_resource"], pairs,
                             ids=[f"{q.namespace}-{r}" for q, r in pairs])
    elif "quota" in names:
        metafunc.parametrize("quota", t.quotas, ids=[q.namespace for q in t.quotas])
    if "limit_range" in names:
        metafunc.parametrize("limit_range", t.limit_ranges,
                             ids=[lr.namespace for lr in t.limit_ranges])
    if "priority_class" in names:
        metafunc.parametrize("priority_class", t.priority_classes,
                             ids=[pc.name for pc in t.priority_classes])


def _hard(core: Any, namespace: str) -> dict[str, list[tuple[str, str]]]:
    """Quota key -> [(quota name, hard)] over the namespace's ResourceQuotas."""
    out: dict[str, list[tuple[str, str]]] = {}
    for rq in core.list_namespaced_resource_quota(namespace).items:
        for key, value in ((rq.spec and rq.spec.hard) or {}).items():
            out.setdefault(key, []).append((rq.metadata.name, str(value)))
    return out


def _used(core: Any, namespace: str, key: str) -> int | None:
    """The lowest `used` any quota of the namespace reports for `key` (None: not yet)."""
    found = [int(str((rq.status.used or {})[key]))
             for rq in core.list_namespaced_resource_quota(namespace).items
             if rq.status and key in (rq.status.used or {})]
    return min(found) if found else None


def _live_requests(core: Any, namespace: str, resource: str) -> int:
    """What the quota counts: the requests (or limits, which extended resources equal) of
    `resource` over the namespace's pods not yet Succeeded or Failed."""
    total = 0
    for pod in core.list_namespaced_pod(namespace).items:
        if pod.status and pod.status.phase in ("Succeeded", "Failed"):
            continue
        for c in pod.spec.containers:
            res = c.resources
            amounts = (res and (res.requests or res.limits)) or {}
            total += int(str(amounts.get(resource, 0)))
    return total


def _node_serving(suite: Any, resource: str) -> str | None:
    """The node serving the most of `resource`, as the inventory declares it."""
    best = max(((suite.expected_resources(n) or {}).get(resource, 0), n)
               for n in suite.targets())
    return best[1] if best[0] > 0 else None


def _pod(suite: Any, name: str, node: str, limits: dict[str, int] | None) -> dict[str, Any]:
    body = pod_manifest(name, run_id=suite.kube.run_id, role="tenancy", node=node,
                        image=suite.options.shell_image, command=["sh", "-c", HOLD],
                        limits=limits, host_network=suite.options.host_network)
    # The namespace is the team's: its default ServiceAccount, no token.
    body["spec"]["serviceAccountName"] = "default"
    return body


@pytest.fixture
def pods(gpukit_suite: Any) -> Iterator[tuple[list[str], list[str]]]:
    """(namespace, names) of the pods a test created, deleted afterwards."""
    made: tuple[list[str], list[str]] = ([], [])
    yield made
    ns_names: dict[str, list[str]] = {}
    for ns, name in zip(*made, strict=True):
        ns_names.setdefault(ns, []).append(name)
    for ns, names in ns_names.items():
        gpukit_suite.kube.delete_pods(ns, names, gpukit_suite.options.pod_timeout)


def test_quota_caps_each_declared_resource(gpukit_suite: Any, quota: NamespaceQuota,
                                           check: Check) -> None:
    """The namespace's ResourceQuotas hold every declared hard limit."""
    core = gpukit_suite.kube.core
    try:
        hard = _hard(core, quota.namespace)
    except ApiException as exc:
        check.record(f"namespace {quota.namespace}: ResourceQuotas", "readable",
                     f"{exc.status} {exc.reason}", False)
        check.verify()
        return
    for key, expected in quota.quota_hard().items():
        observed = sorted({h for _, h in hard.get(key, [])})
        check.equal(f"namespace {quota.namespace}: quota hard limit", [expected], observed,
                    key)
    check.verify()


def test_quota_admits_up_to_its_limit_and_refuses_one_more(
        gpukit_suite: Any, quota: NamespaceQuota, quota_resource: str, check: Check,
        pods: tuple[list[str], list[str]]) -> None:
    """Pods up to the quota (one unit each, beside what already runs there) are admitted and
    run; the quota's used count equals the live pods' requests; one more is refused with the
    quota error naming the resource."""
    suite, ns, resource = gpukit_suite, quota.namespace, quota_resource
    key = QUOTA_PREFIX + resource
    core = suite.kube.core
    node = _node_serving(suite, resource)
    if node is None:
        check.skip(f"no GPU node of the inventory serves {resource}")
    assert node is not None
    room = quota.hard[resource] - _live_requests(core, ns, resource)
    names = [suite.pod_name("tenancy", node, resource, str(i)) for i in range(max(room, 0))]
    for name in names:
        try:
            suite.kube.create_pod(ns, _pod(suite, name, node, {resource: 1}))
        except ApiException as exc:
            check.record(f"namespace {ns}: pod {name} within the quota", "admitted",
                         f"{exc.status} {_message(exc)}", False, key)
            check.verify()
        pods[0].append(ns)
        pods[1].append(name)
    states = suite.kube.wait_pods(ns, names, suite.options.pod_timeout)
    for name in names:
        check.equal(f"namespace {ns}: pod {name} within the quota", "Running",
                    str(states[name].state), key)
    live = _live_requests(core, ns, resource)
    check.equal(f"namespace {ns}: live pods' requests", quota.hard[resource], live, key)
    check.equal(f"namespace {ns}: quota used", live, _settled_used(core, ns, key, live), key)
    extra = suite.pod_name("tenancy", node, resource, "over")
    try:
        suite.kube.create_pod(ns, _pod(suite, extra, node, {resource: 1}))
    except ApiException as exc:
        text = _message(exc)
        check.equal(f"namespace {ns}: one pod beyond the quota: status", 403, exc.status, key)
        check.true(f"namespace {ns}: one pod beyond the quota: message",
                   "exceeded quota" in text and f"requested: {key}=1" in text,
                   f"exceeded quota: ..., requested: {key}=1, ...", text, key)
    else:
        pods[0].append(ns)
        pods[1].append(extra)
        check.record(f"namespace {ns}: one pod beyond the quota", "refused (403 exceeded "
                     "quota)", "admitted", False, key)
    check.verify()


def _settled_used(core: Any, namespace: str, key: str, expected: int) -> int | None:
    """The quota controller updates `used` at admission and on its resync: read until it
    equals `expected` or 30 s passed."""
    deadline = time.monotonic() + 30
    used = _used(core, namespace, key)
    while used != expected and time.monotonic() < deadline:
        time.sleep(1)
        used = _used(core, namespace, key)
    return used


def _message(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or "{}").get("message") or exc.body)
    except ValueError:
        return str(exc.body)


def _dry_run(suite: Any, namespace: str, body: dict[str, Any]) -> Any:
    """The pod as admission leaves it (LimitRange defaults applied), nothing created."""
    return suite.kube.core.create_namespaced_pod(namespace, body, dry_run="All")


def test_limit_range_defaults_and_caps_gpu_containers(
        gpukit_suite: Any, limit_range: LimitRangeDecl, check: Check) -> None:
    """A container naming no GPU gets the declared default (0 where only a max is declared);
    one asking above the max is refused naming the resource. Dry runs: nothing is created."""
    suite, ns = gpukit_suite, limit_range.namespace
    node = suite.targets()[0]
    name = suite.pod_name("tenancy-limits", node)
    try:
        pod = _dry_run(suite, ns, _pod(suite, name, node, None))
        limits = pod.spec.containers[0].resources.limits or {}
    except ApiException as exc:
        check.record(f"namespace {ns}: a pod naming no GPU", "admitted",
                     f"{exc.status} {_message(exc)}", False)
        check.verify()
        return
    for resource, fields in sorted(limit_range.limits.items()):
        if "default" in fields or "max" in fields:
            check.equal(f"namespace {ns}: default limit of a container naming none",
                        str(fields.get("default", 0)), limits.get(resource), resource)
        if "max" in fields:
            over = fields["max"] + 1
            try:
                _dry_run(suite, ns, _pod(suite, name, node, {resource: over}))
            except ApiException as exc:
                text = _message(exc)
                check.true(f"namespace {ns}: a container asking {over}: refused",
                           exc.status == 403 and f"maximum {resource} usage per Container is "
                           f"{fields['max']}" in text,
                           f"403 maximum {resource} usage per Container is {fields['max']}",
                           f"{exc.status} {text}", resource)
            else:
                check.record(f"namespace {ns}: a container asking {over}", "refused",
                             "admitted", False, resource)
    check.verify()


def test_priority_class_as_declared(gpukit_suite: Any, priority_class: PriorityClassDecl,
                                    check: Check) -> None:
    """The class exists with the declared value, preemption policy and description, and is not
    the cluster's default."""
    api = client.SchedulingV1Api(gpukit_suite.kube.api_client)
    pc = priority_class
    try:
        found = api.read_priority_class(pc.name)
    except ApiException as exc:
        check.record(f"PriorityClass {pc.name}", "present", f"{exc.status} {exc.reason}", False)
        check.verify()
        return
    check.equal(f"PriorityClass {pc.name}: value", pc.value, found.value)
    check.equal(f"PriorityClass {pc.name}: preemptionPolicy", pc.preemption_policy,
                found.preemption_policy)
    check.equal(f"PriorityClass {pc.name}: description", pc.description,
                found.description or "")
    check.equal(f"PriorityClass {pc.name}: globalDefault", False, bool(found.global_default))
    check.verify()
