"""Discovery: each node is Ready and advertises exactly the declared resources, and its node
agent's served-vs-declared condition says so."""

from __future__ import annotations

from typing import Any

import pytest

from gpukit.conformance.checks import Check, fmt
from gpukit.conformance.common import (
    check_declaration_condition,
    need_decl,
    need_expected,
    need_node_agent,
)
from gpukit.contracts import label_names as ln
from gpukit.contracts import node_declaration as nd
from gpukit.k8s.nodes import allocatable, capacity
from gpukit.k8s.nodes import ready as node_ready

pytestmark = pytest.mark.discovery


def test_node_is_registered_and_ready(gpukit_suite: Any, node: str, check: Check) -> None:
    obj = gpukit_suite.listed_node(node)
    check.equal("registered in the cluster", "present", "present" if obj else "missing")
    if obj is not None:
        ready, why = node_ready(obj)
        check.equal("condition Ready", "True", "True" if ready else f"False ({why})")
    check.verify()


@pytest.mark.per_resource("all")
def test_capacity_and_allocatable(gpukit_suite: Any, node: str, resource: str,
                                  check: Check) -> None:
    """capacity and allocatable equal the declared GPUs x replicas (or the MIG layout);
    without an inventory, allocatable equals capacity (every device healthy)."""
    obj = gpukit_suite.listed_node(node)
    cap, alloc = capacity(obj).get(resource, 0), allocatable(obj).get(resource, 0)
    expected = gpukit_suite.expected_resources(node)
    if expected is None and gpukit_suite.decl(node) is not None:
        need_expected(gpukit_suite, node)
    if expected is not None:
        check.equal("capacity", expected.get(resource, 0), cap, resource)
        check.equal("allocatable", expected.get(resource, 0), alloc, resource)
    else:
        check.equal("allocatable (every device healthy)", cap, alloc, resource)
    check.verify()


def test_no_undeclared_resources(gpukit_suite: Any, node: str, check: Check) -> None:
    """No nvidia.com/* resource is advertised that the inventory does not declare."""
    expected = need_expected(gpukit_suite, node)
    obj = gpukit_suite.listed_node(node)
    advertised = {r: n for r, n in capacity(obj).items() if n > 0}
    check.equal("nvidia.com resources advertised", expected, advertised)
    check.verify()


@pytest.mark.stages("helper")
def test_kubelet_sees_the_same_devices(gpukit_suite: Any, node: str, check: Check) -> None:
    """The kubelet's PodResources GetAllocatableResources lists as many device IDs per resource
    as the node object's allocatable."""
    view, error = gpukit_suite.podresources(node)
    if view is None:
        check.record("PodResources GetAllocatableResources", "an answer", error, False)
        check.verify()
    obj = gpukit_suite.listed_node(node)
    alloc = {r: n for r, n in allocatable(obj).items() if n > 0}
    kubelet = {r: len(set(ids)) for r, ids in view.allocatable.items()
               if r.startswith(ln.RESOURCE_PREFIX) and ids}
    for resource in sorted(set(alloc) | set(kubelet)):
        check.equal("device IDs in the kubelet's PodResources API vs node allocatable",
                    alloc.get(resource, 0), kubelet.get(resource, 0), resource)
        ids = view.allocatable.get(resource, [])
        check.equal("device IDs are unique", len(ids), len(set(ids)), resource)
    check.verify()


def test_the_agent_s_declaration_condition_agrees(gpukit_suite: Any, node: str,
                                                  check: Check) -> None:
    """The node agent's condition GpuDeclarationMismatch says what the suite finds: True
    exactly while the node's allocatable differs from the declaration or its selected config is
    refused (nvidia.com/device-plugin.config.state=failed), False otherwise."""
    if need_decl(gpukit_suite, node).dra:
        check.skip("gpukit_gpu_allocation dra: no node agent (the dra area checks the DRA "
                   "plugin's GpuDeclarationMismatch condition)")
    need_node_agent(gpukit_suite, node, check, f"the condition {nd.CONDITION_TYPE}")
    expected = need_expected(gpukit_suite, node)
    obj = gpukit_suite.listed_node(node)
    served = {r: n for r, n in allocatable(obj).items() if n > 0}
    declared = {r: n for r, n in expected.items() if n > 0}
    refused = (obj.metadata.labels or {}).get(ln.DEVICE_PLUGIN_CONFIG_STATE) == (
        ln.CONFIG_STATE_FAILED)
    found = f"allocatable {fmt(served)}, declared {fmt(declared)}" + (
        ", config refused" if refused else "")
    check_declaration_condition(check, obj, served != declared or refused, found, "node agent")
    check.verify()
