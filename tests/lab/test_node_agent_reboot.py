"""A node running the node agent reboots as fast as one without it.

The driver role reboots nodes with `systemctl reboot`. The agent's container outlives
containerd's unit, so systemd-shutdown's last pass (SIGSTOP, SIGTERM, SIGCONT to every
remaining process, then up to 90 s before SIGKILL) is what stops it: an agent that missed
that SIGTERM held each reboot for 90 s.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from kubernetes import client
from labtools import wait_for

from gpukit.agent_manifests import AgentDeployment
from gpukit.k8s import connect
from gpukit.lab import agent, cgroups, cluster
from gpukit.lab.config import NodeSpec, load_spec
from gpukit.lab.controlplane import paths

pytestmark = pytest.mark.lab

# Without the agent the lab node's shutdown takes about a second; the hang was 90 s.
SHUTDOWN_BOUND_SECONDS = 20.0
CONFIGS = {"default": {"version": "v1", "flags": {"migStrategy": "none"}}}


def diagnose(node: str) -> Callable[[], str]:
    return lambda: agent.diagnose(load_spec(), node)


def agent_pids(node: NodeSpec) -> list[int]:
    found = []
    for pid in cgroups.procs(node.name):
        try:
            if b"gpukit.plugin" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            pass
    return found


def node_ready(core: client.CoreV1Api, node: str) -> bool:
    try:
        conditions = core.read_node(node).status.conditions or []
    except client.ApiException:
        return False
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def agent_pods(core: client.CoreV1Api, node: str) -> list[client.V1Pod]:
    return list(core.list_namespaced_pod(
        "gpukit-system", field_selector=f"spec.nodeName={node}",
        label_selector="app.kubernetes.io/name=gpukit-node-agent",
    ).items)  # fmt: skip


def agent_serving(core: client.CoreV1Api, node: str) -> bool:
    """Started up and waiting for signals (gpukit.plugin.signals logs this line)."""
    for pod in agent_pods(core, node):
        try:
            log = core.read_namespaced_pod_log(pod.metadata.name, "gpukit-system")
        except client.ApiException:
            continue
        if "running: SIGHUP reloads the config" in log:
            return True
    return False


def agent_started_since(core: client.CoreV1Api, node: str, since: datetime) -> bool:
    """The node's agent pod is Ready with a container started after `since` (whole seconds)."""
    for pod in agent_pods(core, node):
        ready = any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])
        for cs in pod.status.container_statuses or []:
            running = cs.state.running if cs.state else None
            if ready and running is not None and running.started_at > since:
                return True
    return False


@pytest.fixture(scope="module")
def deployed(lab_cluster: object) -> Iterator[AgentDeployment]:
    spec = load_spec()
    d = agent.lab_deployment(CONFIGS, default_config="default")
    try:
        agent.apply(spec, d)
        agent.wait_rolled_out(spec, d, timeout=120)
        yield d
    finally:
        agent.remove(spec, d)


def test_a_node_running_the_agent_reboots_promptly(deployed: AgentDeployment) -> None:
    spec = load_spec()
    node = spec.nodes[-1]
    core = connect.core(paths().admin_kubeconfig)
    assert node_ready(core, node.name)
    wait_for(f"the agent serving on {node.name}", lambda: agent_serving(core, node.name), 120,
             explain=diagnose(node.name))
    assert agent_pids(node), f"the agent is not running on {node.name}"
    init = cluster.init_proc(node)
    assert init is not None

    wall0 = datetime.now(UTC).replace(microsecond=0)
    t0 = time.monotonic()
    try:
        cluster.node_exec(node, ["systemctl", "reboot"], timeout=30)
    except subprocess.TimeoutExpired:
        pass  # the node may go away under the command
    deadline = t0 + 120
    while init.alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    took = time.monotonic() - t0
    assert not init.alive(), f"{node.name} still shutting down after {took:.0f}s"

    # Back as before (checked first, so that a slow shutdown leaves the lab usable): the node
    # Ready, a new agent Ready on it.
    wait_for(f"a new agent on {node.name}",
             lambda: agent_started_since(core, node.name, wall0), 120,
             explain=diagnose(node.name))  # fmt: skip
    wait_for(f"{node.name} to be Ready", lambda: node_ready(core, node.name), 60,
             explain=diagnose(node.name))
    assert agent_pids(node)
    assert took < SHUTDOWN_BOUND_SECONDS, (
        f"{node.name} took {took:.1f}s to shut down with the agent running"
        " (systemd-shutdown waited for a process that ignored its SIGTERM)"
    )

