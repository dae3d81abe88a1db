"""Watching objects until they get where a caller needs them."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from kubernetes import client, watch


def pod_phase(core: client.CoreV1Api, namespace: str, name: str, phases: set[str],
              timeout: float) -> Any:
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


def daemonset_rolled_out(api_client: Any, namespace: str, name: str, timeout: float,
                         poll: float = 1.0) -> Any:
    """Wait as `kubectl rollout status daemonset/<name>` does: the controller has seen the
    current spec, and every scheduled pod is updated and available. Returns the DaemonSet."""
    apps = client.AppsV1Api(api_client)
    deadline = time.monotonic() + timeout

    while True:
        ds = apps.read_namespaced_daemon_set(name, namespace)
        why: str | None = _rollout_pending(ds)
        if why is None:
            return ds
        if time.monotonic() >= deadline:
            raise TimeoutError(f"daemonset {namespace}/{name} not rolled out after "
                               f"{timeout:.0f}s: {why}")
        time.sleep(poll)


def _rollout_pending(ds: Any) -> str | None:
    """Why the DaemonSet's rollout is not done, or None."""
    st = ds.status
    if (st.observed_generation or 0) < (ds.metadata.generation or 0):
        return "the controller has not seen the new spec"
    want = st.desired_number_scheduled or 0
    if (st.updated_number_scheduled or 0) < want:
        return f"{st.updated_number_scheduled or 0} of {want} pods updated"
    if (st.number_available or 0) < want:
        return f"{st.number_available or 0} of {want} pods available"
    return None


def gone(lister: Callable[..., Any], args: tuple[Any, ...], selector: str,
         timeout: float) -> bool:
    """Watch what `lister(*args, field_selector=selector)` lists until it is deleted; True
    once nothing is listed, False after `timeout` (relisting when a watch expires)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        listing = lister(*args, field_selector=selector)
        if not listing.items:
            return True
        w = watch.Watch()
        for ev in w.stream(lister, *args, field_selector=selector,
                           resource_version=listing.metadata.resource_version,
                           timeout_seconds=max(1, int(deadline - time.monotonic()))):
            if ev["type"] == "DELETED":
                w.stop()
                return True
    return False
