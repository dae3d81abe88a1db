"""Reading a node's GPU metrics as an authorised scraper, and as an anonymous one.

gpukit's agent (and its DRA plugin on a DRA node) answers /metrics only to a bearer token the
API server accepts and allows `get nodes/metrics` on the node (gpukit_metrics_auth:
kubernetes, the default): the permission a Prometheus needs for the kubelets. The API server's
node proxy forwards no credentials, so the suite scrapes from inside the cluster: one small pod
per node (the shell image, busybox's wget) running as the run's scraper ServiceAccount, bound
to a ClusterRole with exactly that permission. The token never leaves the pod: its shell reads
the mounted token when it runs wget. The same pod without the header is the anonymous scraper.

The binding is owned by the run's namespace, so it goes with it (a killed run's namespace
expires and the garbage collector takes the binding). The in-cluster Job (deploy/job.yaml)
ships the account and binding instead: the runner may not create RBAC.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException

from gpukit.contracts.metrics_auth import SCRAPER_RULE as SCRAPER_RULE

from .cluster import MANAGED_BY, MANAGER, pod_manifest
from .fill import HOLD

SCRAPER_SA = "gpukit-conformance-scraper"
SCRAPER_ROLE = "gpukit-conformance-scraper"
TOKEN_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/token"
_STATUS = re.compile(r"HTTP/1\.[01] (\d{3})")
EXEC_TIMEOUT = 30.0


class ScrapeError(Exception):
    """The metrics could not be read (the message names node and address)."""


@dataclass(frozen=True)
class Answer:
    url: str
    status: int  # the HTTP status; 0 when nothing answered
    body: str


def ensure_account(kube: Any, namespace: str) -> None:
    """The run's scraper ServiceAccount, its ClusterRole and binding (kept when they exist:
    the in-cluster Job's manifest made them)."""
    from kubernetes import client

    try:
        kube.core.read_namespaced_service_account(SCRAPER_SA, namespace)
        return
    except ApiException as exc:
        if exc.status != 404:
            raise
    labels = {MANAGED_BY: MANAGER}
    _create(lambda: kube.core.create_namespaced_service_account(namespace, {
        "apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": SCRAPER_SA, "namespace": namespace, "labels": labels}}))
    rbac = client.RbacAuthorizationV1Api(kube.api_client)
    _create(lambda: rbac.create_cluster_role({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": SCRAPER_ROLE, "labels": labels}, "rules": [SCRAPER_RULE]}))
    ns = kube.core.read_namespace(namespace)
    _create(lambda: rbac.create_cluster_role_binding({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": f"{SCRAPER_ROLE}-{namespace}", "labels": labels,
                     # Gone with the namespace, also when the run was killed.
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Namespace",
                                          "name": namespace, "uid": ns.metadata.uid}]},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": SCRAPER_ROLE},
        "subjects": [{"kind": "ServiceAccount", "name": SCRAPER_SA, "namespace": namespace}]}))


def _create(call: Any) -> None:
    try:
        call()
    except ApiException as exc:
        if exc.status != 409:
            raise


def pod(name: str, *, run_id: str, node: str, image: str, host_network: bool
        ) -> dict[str, Any]:
    """The node's scraper pod: the shell image, no device, the scraper's token mounted."""
    manifest = pod_manifest(name, run_id=run_id, role="scraper", node=node, image=image,
                            command=["sh", "-c", HOLD], host_network=host_network)
    manifest["spec"]["serviceAccountName"] = SCRAPER_SA
    manifest["spec"]["automountServiceAccountToken"] = True
    return manifest


def node_address(kube: Any, node: str) -> str:
    """The node's InternalIP (where a listener on every interface is reached)."""
    addresses = kube.core.read_node(node).status.addresses or []
    for kind in ("InternalIP", "ExternalIP", "Hostname"):
        for a in addresses:
            if a.type == kind:
                return str(a.address)
    raise ScrapeError(f"node {node} reports no address")


def command(url: str, authorised: bool) -> list[str]:
    """busybox wget printing the response's status line (-S, stderr) and body (stdout)."""
    header = (f' --header "Authorization: Bearer $(cat {TOKEN_FILE})"' if authorised else "")
    return ["sh", "-c", f"busybox wget -S -q -O -{header} {shlex.quote(url)}"]


def status_of(stderr: str) -> int:
    """The last HTTP status busybox wget printed (0: no answer at all)."""
    found = _STATUS.findall(stderr)
    return int(found[-1]) if found else 0


def get(kube: Any, namespace: str, pod_name: str, node: str, url: str,
        authorised: bool) -> Answer:
    res = kube.exec(namespace, pod_name, command(url, authorised), timeout=EXEC_TIMEOUT)
    status = status_of(res.stderr)
    if status == 0:
        raise ScrapeError(f"agent metrics at {url} on node {node}: no answer (rc {res.rc}: "
                          f"{res.stderr.strip()[:200]})")
    return Answer(url, status, res.stdout)
