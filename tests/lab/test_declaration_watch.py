"""Served vs declared on the lab (issue 30): the node agent compares what it serves with its
node's declaration and says so at once where operators look, on the real API server: the node
condition GpuDeclarationMismatch (through its narrowly admitted status patch), an Event on the
node, and the gauges gpukit_node_gpus_declared/served; all cleared on recovery.

Faults: a GPU lost (the mock's `lose`, NVML_ERROR_GPU_IS_LOST on every query) and a config
fallback (the node's config label names a config the ConfigMap lacks: refused, the running one
kept). gpu-t4 (2 T4s) is declared with config `default`: 2 nvidia.com/gpu.
"""

from __future__ import annotations

import re
import textwrap
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from kubernetes import client
from labtools import (
    agent_http,
    clear_declaration_condition,
    declaration_condition,
    declaration_events,
    wait_for,
)

from gpukit.agent_manifests import AgentDeployment
from gpukit.contracts import label_names as ln
from gpukit.contracts import node_declaration as nd
from gpukit.k8s import connect
from gpukit.lab import agent, cluster, nodes
from gpukit.lab.config import load_spec
from gpukit.lab.controlplane import paths

pytestmark = pytest.mark.lab

NODE = "gpu-t4"
GPU = ln.GPU_RESOURCE
CONFIGS: dict[str, dict[str, Any]] = {
    "default": {"version": "v1", "flags": {"migStrategy": "none",
                                           "plugin": {"passDeviceSpecs": True}}},
}
DECLARED = {NODE: nd.NodeDeclaration(NODE, {GPU: 2}, "default").as_dict()}


@pytest.fixture(scope="module")
def core(lab_cluster: object) -> client.CoreV1Api:
    return connect.core(paths().admin_kubeconfig)


@pytest.fixture(scope="module")
def deployed(core: client.CoreV1Api) -> Iterator[AgentDeployment]:
    spec = load_spec()
    d = agent.lab_deployment(CONFIGS, default_config="default",
                             GPUKIT_HEALTH_PROBE_INTERVAL_SECONDS="1",
                             GPUKIT_RECOVERY_SECONDS="2")
    d = replace(d, declarations=DECLARED, node_selector={"kubernetes.io/hostname": NODE})
    clear_declaration_condition(core, NODE)
    # The declared config selected (a site.yml run before leaves the lab's `time-sliced`).
    before = (core.read_node(NODE).metadata.labels or {}).get(ln.DEVICE_PLUGIN_CONFIG)
    set_config(core, "default")
    try:
        agent.apply(spec, d)
        agent.wait_rolled_out(spec, d, timeout=120)
        yield d
    finally:
        agent.remove(spec, d)
        set_config(core, before)
        clear_declaration_condition(core, NODE)


def set_config(core: client.CoreV1Api, name: str | None) -> None:
    core.patch_node(NODE, {"metadata": {"labels": {ln.DEVICE_PLUGIN_CONFIG: name}}})


def condition(core: client.CoreV1Api) -> client.V1NodeCondition | None:
    return declaration_condition(core, NODE)


def reason_is(core: client.CoreV1Api, status: str, reason: str) -> client.V1NodeCondition | None:
    c = condition(core)
    return c if c is not None and (c.status, c.reason) == (status, reason) else None


def events(core: client.CoreV1Api, reason: str) -> list[str]:
    return declaration_events(core, NODE, reason)


def gauges() -> tuple[float | None, float | None]:
    status, body = agent_http(NODE, "/metrics")
    assert status == 200, body

    def value(name: str) -> float | None:
        m = re.search(rf'^{name}\{{resource="nvidia.com/gpu"\}} (\S+)$', body, re.M)
        return float(m.group(1)) if m else None

    return value("gpukit_node_gpus_declared"), value("gpukit_node_gpus_served")


def explain(core: client.CoreV1Api) -> str:
    return f"condition: {condition(core)}\n{agent.diagnose(load_spec(), NODE)}"


def served_again(core: client.CoreV1Api, since: int) -> None:
    """Cleared: condition False with its reason, a Normal Event, the gauges equal."""
    wait_for("condition cleared", lambda: reason_is(core, "False", nd.REASON_OK), timeout=30,
             explain=lambda: explain(core))
    assert condition(core).message == f"node {NODE} serves its declaration: {GPU} 2"  # type: ignore[union-attr]
    wait_for("cleared Event", lambda: len(events(core, nd.EVENT_CLEARED)) > since, timeout=10)
    wait_for("gauges equal", lambda: gauges() == (2, 2), timeout=10)


def test_a_node_serving_its_declaration_says_so(
        core: client.CoreV1Api, deployed: AgentDeployment) -> None:
    wait_for("condition False", lambda: reason_is(core, "False", nd.REASON_OK), timeout=60,
             explain=lambda: explain(core))
    assert gauges() == (2, 2)


def test_a_lost_gpu_raises_condition_event_and_gauge_within_seconds_and_recovery_clears(
        core: client.CoreV1Api, deployed: AgentDeployment) -> None:
    wait_for("condition False", lambda: reason_is(core, "False", nd.REASON_OK), timeout=60)
    cleared_before = len(events(core, nd.EVENT_CLEARED))
    spec = load_spec()
    start = time.monotonic()
    nodes.nvml_cli(spec.node(NODE), "lose", "--gpu", "1")
    try:
        c = wait_for("condition True", lambda: reason_is(core, "True", nd.REASON_DEVICES),
                     timeout=30, explain=lambda: explain(core))
        raised = time.monotonic() - start
        assert c.message == f"node {NODE}: {GPU} declared 2, served 1"
        wait_for("mismatch Event", lambda: c.message in events(core, nd.EVENT_MISMATCH),
                 timeout=10)
        assert gauges() == (2, 1)
        assert raised < 15, f"the condition took {raised:.1f}s"
    finally:
        nodes.nvml_cli(spec.node(NODE), "restore", "--gpu", "1")
    served_again(core, cleared_before)


def test_a_config_fallback_raises_them_and_the_declared_config_clears_them(
        core: client.CoreV1Api, deployed: AgentDeployment) -> None:
    wait_for("condition False", lambda: reason_is(core, "False", nd.REASON_OK), timeout=60)
    cleared_before = len(events(core, nd.EVENT_CLEARED))
    set_config(core, "no-such")
    try:
        c = wait_for("condition True", lambda: reason_is(core, "True", nd.REASON_CONFIG),
                     timeout=30, explain=lambda: explain(core))
        assert c.message.startswith(f"node {NODE}: config 'default' declared, refused (")
        assert "'no-such' names no config" in c.message
        wait_for("mismatch Event", lambda: c.message in events(core, nd.EVENT_MISMATCH),
                 timeout=10)
        assert gauges() == (2, 2)  # the GPUs are still served: the config is what differs
    finally:
        set_config(core, "default")
    served_again(core, cleared_before)


def _status_patch_from_agent(core: client.CoreV1Api, d: AgentDeployment, target: str,
                             patch: dict[str, Any]) -> str:
    """Patch `target`'s status with the agent's own credentials, from its pod on NODE."""
    pod = next(p.metadata.name for p in core.list_namespaced_pod(d.namespace).items
               if p.spec.node_name == NODE)
    code = textwrap.dedent(f"""
        from kubernetes import client, config
        config.load_incluster_config()
        try:
            client.CoreV1Api().patch_node_status({target!r}, {patch!r})
            print("ALLOWED")
        except client.ApiException as e:
            print("DENIED", e.status, e.body)
    """)
    return cluster.kubectl(load_spec(), "-n", d.namespace, "exec", pod, "--", "python3", "-c",
                           code)


def test_the_agent_may_set_only_its_own_node_s_condition(
        core: client.CoreV1Api, deployed: AgentDeployment) -> None:
    def condition_patch(kind: str) -> dict[str, Any]:
        return {"status": {"conditions": [{"type": kind, "status": "False", "reason": "Probe",
                                           "message": "probe"}]}}

    other = _status_patch_from_agent(core, deployed, "gpu-a100",
                                     condition_patch(nd.CONDITION_TYPE))
    assert other.startswith("DENIED") and "only the node its pod runs on" in other, other
    ready = _status_patch_from_agent(core, deployed, NODE, condition_patch("Ready"))
    assert ready.startswith("DENIED") and f"only the {nd.CONDITION_TYPE} condition" in ready
    capacity = _status_patch_from_agent(core, deployed, NODE,
                                        {"status": {"capacity": {"nvidia.com/gpu": "99"}}})
    assert capacity.startswith("DENIED") and "nothing of a node's status" in capacity, capacity
    assert core.read_node(NODE).status.capacity.get("nvidia.com/gpu") != "99"
