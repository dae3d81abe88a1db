"""`gpukit_metrics_*`: how the node agent's GPU metrics are served and who scrapes them.

The agent serves dcgm-exporter's series on `<listen address>:<port>` of every GPU node (one
DaemonSet, so the address and port are the same on every node: `cluster_problems`). Where
Prometheus runs is `gpukit_metrics_prometheus`:
- `host`: Debian's prometheus on the hosts of the inventory group `gpukit_monitoring`
  (gpukit.gpu.gpu_telemetry installs it and scrapes each GPU node at its declared address);
- `operator`: a cluster's Prometheus operator (PodMonitor, PrometheusRule, the Grafana
  dashboard's ConfigMap, from gpukit.telemetry_manifests);
- `none`: gpukit deploys nothing of Prometheus (the agent still serves its series).

Who may read the series is `gpukit_metrics_auth`: `kubernetes` (the default) has the agent
review each scrape's bearer token with the API server (TokenReview, then SubjectAccessReview
`get nodes/metrics` on its node, as the kubelet guards its own /metrics: a Prometheus allowed
to scrape kubelets may scrape the agents); `none` answers anyone who reaches the port.

Imports nothing of the model (the model imports this)."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpukit.contracts import metrics_auth

from .problems import MISSING, Problem

PROMETHEUS_MODES = ("host", "operator", "none")
DEFAULT_PORT = 9402
DEFAULT_LISTEN = "0.0.0.0"  # every interface of the node: a Prometheus elsewhere reaches it
DEFAULT_INTERVAL = "30s"
MONITORING_GROUP = "gpukit_monitoring"  # site.yml's telemetry play: gpu_nodes and these
# The variables, with their defaults (inventories/README.md).
DEFAULTS: Mapping[str, Any] = {
    "gpukit_metrics_enabled": True,
    "gpukit_metrics_listen_address": DEFAULT_LISTEN,
    "gpukit_metrics_port": DEFAULT_PORT,
    "gpukit_metrics_scrape_interval": DEFAULT_INTERVAL,
    "gpukit_metrics_prometheus": "none",
    "gpukit_metrics_auth": metrics_auth.AUTH_KUBERNETES,
}
VARIABLES = tuple(DEFAULTS)
# Cluster-wide: the one DaemonSet and the one Prometheus serve every node alike.
CLUSTER_WIDE = VARIABLES
_DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")  # Prometheus' duration syntax


@dataclass(frozen=True)
class MetricsDecl:
    """The validated `gpukit_metrics_*` of one host."""

    enabled: bool = True
    listen_address: str = DEFAULT_LISTEN
    port: int = DEFAULT_PORT
    scrape_interval: str = DEFAULT_INTERVAL
    prometheus: str = "none"
    auth: str = metrics_auth.AUTH_KUBERNETES

    @property
    def agent_address(self) -> str:
        """The agent's GPUKIT_METRICS_ADDRESS ('' turns its endpoint off)."""
        if not self.enabled:
            return ""
        host = self.listen_address
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    def target(self, node_address: str) -> str:
        """Where a Prometheus off the node scrapes the agent of a node reached at
        `node_address` (its ansible_host or node name)."""
        host = node_address if self.listen_address in ("0.0.0.0", "::") else self.listen_address
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    def as_dict(self) -> dict[str, Any]:
        return {"enabled": self.enabled, "listen_address": self.listen_address,
                "port": self.port, "scrape_interval": self.scrape_interval,
                "prometheus": self.prometheus, "auth": self.auth,
                "agent_address": self.agent_address}


def declared(host: str | None, raw: Mapping[str, Any]) -> tuple[MetricsDecl, list[Problem]]:
    """One host's `gpukit_metrics_*` (absent or null: the default), with every problem."""
    problems: list[Problem] = []

    def get(name: str) -> Any:
        value = raw.get(name, MISSING)
        return DEFAULTS[name] if value is MISSING or value is None else value

    def fail(name: str, message: str) -> None:
        problems.append(Problem(host, name, raw.get(name, MISSING), message))

    enabled = get("gpukit_metrics_enabled")
    if not isinstance(enabled, bool):
        fail("gpukit_metrics_enabled", "is not true or false")
        enabled = True
    listen = get("gpukit_metrics_listen_address")
    try:
        ip = ipaddress.ip_address(listen) if isinstance(listen, str) else None
    except ValueError:
        ip = None
    if ip is None:
        fail("gpukit_metrics_listen_address",
             "is not an IP address (0.0.0.0 or :: for every interface of the node)")
        listen = DEFAULT_LISTEN
    port = get("gpukit_metrics_port")
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        fail("gpukit_metrics_port", "is not a TCP port (1-65535)")
        port = DEFAULT_PORT
    interval = get("gpukit_metrics_scrape_interval")
    if not isinstance(interval, str) or not _DURATION.match(interval):
        fail("gpukit_metrics_scrape_interval", "is not a Prometheus duration such as 30s or 1m")
        interval = DEFAULT_INTERVAL
    mode = get("gpukit_metrics_prometheus")
    if mode not in PROMETHEUS_MODES:
        fail("gpukit_metrics_prometheus", f"is not one of {', '.join(PROMETHEUS_MODES)}")
        mode = "none"
    auth = get("gpukit_metrics_auth")
    if auth not in metrics_auth.MODES:
        fail("gpukit_metrics_auth", f"is not one of {', '.join(metrics_auth.MODES)}")
        auth = metrics_auth.AUTH_KUBERNETES
    if ip is not None and ip.is_loopback and mode != "none" and enabled:
        fail("gpukit_metrics_listen_address", f"serves only the node itself, and Prometheus "
             f"({mode}) scrapes it from elsewhere: use 0.0.0.0 or the node's own address")
    if not enabled and mode != "none":
        fail("gpukit_metrics_enabled", f"is false, yet gpukit_metrics_prometheus is {mode}: "
             "there would be nothing to scrape")
    return MetricsDecl(enabled=enabled, listen_address=str(listen), port=port,
                       scrape_interval=interval, prometheus=str(mode),
                       auth=str(auth)), problems


def cluster_problems(nodes: Sequence[tuple[str, MetricsDecl]]) -> list[Problem]:
    """One DaemonSet and one Prometheus serve every GPU node: their settings must agree
    `nodes` are (host, declaration) pairs; the first host's values are the reference."""
    if not nodes:
        return []
    first_host, first = nodes[0]
    ref = first.as_dict()
    problems: list[Problem] = []
    for host, decl in nodes[1:]:
        mine = decl.as_dict()
        for name in CLUSTER_WIDE:
            key = name.removeprefix("gpukit_metrics_")
            if mine[key] != ref[key]:
                problems.append(Problem(host, name, mine[key], f"differs from host {first_host}'s "
                                        f"{ref[key]!r}: the one agent DaemonSet and Prometheus "
                                        "serve every GPU node alike"))
    return problems


def agent_address(hostvars: Mapping[str, Any]) -> str:
    """The agent's metrics address from one host's variables (the device_plugin role's
    DaemonSet); invalid variables raise ValueError naming them (the preflight refused them
    already when it ran)."""
    decl, problems = declared(None, hostvars)
    if problems:
        raise ValueError("; ".join(str(p) for p in problems))
    return decl.agent_address
