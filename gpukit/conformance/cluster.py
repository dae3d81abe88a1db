"""The suite's cluster operations: the run's namespace, pods, bounded watches, exec.

Every wait is a watch with a deadline (relisting when the watch expires); nothing sleeps
blindly. Objects are the kubernetes client's models; manifests are plain dicts.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException
from kubernetes.stream import stream

from gpukit.contracts import label_names as ln
from gpukit.k8s import connect, waits
from gpukit.k8s.names import dns_name

log = logging.getLogger(__name__)

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "gpukit-conformance"
RUN_LABEL = ln.CONFORMANCE_RUN
ROLE_LABEL = ln.CONFORMANCE_ROLE
NODE_LABEL = ln.CONFORMANCE_NODE
EXPIRES = ln.CONFORMANCE_EXPIRES
WORKLOAD_SA = "gpukit-conformance-workload"

_BAD_STATES = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerError",
               "CreateContainerConfigError", "CrashLoopBackOff", "RunContainerError")


def load_api_client(kubeconfig: str | None) -> Any:
    """An ApiClient from a kubeconfig, else $KUBECONFIG/~/.kube/config, else in-cluster."""
    return connect.api_client(kubeconfig)


@dataclass
class PodState:
    """Where a pod got to: Running, Succeeded, Failed, Unschedulable, Deleted, Error, Pending."""

    name: str
    state: str
    reason: str = ""
    message: str = ""
    pod: Any = None

    def __str__(self) -> str:
        extra = ": ".join(x for x in (self.reason, self.message) if x)
        return f"{self.state} ({extra})" if extra else self.state


def classify(pod: Any) -> PodState:
    """The state of a pod as the suite cares about it; `Pending` means keep waiting."""
    name = pod.metadata.name
    status = pod.status
    phase = status.phase if status else None
    if phase == "Failed":
        return PodState(name, "Failed", status.reason or "", status.message or "", pod)
    if phase == "Succeeded":
        return PodState(name, "Succeeded", pod=pod)
    statuses = (status.container_statuses or []) if status else []
    if phase == "Running" and statuses and all(s.state and s.state.running for s in statuses):
        return PodState(name, "Running", pod=pod)
    for s in statuses:
        waiting = s.state.waiting if s.state else None
        if waiting and waiting.reason in _BAD_STATES:
            return PodState(name, "Error", waiting.reason, waiting.message or "", pod)
    for cond in (status.conditions or []) if status else []:
        unschedulable = cond.status == "False" and cond.reason == "Unschedulable"
        if cond.type == "PodScheduled" and unschedulable:
            return PodState(name, "Unschedulable", cond.reason, cond.message or "", pod)
    return PodState(name, "Pending", phase or "", "", pod)


@dataclass
class ExecResult:
    rc: int
    stdout: str
    stderr: str


@dataclass
class Kube:
    """The cluster as the suite uses it."""

    api_client: Any
    runtime_class: str | None = None  # every pod's (--runtime-class): wins over the nodes'
    # A node's pods' RuntimeClass (by its NODE_LABEL value; None: the node's default runtime),
    # as the inventory says users' GPU pods run there (conformance.runtime_path).
    node_runtime_classes: Mapping[str, str | None] = field(default_factory=dict)
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    _exec_clients: threading.local = field(default_factory=threading.local)

    def __post_init__(self) -> None:
        self.core = client.CoreV1Api(self.api_client)

    def _exec_core(self) -> Any:
        """`stream` swaps the transport of the ApiClient it is given while it runs: each
        thread (the tests', the node workers') execs through an ApiClient of its own."""
        core = getattr(self._exec_clients, "core", None)
        if core is None:
            core = self._exec_clients.core = client.CoreV1Api(_clone(self.api_client))
        return core

    # ---- nodes

    def nodes(self) -> dict[str, Any]:
        return {n.metadata.name: n for n in self.core.list_node().items}

    def node(self, name: str) -> Any | None:
        try:
            return self.core.read_node(name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def resource_slices(self) -> list[dict[str, Any]]:
        """Every ResourceSlice of the cluster, as the API has them (plain JSON)."""
        resp = client.ResourceV1Api(self.api_client).list_resource_slice(_preload_content=False)
        items: list[dict[str, Any]] = json.loads(resp.data)["items"]
        return items

    def runtime_classes(self) -> dict[str, str]:
        """RuntimeClass name -> handler."""
        items = client.NodeV1Api(self.api_client).list_runtime_class().items
        return {rc.metadata.name: rc.handler for rc in items}

    # ---- namespace

    def create_namespace(self, name: str, ttl: dt.timedelta) -> None:
        expires = (dt.datetime.now(dt.UTC) + ttl).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {
                "name": name,
                "labels": {
                    MANAGED_BY: MANAGER, RUN_LABEL: self.run_id,
                    # Test pods read the kubelet's PodResources socket and the lab's driver
                    # files through hostPath: that is the privileged level.
                    "pod-security.kubernetes.io/enforce": "privileged",
                },
                "annotations": {EXPIRES: expires},
            },
        }
        self.core.create_namespace(body)

    def ensure_workload_account(self, namespace: str) -> None:
        """The ServiceAccount test pods run as: no token, no role bound: no API access."""
        body = {
            "apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": WORKLOAD_SA, "namespace": namespace,
                         "labels": {MANAGED_BY: MANAGER}},
            "automountServiceAccountToken": False,
        }
        try:
            self.core.read_namespaced_service_account(WORKLOAD_SA, namespace)
            return  # made by the deploy manifest (the in-cluster runner may only read it)
        except ApiException as exc:
            if exc.status != 404:
                raise
        try:
            self.core.create_namespaced_service_account(namespace, body)
        except ApiException as exc:
            if exc.status != 409:
                raise

    def delete_namespace(self, name: str, timeout: float) -> bool:
        """Delete and wait (bounded; 0: do not wait) until it is gone; True when gone."""
        try:
            self.core.delete_namespace(name, propagation_policy="Background")
        except ApiException as exc:
            if exc.status == 404:
                return True
            raise
        if timeout <= 0:
            return False
        return waits.gone(self.core.list_namespace, (), f"metadata.name={name}", timeout)

    def delete_expired_namespaces(self) -> list[str]:
        """Namespaces of earlier runs that were killed before they could clean up."""
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        gone: list[str] = []
        try:
            items = self.core.list_namespace(label_selector=f"{MANAGED_BY}={MANAGER}").items
        except ApiException:
            return gone
        for ns in items:
            expires = (ns.metadata.annotations or {}).get(EXPIRES, "")
            if expires and expires < now and ns.metadata.deletion_timestamp is None:
                try:
                    self.core.delete_namespace(ns.metadata.name, propagation_policy="Background")
                    gone.append(ns.metadata.name)
                except ApiException:
                    pass
        return gone

    # ---- pods

    def create_pod(self, namespace: str, manifest: Mapping[str, Any]) -> None:
        body = dict(manifest)
        node = ((body.get("metadata") or {}).get("labels") or {}).get(NODE_LABEL, "")
        runtime_class = self.runtime_class or self.node_runtime_classes.get(node)
        if runtime_class:
            body["spec"] = {**body["spec"], "runtimeClassName": runtime_class}
        self.core.create_namespaced_pod(namespace, body)

    def pods_on(self, node: str, selector: str) -> list[Any]:
        """Pods of any namespace matching `selector` that run on `node` (e.g. an agent's)."""
        return list(self.core.list_pod_for_all_namespaces(
            label_selector=selector, field_selector=f"spec.nodeName={node}").items)

    def _selector(self, node: str | None) -> str:
        """The run's pods; with `node`, only those pinned to it: a node's waits then decode
        only its own pods' events (with nodes worked in parallel, every watch decoded every
        node's events, and the suite spent its CPU on that)."""
        selector = f"{RUN_LABEL}={self.run_id}"
        return f"{selector},{NODE_LABEL}={dns_name(node)}" if node else selector

    def delete_pods(self, namespace: str, names: Iterable[str], timeout: float,
                    node: str | None = None) -> list[str]:
        """Delete pods (graceful) and wait until the API no longer has them; returns those
        still present at the deadline. `node`: the pods are all pinned to that node."""
        pending = set(names)
        selector = self._selector(node)
        for name in list(pending):
            try:
                self.core.delete_namespaced_pod(name, namespace)
            except ApiException as exc:
                if exc.status == 404:
                    pending.discard(name)
                else:
                    raise
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            listing = self.core.list_namespaced_pod(namespace, label_selector=selector)
            pending &= {p.metadata.name for p in listing.items}
            if not pending:
                break
            w = watch.Watch()
            for ev in w.stream(self.core.list_namespaced_pod, namespace,
                               label_selector=selector,
                               resource_version=listing.metadata.resource_version,
                               timeout_seconds=max(1, int(deadline - time.monotonic()))):
                if ev["type"] == "DELETED":
                    pending.discard(ev["object"].metadata.name)
                    if not pending:
                        w.stop()
        return sorted(pending)

    def delete_run_pods(self, namespace: str, timeout: float) -> list[str]:
        listing = self.core.list_namespaced_pod(namespace,
                                                label_selector=f"{RUN_LABEL}={self.run_id}")
        return self.delete_pods(namespace, [p.metadata.name for p in listing.items], timeout)

    def wait_pods(
        self, namespace: str, names: Iterable[str], timeout: float,
        done: Callable[[PodState], bool] = lambda s: s.state != "Pending",
        node: str | None = None,
    ) -> dict[str, PodState]:
        """Watch the pods until `done` holds for each (default: left Pending) or the deadline;
        returns each pod's last state (`Pending`, or `Missing`, for those that never got
        there)."""
        wanted = set(names)
        states: dict[str, PodState] = {n: PodState(n, "Missing") for n in wanted}
        deadline = time.monotonic() + timeout
        selector = self._selector(node)

        def open_names() -> set[str]:
            return {n for n in wanted if not done(states[n])}

        while time.monotonic() < deadline:
            listing = self.core.list_namespaced_pod(namespace, label_selector=selector)
            for pod in listing.items:
                if pod.metadata.name in wanted:
                    states[pod.metadata.name] = classify(pod)
            if not open_names():
                return states
            w = watch.Watch()
            try:
                for ev in w.stream(self.core.list_namespaced_pod, namespace,
                                   label_selector=selector,
                                   resource_version=listing.metadata.resource_version,
                                   timeout_seconds=max(1, int(deadline - time.monotonic()))):
                    pod = ev["object"]
                    name = pod.metadata.name
                    if name not in wanted:
                        continue
                    states[name] = (PodState(name, "Deleted") if ev["type"] == "DELETED"
                                    else classify(pod))
                    if not open_names():
                        w.stop()
                        return states
            except ApiException as exc:
                if exc.status != 410:  # resourceVersion too old: list again
                    raise
        return states

    def exec(self, namespace: str, pod: str, command: list[str], timeout: float = 30,
             container: str | None = None) -> ExecResult:
        kwargs: dict[str, Any] = {"command": command, "stderr": True, "stdin": False,
                                  "stdout": True, "tty": False, "_preload_content": False}
        if container:
            kwargs["container"] = container
        resp = stream(self._exec_core().connect_get_namespaced_pod_exec, pod, namespace,
                      **kwargs)
        try:
            resp.run_forever(timeout=timeout)
            timed_out = resp.is_open()
            out = resp.read_stdout(timeout=0)
            err = resp.read_stderr(timeout=0)
            rc = 124 if timed_out else resp.returncode
        finally:
            resp.close()
        if timed_out:
            err += f"exec timed out after {timeout:.0f}s"
        return ExecResult(rc=int(rc if rc is not None else -1), stdout=str(out),
                          stderr=str(err))

    def logs(self, namespace: str, pod: str) -> str:
        text: str = self.core.read_namespaced_pod_log(pod, namespace)
        return text


def _clone(api_client: Any) -> Any:
    return client.ApiClient(api_client.configuration)


def pod_manifest(
    name: str, *, run_id: str, role: str, node: str, image: str, command: list[str],
    limits: Mapping[str, int] | None = None, host_network: bool = False,
    env: Mapping[str, str] | None = None, labels: Mapping[str, str] | None = None,
    host_paths: Iterable[tuple[str, str, str]] = (), read_only_paths: bool = True,
    restart: str = "Never", grace: int = 2,
) -> dict[str, Any]:
    """A test pod pinned to `node` through the scheduler (node affinity on metadata.name, so
    resource fit is the scheduler's and the kubelet's to decide), tolerating every taint.

    host_paths: (volume name, host path, hostPath type) mounted at the same path."""
    container: dict[str, Any] = {
        "name": "main", "image": image, "imagePullPolicy": "IfNotPresent",
        "command": command,
        "env": [{"name": k, "value": v} for k, v in (env or {}).items()],
        "securityContext": {"allowPrivilegeEscalation": False},
    }
    if limits:
        container["resources"] = {"limits": {k: str(v) for k, v in limits.items()}}
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    for vol, path, kind in host_paths:
        volumes.append({"name": vol, "hostPath": {"path": path, "type": kind}})
        mounts.append({"name": vol, "mountPath": path, "readOnly": read_only_paths})
    if mounts:
        container["volumeMounts"] = mounts
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}
    spec: dict[str, Any] = {
        "restartPolicy": restart,
        "serviceAccountName": WORKLOAD_SA,
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": grace,
        "affinity": affinity,
        "tolerations": [{"operator": "Exists"}],
        "containers": [container],
    }
    if host_network:
        spec["hostNetwork"] = True
        spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    if volumes:
        spec["volumes"] = volumes
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {MANAGED_BY: MANAGER, RUN_LABEL: run_id,
                                              ROLE_LABEL: role, NODE_LABEL: dns_name(node),
                                              **(labels or {})}},
        "spec": spec,
    }
