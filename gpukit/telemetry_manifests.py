"""Objects for clusters with the Prometheus operator: how it scrapes the node agent's metrics
(a PodMonitor, or a headless Service and a ServiceMonitor), gpukit's GPU alerts (a
PrometheusRule) and its dashboard (a ConfigMap Grafana's dashboard sidecar picks up).

Both scrape objects name the job `gpukit-node-agent` (the agent pods' app.kubernetes.io/name,
as `jobLabel`) and add the `node` label from the pod's node: the alert rules
(gpukit/monitoring/gpu-alerts.rules.yaml) select and describe by them. The agent must listen
where Prometheus reaches it (gpukit.metricsAddress, e.g. `0.0.0.0:9402`; the default
`127.0.0.1:9402` serves only the node) and its container must name that port `metrics`.
"""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

from gpukit import monitoring
from gpukit.agent_manifests import APP

JOB = APP  # the job label the rules select (up{job="gpukit-node-agent"})
MODES = ("podmonitor", "servicemonitor")
DEFAULT_PORT = 9402
_DURATION = re.compile(r"^([0-9]+(ms|s|m|h))+$")
_OPERATOR_API = "monitoring.coreos.com/v1"
_LABELS = {"app.kubernetes.io/name": APP, "app.kubernetes.io/part-of": "gpukit"}


def _check(namespace: str, port: int, interval: str, mode: str) -> None:
    """Bad input is refused before anything is built, naming the field and the value."""
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", namespace):
        raise ValueError(f"namespace {namespace!r} is not a Kubernetes namespace name")
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"port {port!r} is not a TCP port (1-65535)")
    if not _DURATION.match(interval):
        raise ValueError(f"interval {interval!r} is not a Prometheus duration such as 30s")
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not one of {', '.join(MODES)}")


def _monitor(kind: str, namespace: str, selector: dict[str, str], endpoints: str,
             interval: str) -> dict[str, Any]:
    """A Prometheus operator monitor of the agents' `metrics` port, each series labelled with
    its node."""
    relabel = [{"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node",
                "action": "replace"}]
    return {
        "apiVersion": _OPERATOR_API,
        "kind": kind,
        "metadata": {"name": APP, "namespace": namespace, "labels": dict(_LABELS)},
        "spec": {
            "jobLabel": "app.kubernetes.io/name",
            "selector": {"matchLabels": selector},
            "namespaceSelector": {"matchNames": [namespace]},
            endpoints: [{"port": "metrics", "path": "/metrics", "interval": interval,
                         "relabelings": relabel}],
        },
    }


def pod_monitor(namespace: str = "gpukit-system", interval: str = "30s") -> dict[str, Any]:
    return _monitor("PodMonitor", namespace, {"app.kubernetes.io/name": APP},
                    "podMetricsEndpoints", interval)


def metrics_service(namespace: str = "gpukit-system", port: int = DEFAULT_PORT
                    ) -> dict[str, Any]:
    """A headless Service over the agent pods: what a ServiceMonitor discovers them by."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": f"{APP}-metrics", "namespace": namespace, "labels": dict(_LABELS)},
        "spec": {
            "clusterIP": "None",
            "selector": {"app.kubernetes.io/name": APP},
            "ports": [{"name": "metrics", "port": port, "targetPort": port,
                       "protocol": "TCP"}],
        },
    }


def service_monitor(namespace: str = "gpukit-system", interval: str = "30s") -> dict[str, Any]:
    return _monitor("ServiceMonitor", namespace, dict(_LABELS), "endpoints", interval)


def prometheus_rule(namespace: str = "gpukit-system") -> dict[str, Any]:
    """gpukit's GPU alerts (gpu-alerts.rules.yaml) as the operator's PrometheusRule."""
    rules = yaml.safe_load(monitoring.text(monitoring.RULES))
    return {
        "apiVersion": _OPERATOR_API,
        "kind": "PrometheusRule",
        "metadata": {"name": f"{APP}-gpu-alerts", "namespace": namespace,
                     "labels": dict(_LABELS)},
        "spec": {"groups": rules["groups"]},
    }


def dashboard_config_map(namespace: str = "gpukit-system") -> dict[str, Any]:
    """The dashboard for Grafana's sidecar (it loads ConfigMaps labelled grafana_dashboard)."""
    text = monitoring.text(monitoring.DASHBOARD)
    json.loads(text)  # a broken file fails here, not in Grafana
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"{APP}-dashboard", "namespace": namespace,
                     "labels": {**_LABELS, "grafana_dashboard": "1"}},
        "data": {"gpukit-gpus.json": text},
    }


def manifests(namespace: str = "gpukit-system", mode: str = "podmonitor",
              port: int = DEFAULT_PORT, interval: str = "30s") -> list[dict[str, Any]]:
    """Everything for an operator-run Prometheus: the scrape objects of `mode`, the rules and
    the dashboard."""
    _check(namespace, port, interval, mode)
    scrape = ([pod_monitor(namespace, interval)] if mode == "podmonitor"
              else [metrics_service(namespace, port), service_monitor(namespace, interval)])
    return [*scrape, prometheus_rule(namespace), dashboard_config_map(namespace)]
