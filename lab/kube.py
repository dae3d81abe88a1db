"""Small helpers over the kubernetes client for the lab's own checks."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch


def reported_after(node: Any, since: Any) -> bool:
    """The node object carries a status the kubelet reported after `since` (a UTC datetime):
    its resources are the kubelet's view since then, not an older report's."""
    for cond in node.status.conditions or []:
        if cond.type == "Ready" and cond.last_heartbeat_time is not None:
            return bool(cond.last_heartbeat_time > since)
    return False


def api(kubeconfig: Path) -> client.CoreV1Api:
    return client.CoreV1Api(config.new_client_from_config(config_file=str(kubeconfig)))


def wait_pod_phase(
    core: client.CoreV1Api, namespace: str, name: str, phases: set[str], timeout: float
) -> Any:
    """Watch one pod until it reaches one of `phases`; return the pod."""
    w = watch.Watch()
    deadline = time.monotonic() + timeout
    pod = core.read_namespaced_pod(name, namespace)
    if pod.status.phase in phases:
        return pod
    while time.monotonic() < deadline:
        for ev in w.stream(
            core.list_namespaced_pod,
            namespace,
            field_selector=f"metadata.name={name}",
            resource_version=pod.metadata.resource_version,
            timeout_seconds=max(1, int(deadline - time.monotonic())),
        ):
            pod = ev["object"]
            if pod.status.phase in phases:
                w.stop()
                return pod
    raise TimeoutError(
        f"pod {namespace}/{name} not in {sorted(phases)} after {timeout:.0f}s"
        f" (phase {pod.status.phase})"
    )
