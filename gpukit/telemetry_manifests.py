"""Objects for clusters with the Prometheus operator: how it scrapes the node agent's metrics
(a PodMonitor, or a headless Service and a ServiceMonitor), gpukit's GPU alerts (a
PrometheusRule) and its dashboard (a ConfigMap Grafana's dashboard sidecar picks up).

Both scrape objects name the job `gpukit-node-agent` (the agent pods' app.kubernetes.io/name,
as `jobLabel`) and add the `node` label from the pod's node: the alert rules
(gpukit/monitoring/gpu-alerts.rules.yaml) select and describe by them. The agent must listen
where Prometheus reaches it (gpukit.metricsAddress, e.g. `0.0.0.0:9402`; the default
`127.0.0.1:9402` serves only the node) and its container must name that port `metrics`.

With metrics auth `kubernetes` (the default, gpukit/contracts/metrics_auth.py) the agent answers
only a scrape whose bearer token may `get nodes/metrics`: the scraper's identity (a
ServiceAccount, a ClusterRole with exactly that rule, its binding, and a long-lived token
Secret the token controller fills) comes first, and each scrape object sends that Secret's token.
Role gpu_telemetry applies the same identity for a Prometheus on hosts, which reads the token
into a file.
"""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

from gpukit import monitoring
from gpukit.agent_manifests import APP
from gpukit.contracts import metrics_auth

JOB = APP  # the job label the rules select (up{job="gpukit-node-agent"})
MODES = ("podmonitor", "servicemonitor")
DEFAULT_PORT = 9402
_DURATION = re.compile(r"^([0-9]+(ms|s|m|h))+$")
_OPERATOR_API = "monitoring.coreos.com/v1"
_LABELS = {"app.kubernetes.io/name": APP, "app.kubernetes.io/part-of": "gpukit"}
# The scraper's ServiceAccount, ClusterRole and binding; its token Secret and the key the
# token controller writes the token under.
SCRAPER = "gpukit-metrics-scraper"
TOKEN_SECRET = f"{SCRAPER}-token"
TOKEN_KEY = "token"
_SA_TOKEN_TYPE = "kubernetes.io/service-account-token"
_SA_NAME_ANNOTATION = "kubernetes.io/service-account.name"


def _check_namespace(namespace: str) -> None:
    if not isinstance(namespace, str) or not re.fullmatch(
            r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", namespace):
        raise ValueError(f"namespace {namespace!r} is not a Kubernetes namespace name")


def _check(namespace: str, port: int, interval: str, mode: str, auth: str) -> None:
    """Bad input is refused before anything is built, naming the field and the value."""
    _check_namespace(namespace)
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"port {port!r} is not a TCP port (1-65535)")
    if not _DURATION.match(interval):
        raise ValueError(f"interval {interval!r} is not a Prometheus duration such as 30s")
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not one of {', '.join(MODES)}")
    if auth not in metrics_auth.MODES:
        raise ValueError(f"auth {auth!r} is not one of {', '.join(metrics_auth.MODES)}")


def scraper(namespace: str = "gpukit-system") -> list[dict[str, Any]]:
    """The scraper's identity, in apply order: a ServiceAccount in `namespace`, a ClusterRole
    with exactly the permission the agent checks (SCRAPER_RULE), its binding, and a long-lived
    token Secret for the ServiceAccount (the token controller writes `token` into it and keeps
    it while the Secret exists: a second apply leaves the token as it was)."""
    _check_namespace(namespace)
    meta = {"name": SCRAPER, "labels": dict(_LABELS)}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {**meta, "namespace": namespace}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": dict(meta), "rules": [dict(metrics_auth.SCRAPER_RULE)]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": dict(meta),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": SCRAPER},
         "subjects": [{"kind": "ServiceAccount", "name": SCRAPER, "namespace": namespace}]},
        {"apiVersion": "v1", "kind": "Secret", "type": _SA_TOKEN_TYPE,
         "metadata": {"name": TOKEN_SECRET, "namespace": namespace, "labels": dict(_LABELS),
                      "annotations": {_SA_NAME_ANNOTATION: SCRAPER}}},
    ]


def authorization() -> dict[str, Any]:
    """A scrape endpoint's bearer token from the scraper's Secret (the operator's
    SafeAuthorization: the Secret must be in the monitor's namespace)."""
    return {"type": "Bearer", "credentials": {"name": TOKEN_SECRET, "key": TOKEN_KEY}}


def _monitor(kind: str, namespace: str, selector: dict[str, str], endpoints: str,
             interval: str, auth: str) -> dict[str, Any]:
    """A Prometheus operator monitor of the agents' `metrics` port, each series labelled with
    its node, sending the scraper's token unless auth is `none`."""
    relabel = [{"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node",
                "action": "replace"}]
    endpoint: dict[str, Any] = {"port": "metrics", "path": "/metrics", "interval": interval,
                                "relabelings": relabel}
    if auth == metrics_auth.AUTH_KUBERNETES:
        endpoint["authorization"] = authorization()
    return {
        "apiVersion": _OPERATOR_API,
        "kind": kind,
        "metadata": {"name": APP, "namespace": namespace, "labels": dict(_LABELS)},
        "spec": {
            "jobLabel": "app.kubernetes.io/name",
            "selector": {"matchLabels": selector},
            "namespaceSelector": {"matchNames": [namespace]},
            endpoints: [endpoint],
        },
    }


def pod_monitor(namespace: str = "gpukit-system", interval: str = "30s",
                auth: str = metrics_auth.AUTH_KUBERNETES) -> dict[str, Any]:
    return _monitor("PodMonitor", namespace, {"app.kubernetes.io/name": APP},
                    "podMetricsEndpoints", interval, auth)


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


def service_monitor(namespace: str = "gpukit-system", interval: str = "30s",
                    auth: str = metrics_auth.AUTH_KUBERNETES) -> dict[str, Any]:
    return _monitor("ServiceMonitor", namespace, dict(_LABELS), "endpoints", interval, auth)


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


def operator_objects(namespace: str = "gpukit-system", mode: str = "podmonitor",
                     port: int = DEFAULT_PORT, interval: str = "30s",
                     auth: str = metrics_auth.AUTH_KUBERNETES) -> list[dict[str, Any]]:
    """The operator's own objects: the scrape objects of `mode` (with the scraper's token unless
    auth is `none`), the rules and the dashboard."""
    _check(namespace, port, interval, mode, auth)
    scrape = ([pod_monitor(namespace, interval, auth)] if mode == "podmonitor"
              else [metrics_service(namespace, port), service_monitor(namespace, interval, auth)])
    return [*scrape, prometheus_rule(namespace), dashboard_config_map(namespace)]


def manifests(namespace: str = "gpukit-system", mode: str = "podmonitor",
              port: int = DEFAULT_PORT, interval: str = "30s",
              auth: str = metrics_auth.AUTH_KUBERNETES) -> list[dict[str, Any]]:
    """Everything for an operator-run Prometheus, in apply order: the scraper's identity and
    token Secret (auth `kubernetes`), then operator_objects."""
    objects = operator_objects(namespace, mode, port, interval, auth)
    return [*(scraper(namespace) if auth == metrics_auth.AUTH_KUBERNETES else []), *objects]
