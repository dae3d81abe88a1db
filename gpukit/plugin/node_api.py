"""The little the node agent asks of the Kubernetes API: read, watch and patch its own node's
labels, set its served-vs-declared condition (so does the DRA plugin), and record Events on
it; and review the tokens of its metrics' scrapers (ReviewClient,
gpukit/plugin/metrics_auth.py).

Uses the in-cluster ServiceAccount when running in a pod, else a kubeconfig (--kubeconfig or
$KUBECONFIG), through gpukit.k8s like every gpukit program. The kubernetes client is imported
lazily: a plain host process without a node name never needs it.
"""

from __future__ import annotations

import datetime
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

log = logging.getLogger(__name__)


COMPONENT = "gpukit-node-agent"
# Node events live in the default namespace (where the kubelet records its own).
EVENT_NAMESPACE = "default"
LabelsSeen = Callable[[dict[str, str]], None]


class NodeClient:
    """`core`: a CoreV1Api to use (the DRA plugin's, whose Events name it as `component`)."""

    def __init__(self, kubeconfig: str | None = None, core: Any = None,
                 component: str = COMPONENT) -> None:
        if core is None:
            from gpukit.k8s import connect

            core = connect.core(kubeconfig, in_cluster_first=True)
        self._api: Any = core
        self.component = component

    def labels(self, node_name: str) -> dict[str, str]:
        node = self._api.read_node(node_name)
        return dict(node.metadata.labels or {})

    def patch_labels(self, node_name: str, changes: Mapping[str, str | None]) -> None:
        """Set labels; a None value removes the label (strategic merge patch)."""
        if not changes:
            return
        self._api.patch_node(node_name, {"metadata": {"labels": dict(changes)}})
        log.info("patched %d label(s) on node %s", len(changes), node_name)

    def set_condition(self, node_name: str, condition: dict[str, Any]) -> None:
        """Set one condition of the node's status (node-problem-detector's way): a strategic
        merge patch keyed by the condition's type leaves the kubelet's conditions as they are;
        the agent's admission policy admits nothing else on nodes/status."""
        self._api.patch_node_status(
            node_name, {"status": {"conditions": [condition]}},
            _content_type="application/strategic-merge-patch+json")

    def event(self, node_name: str, reason: str, message: str, type_: str = "Warning") -> None:
        """Record an Event on the node, where `kubectl describe node` shows it."""
        self._api.create_namespaced_event(EVENT_NAMESPACE, node_event(
            node_name, reason, message, type_, self.component))

    def watch_labels(self, node_name: str, seen: LabelsSeen, stop: threading.Event,
                     timeout_seconds: int = 60, retry_seconds: float = 5.0) -> None:
        """Call `seen` with the node's labels at every change, until `stop` is set.

        Each watch ends after `timeout_seconds` and starts again with a fresh list, so `seen`
        also gets the full set that often: the periodic re-assert GFD does every 60 s."""
        from kubernetes import watch

        while not stop.is_set():
            w = watch.Watch()
            try:
                for ev in w.stream(self._api.list_node,
                                   field_selector=f"metadata.name={node_name}",
                                   timeout_seconds=timeout_seconds):
                    if stop.is_set():
                        w.stop()
                        break
                    obj = ev.get("object")
                    if ev.get("type") in ("ADDED", "MODIFIED") and obj is not None:
                        seen(dict(obj.metadata.labels or {}))
            except Exception as exc:  # the API may be down for a while; keep trying
                log.warning("watching node %s failed: %s; retrying in %.0fs", node_name, exc,
                            retry_seconds)
                stop.wait(retry_seconds)


def node_event(node_name: str, reason: str, message: str, type_: str = "Warning",
               component: str = COMPONENT) -> dict[str, Any]:
    """An Event on the node (CoreV1 create_namespaced_event in EVENT_NAMESPACE's body)."""
    now = datetime.datetime.now(datetime.UTC)
    return {
        "metadata": {"generateName": f"{node_name}.gpukit-"},
        # The kubelet uses the node's name as the uid of its own Node events.
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node_name,
                           "uid": node_name},
        "reason": reason, "message": message[:1024], "type": type_,
        "source": {"component": component, "host": node_name},
        "reportingComponent": component, "reportingInstance": node_name,
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    }


class ReviewClient:
    """TokenReviews and SubjectAccessReviews (metrics_auth.ReviewApi), answered as the API's
    JSON. `timeout`: seconds for each call, so a scrape waits no longer for an answer."""

    def __init__(self, kubeconfig: str | None = None, timeout: float = 5.0) -> None:
        from kubernetes import client

        from gpukit.k8s import connect

        self._client: Any = connect.api_client(kubeconfig, in_cluster_first=True)
        self._authn: Any = client.AuthenticationV1Api(self._client)
        self._authz: Any = client.AuthorizationV1Api(self._client)
        self._timeout = timeout

    def token_review(self, body: Mapping[str, Any]) -> Mapping[str, Any]:
        got = self._authn.create_token_review(dict(body), _request_timeout=self._timeout)
        return dict(self._client.sanitize_for_serialization(got))

    def subject_access_review(self, body: Mapping[str, Any]) -> Mapping[str, Any]:
        got = self._authz.create_subject_access_review(dict(body),
                                                       _request_timeout=self._timeout)
        return dict(self._client.sanitize_for_serialization(got))
