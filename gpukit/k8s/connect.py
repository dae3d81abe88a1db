"""Where a gpukit program's Kubernetes API client comes from."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from kubernetes import client, config


def api_client(kubeconfig: str | Path | None = None, *, in_cluster_first: bool = False) -> Any:
    """An ApiClient of its own (not the kubernetes module's global default).

    With `kubeconfig`: that file. Else $KUBECONFIG or ~/.kube/config, then the pod's
    ServiceAccount; `in_cluster_first` tries the ServiceAccount first (the node agent in its
    pod, where a stray kubeconfig must not win)."""
    if kubeconfig:
        return config.new_client_from_config(config_file=str(kubeconfig))
    order = (_in_cluster, _from_file) if in_cluster_first else (_from_file, _in_cluster)
    try:
        return order[0]()
    except config.ConfigException as first:
        try:
            return order[1]()
        except config.ConfigException as second:
            raise config.ConfigException(
                f"no Kubernetes API to connect to: {first}; {second}") from second


def core(kubeconfig: str | Path | None = None, **kw: Any) -> client.CoreV1Api:
    return client.CoreV1Api(api_client(kubeconfig, **kw))


def _in_cluster() -> Any:
    cfg = client.Configuration()
    config.load_incluster_config(client_configuration=cfg)
    return client.ApiClient(cfg)


def _from_file() -> Any:
    # $KUBECONFIG read now: the client reads it once, when first imported.
    return config.new_client_from_config(
        config_file=os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config"))
