"""The little the node agent asks of the Kubernetes API: read and patch its own node's labels.

Uses the in-cluster ServiceAccount when running in a pod, else a kubeconfig (--kubeconfig or
$KUBECONFIG). The kubernetes client is imported lazily: a plain host process without a node name
never needs it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

log = logging.getLogger(__name__)


class NodeClient:
    def __init__(self, kubeconfig: str | None = None) -> None:
        from kubernetes import client, config

        if kubeconfig:
            config.load_kube_config(config_file=kubeconfig)
        else:
            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
        self._api: Any = client.CoreV1Api()

    def labels(self, node_name: str) -> dict[str, str]:
        node = self._api.read_node(node_name)
        return dict(node.metadata.labels or {})

    def patch_labels(self, node_name: str, changes: Mapping[str, str | None]) -> None:
        """Set labels; a None value removes the label (strategic merge patch)."""
        if not changes:
            return
        self._api.patch_node(node_name, {"metadata": {"labels": dict(changes)}})
        log.info("patched %d label(s) on node %s", len(changes), node_name)
