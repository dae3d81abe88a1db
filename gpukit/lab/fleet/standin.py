"""API-only stand-ins for the nodes of an inventory: Node objects and Leases, no kubelet.

Each host becomes a Node as its kubelet registers it (addresses, node info, cpu/memory/pods)
with what a node agent serving its declaration reports: the GPU resources in capacity and
allocatable, the GFD labels and the config-state label, the declared labels and taints. A
renewer keeps each node's Lease and Ready heartbeat fresh, as the kubelet does, so the node
lifecycle controller leaves them Ready. A NoSchedule taint of the lab's own keeps pods off
them: nothing would run a pod there.

What the stand-ins report is what the declaration says (gpukit.conformance.expect): checks of
the API-side parts (discovery, labels, the upgrade planner, the reports) run against them to
measure how those parts grow with the fleet, not to prove an agent right.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.exceptions import ApiException

from gpukit import inventory as inv
from gpukit.conformance import expect
from gpukit.contracts import label_names as ln
from gpukit.contracts import node_declaration as nd

SIMULATED = "gpukit-lab/simulated"  # label and taint key of every stand-in node
LEASE_NAMESPACE = "kube-node-lease"
LEASE_SECONDS = 40  # the kubelet's default
RENEW_SECONDS = 10.0  # the kubelet renews at a quarter of the lease duration
# The kubelet's nodeStatusReportFrequency: an unchanged status is written this often; the
# Lease alone tells the node lifecycle controller the node lives (half the API writes of
# writing both every round, which at 1000 nodes loaded the control plane being measured).
STATUS_SECONDS = 300.0
KUBELET_VERSION = "v1.37.2"
# What each stand-in reports besides its GPUs (one DGX-like host; nothing schedules there).
HOST_RESOURCES = {"cpu": "128", "memory": "1056759280Ki", "pods": "110",
                  "ephemeral-storage": "1900000000Ki"}  # fmt: skip


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _stamp(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _micro(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def labels_of(decl: inv.NodeDecl) -> dict[str, str]:
    """The node's labels: its kubelet's, the agent's (GFD, config state) and the declared."""
    labels = {
        "kubernetes.io/hostname": decl.node_name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        SIMULATED: "true",
        **expect.expected_labels(decl),
        **decl.labels,
        **decl.selection_labels(),
    }
    if decl.gpu.count:
        labels[ln.DEVICE_PLUGIN_CONFIG_STATE] = ln.CONFIG_STATE_SUCCESS
    return labels


def _conditions(t: dt.datetime) -> list[dict[str, str]]:
    beat = _stamp(t)
    healthy = [
        ("MemoryPressure", "False", "KubeletHasSufficientMemory"),
        ("DiskPressure", "False", "KubeletHasNoDiskPressure"),
        ("PIDPressure", "False", "KubeletHasSufficientPID"),
        ("Ready", "True", "KubeletReady"),
    ]
    return [
        {"type": k, "status": s, "reason": r, "message": f"simulated: {r}",
         "lastHeartbeatTime": beat, "lastTransitionTime": beat}
        for k, s, r in healthy
    ]  # fmt: skip


def node_status(decl: inv.NodeDecl, address: str, t: dt.datetime) -> dict[str, Any]:
    gpus = {r: str(n) for r, n in expect.expected_resources(decl).items() if n > 0}
    served = (nd.dra_counts(inv.expected_dra_devices(decl)) if decl.dra
              else {r: int(n) for r, n in gpus.items()})
    return {
        "capacity": {**HOST_RESOURCES, **gpus},
        "allocatable": {**HOST_RESOURCES, **gpus},
        # As the node agent (a DRA node's DRA plugin, counting its devices by kind) sets it
        # where the node serves its declaration (served vs declared).
        "conditions": [
            *_conditions(t),
            {"type": nd.CONDITION_TYPE, "status": "False", "reason": nd.REASON_OK,
             "message": nd.served_message(decl.node_name, served),
             "lastHeartbeatTime": _stamp(t), "lastTransitionTime": _stamp(t)}],
        "addresses": [
            {"type": "InternalIP", "address": address},
            {"type": "Hostname", "address": decl.node_name},
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        "nodeInfo": {
            "machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": "simulated",
            "osImage": "gpukit lab simulated node", "operatingSystem": "linux",
            "architecture": "amd64", "containerRuntimeVersion": "containerd://2.2.9",
            "kubeletVersion": KUBELET_VERSION, "kubeProxyVersion": "",
        },
    }  # fmt: skip


def node_object(decl: inv.NodeDecl, address: str, t: dt.datetime) -> dict[str, Any]:
    taints = [{"key": SIMULATED, "value": "true", "effect": "NoSchedule"}]
    taints += [{"key": x.key, "value": x.value, "effect": x.effect} for x in decl.taints]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": decl.node_name, "labels": labels_of(decl)},
        "spec": {"taints": taints},
        "status": node_status(decl, address, t),
    }


def lease_object(node: str, uid: str, t: dt.datetime) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": node,
            "namespace": LEASE_NAMESPACE,
            # As the kubelet's: the lease goes with its node.
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}],
        },
        "spec": {
            "holderIdentity": node,
            "leaseDurationSeconds": LEASE_SECONDS,
            "renewTime": _micro(t),
        },
    }


LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases"
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"  # a Node's conditions merge by type


def request(api_client: Any, method: str, path: str, body: Any = None,
            content_type: str = "application/json") -> dict[str, Any]:
    """One call to the API server through the client's connection pool and credentials, the
    answer as JSON; ApiException on an error status. Bypasses the client's per-call argument
    validation and models: a kubelet's few writes per node, times 1000 nodes every 10 s,
    spent most of a loaded machine's CPU there."""
    cfg = api_client.configuration
    headers = {"Accept": "application/json", "Content-Type": content_type}
    for auth in cfg.auth_settings().values():
        if auth.get("in") == "header" and auth.get("value"):
            headers[auth["key"]] = auth["value"]
    resp = api_client.rest_client.pool_manager.request(
        method, cfg.host + path, headers=headers,
        body=None if body is None else json.dumps(body), timeout=30)
    if not 200 <= resp.status < 300:
        raise ApiException(status=resp.status, reason=resp.reason)
    data: dict[str, Any] = json.loads(resp.data or b"{}")
    return data


@dataclass
class StandIns:
    """The fleet's stand-in nodes in one cluster (clients of gpukit.k8s)."""

    core: Any  # CoreV1Api
    coordination: Any  # CoordinationV1Api
    nodes: dict[str, inv.NodeDecl] = field(default_factory=dict)
    addresses: dict[str, str] = field(default_factory=dict)
    workers: int = 16  # threads: each waits on the API server
    renewals: int = 0
    status_written: dict[str, float] = field(default_factory=dict)  # node -> monotonic time
    errors: list[str] = field(default_factory=list)
    _stale: set[str] = field(default_factory=set)  # not Ready in the API at this round
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _call(self, method: str, path: str, body: Any = None,
              content_type: str = "application/json") -> dict[str, Any]:
        return request(self.core.api_client, method, path, body, content_type)

    def _each(self, fn: Callable[[str], None], names: Iterable[str]) -> None:
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            list(pool.map(fn, names))

    def register(self, fleet: inv.GpuInventory) -> None:
        """Create (or replace) a Node and its Lease per declared host."""
        for decl in fleet.nodes:
            self.nodes[decl.node_name] = decl
            self.addresses[decl.node_name] = decl.address or ""
        self._each(self._register_one, list(self.nodes))

    def _register_one(self, name: str) -> None:
        decl, t = self.nodes[name], _now()
        body = node_object(decl, self.addresses[name], t)
        # As a kubelet registers: the Node with its status (the API keeps a created node's
        # status), then its Lease. Answers are read as JSON, not the client's models: the
        # models cost most of the CPU of registering 1000 nodes.
        try:
            created = self._call("POST", "/api/v1/nodes", body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            self._call("DELETE", f"/api/v1/nodes/{name}")
            created = self._call("POST", "/api/v1/nodes", body)
        self.status_written[name] = time.monotonic()
        self._put_lease(lease_object(name, created["metadata"]["uid"], t))

    def _put_lease(self, lease: dict[str, Any]) -> None:
        """Create the Lease, or replace the one a replaced node left (the garbage collector
        may delete that one meanwhile: then create again)."""
        name = lease["metadata"]["name"]
        for _ in range(5):
            try:
                self._call("POST", LEASES, lease)
                return
            except ApiException as exc:
                if exc.status != 409:
                    raise
            try:
                old = self._call("GET", f"{LEASES}/{name}")
                version = old["metadata"]["resourceVersion"]
                body = {**lease, "metadata": {**lease["metadata"], "resourceVersion": version}}
                self._call("PUT", f"{LEASES}/{name}", body)
                return
            except ApiException as exc:
                if exc.status not in (404, 409):
                    raise
        raise RuntimeError(f"node {name}: its Lease kept changing while it was replaced")

    def renew_once(self) -> None:
        """Every node's Lease renewed; its status too where the API's differs from what it
        reports (the node lifecycle controller marked it Unknown: one list of the stand-ins
        per round tells) or STATUS_SECONDS passed since its last (the kubelet writes a
        changed status at once, an unchanged one every nodeStatusReportFrequency)."""
        self._stale = self._not_ready()
        self._each(self._renew_one, list(self.status_written))  # those registered so far

    def _not_ready(self) -> set[str]:
        try:
            listed = self._call("GET", f"/api/v1/nodes?labelSelector={SIMULATED}%3Dtrue")
        except ApiException as exc:
            self.errors.append(f"list nodes: {exc.status} {exc.reason}")
            return set()
        return {n["metadata"]["name"] for n in listed["items"]
                if not any(c.get("type") == "Ready" and c.get("status") == "True"
                           for c in (n.get("status") or {}).get("conditions") or [])}

    def _renew_one(self, name: str) -> None:
        t, now = _now(), time.monotonic()
        try:
            self._call("PATCH", f"{LEASES}/{name}", {"spec": {"renewTime": _micro(t)}}, MERGE)
            due = now - self.status_written.get(name, float("-inf")) >= STATUS_SECONDS
            if due or name in self._stale:
                self._call("PATCH", f"/api/v1/nodes/{name}/status",
                           {"status": {"conditions": _conditions(t)}}, STRATEGIC)
                self.status_written[name] = now
            self.renewals += 1
        except ApiException as exc:
            self.errors.append(f"{name}: {exc.status} {exc.reason}")

    def start_renewing(self, every: float = RENEW_SECONDS) -> None:
        """Renew in a thread every `every` seconds; started before register(), it keeps the
        first nodes' Leases fresh while the last ones register."""
        def loop() -> None:
            while not self._stop.wait(every):
                self.renew_once()

        self._thread = threading.Thread(target=loop, name="fleet-renewer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)

    def remove(self) -> None:
        """Delete every stand-in node (their Leases go with them)."""
        self.stop()
        self._each(self._remove_one, list(self.nodes))

    def _remove_one(self, name: str) -> None:
        try:
            self.core.delete_node(name)
        except ApiException as exc:
            if exc.status != 404:
                raise


def ready_count(core: Any) -> tuple[int, int]:
    """(stand-in nodes, of which Ready) as the API has them."""
    items = core.list_node(label_selector=f"{SIMULATED}=true").items
    ready = sum(
        any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
        for n in items
    )
    return len(items), ready


def wait_registered(core: Any, count: int, timeout: float = 120) -> float:
    """Seconds until `count` stand-ins are listed Ready."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        n, ready = ready_count(core)
        if n >= count and ready >= count:
            return time.monotonic() - t0
        time.sleep(0.5)
    raise TimeoutError(f"{count} simulated nodes not Ready after {timeout:.0f}s")
