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


@dataclass
class StandIns:
    """The fleet's stand-in nodes in one cluster (clients of gpukit.k8s)."""

    core: Any  # CoreV1Api
    coordination: Any  # CoordinationV1Api
    nodes: dict[str, inv.NodeDecl] = field(default_factory=dict)
    addresses: dict[str, str] = field(default_factory=dict)
    workers: int = 8
    renewals: int = 0
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

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
        try:
            created = self.core.create_node(body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            self.core.delete_node(name)
            created = self.core.create_node(body)
        # The API keeps a created node's status; write it again through the status
        # subresource, as a kubelet's first heartbeat does.
        self.core.patch_node_status(name, {"status": node_status(decl, self.addresses[name], t)})
        lease = lease_object(name, created.metadata.uid, t)
        try:
            self.coordination.create_namespaced_lease(LEASE_NAMESPACE, lease)
        except ApiException as exc:
            if exc.status != 409:
                raise
            self.coordination.replace_namespaced_lease(name, LEASE_NAMESPACE, lease)

    def renew_once(self) -> None:
        """Every node's Lease renewed; its Ready heartbeat too when the lease's quarter has
        passed (the kubelet writes status every nodeStatusReportFrequency)."""
        self._each(self._renew_one, list(self.nodes))

    def _renew_one(self, name: str) -> None:
        t = _now()
        try:
            self.coordination.patch_namespaced_lease(
                name, LEASE_NAMESPACE, {"spec": {"renewTime": _micro(t)}}
            )
            self.core.patch_node_status(name, {"status": {"conditions": _conditions(t)}})
            self.renewals += 1
        except ApiException as exc:
            self.errors.append(f"{name}: {exc.status} {exc.reason}")

    def start_renewing(self, every: float = RENEW_SECONDS) -> None:
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
