"""The telemetry role's inputs from the play: the agent's metrics address, and the config of a
Prometheus on the monitoring hosts (`gpukit_metrics_prometheus: host`) that scrapes every GPU
node's agent where the inventory declares it, with the scraper's token (read from a file beside
the config, TOKEN_FILE) when `gpukit_metrics_auth` is `kubernetes`.

Each GPU host's `gpukit_metrics_*` are read from the preflight's `gpukit_declaration` fact when
it has them, otherwise validated now by the inventory model (gpukit.inventory.metrics)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from gpukit import monitoring, telemetry_manifests
from gpukit.agent_manifests import APP
from gpukit.contracts import metrics_auth
from gpukit.inventory import InventoryError
from gpukit.inventory import metrics as inv_metrics
from gpukit.inventory.problems import MISSING, Problem
from gpukit.provision.declaration import FACT

VARIABLES = inv_metrics.VARIABLES
JOB = APP  # the job the alert rules select: up{job="gpukit-node-agent"}
RULES_FILE = "gpukit-gpu-alerts.rules.yml"  # beside prometheus.yml
TOKEN_FILE = f"{telemetry_manifests.SCRAPER}.token"  # beside prometheus.yml: the scraper's token


def host_metrics(host: str, hostvars: Mapping[str, Any]) -> inv_metrics.MetricsDecl:
    """One GPU host's validated `gpukit_metrics_*` (InventoryError names host and variable)."""
    fact = hostvars.get(FACT)
    if isinstance(fact, Mapping) and isinstance(fact.get("metrics"), Mapping):
        m = fact["metrics"]
        return inv_metrics.MetricsDecl(
            enabled=bool(m["enabled"]), listen_address=str(m["listen_address"]),
            port=int(m["port"]), scrape_interval=str(m["scrape_interval"]),
            prometheus=str(m["prometheus"]), auth=str(m["auth"]))
    decl, problems = inv_metrics.declared(host, hostvars)
    if problems:
        raise InventoryError(problems)
    return decl


def agent_address(host: str, hostvars: Mapping[str, Any]) -> str:
    """GPUKIT_METRICS_ADDRESS of the agent DaemonSet ('' when metrics are off)."""
    return host_metrics(host, hostvars).agent_address


def agent_auth(host: str, hostvars: Mapping[str, Any]) -> str:
    """GPUKIT_METRICS_AUTH of the agent DaemonSet: who may read its metrics."""
    return host_metrics(host, hostvars).auth


def targets(gpu_hosts: Sequence[str], hostvars: Mapping[str, Mapping[str, Any]]
            ) -> list[dict[str, Any]]:
    """Prometheus static targets: each GPU node's agent at its declared address, labelled with
    its Kubernetes node name (the rules describe alerts by `node`)."""
    decls = [(h, host_metrics(h, hostvars[h])) for h in gpu_hosts]
    if problems := inv_metrics.cluster_problems(decls):
        raise InventoryError(problems)
    out = []
    for host, decl in decls:
        if not decl.enabled:
            continue
        hv = hostvars[host]
        node = str(hv.get("gpukit_node_name") or host)
        address = str(hv.get("ansible_host") or node)
        out.append({"targets": [decl.target(address)], "labels": {"node": node}})
    return out


def cluster(gpu_hosts: Sequence[str], hostvars: Mapping[str, Mapping[str, Any]]
            ) -> dict[str, Any]:
    """The GPU hosts' `gpukit_metrics_*` (validated; they must agree): what role gpu_telemetry
    deploys. No GPU host: the defaults."""
    decls = [(h, host_metrics(h, hostvars[h])) for h in gpu_hosts]
    if problems := inv_metrics.cluster_problems(decls):
        raise InventoryError(problems)
    return (decls[0][1] if decls else inv_metrics.MetricsDecl()).as_dict()


def _refused(e: ValueError) -> InventoryError:
    return InventoryError([Problem(None, "gpu_telemetry", MISSING, str(e))])


def operator_manifests(namespace: str, mode: str, port: int, interval: str,
                       auth: str = metrics_auth.AUTH_KUBERNETES) -> list[dict[str, Any]]:
    """The Prometheus operator's objects (telemetry_manifests.operator_objects), bad input
    named. With auth `kubernetes` they read the token of scraper(namespace)'s Secret."""
    try:
        return telemetry_manifests.operator_objects(namespace, mode, port, interval, auth)
    except ValueError as e:
        raise _refused(e) from e


def scraper(namespace: str) -> list[dict[str, Any]]:
    """The scraper's ServiceAccount, ClusterRole, binding and token Secret, bad input named."""
    try:
        return telemetry_manifests.scraper(namespace)
    except ValueError as e:
        raise _refused(e) from e


def prometheus_config(gpu_hosts: Sequence[str], hostvars: Mapping[str, Mapping[str, Any]],
                      rules_dir: str = "/etc/prometheus", auth: str | None = None) -> str:
    """prometheus.yml: gpukit's alert rules and one job over every GPU node's agent. `auth`
    (default: the GPU hosts' gpukit_metrics_auth) `kubernetes` sends the bearer token read from
    TOKEN_FILE in `rules_dir` (Prometheus reads it at each scrape: a new token needs no reload;
    promtool's config check needs the file to exist)."""
    static = targets(gpu_hosts, hostvars)
    first = host_metrics(gpu_hosts[0], hostvars[gpu_hosts[0]]) if gpu_hosts else None
    interval = first.scrape_interval if first else inv_metrics.DEFAULT_INTERVAL
    if auth is None:
        auth = first.auth if first else metrics_auth.AUTH_KUBERNETES
    if auth not in metrics_auth.MODES:
        raise _refused(ValueError(f"auth {auth!r} is not one of {', '.join(metrics_auth.MODES)}"))
    config_dir = rules_dir.rstrip("/")
    job: dict[str, Any] = {"job_name": JOB, "metrics_path": "/metrics"}
    if auth == metrics_auth.AUTH_KUBERNETES:
        job["authorization"] = {"type": "Bearer",
                                "credentials_file": f"{config_dir}/{TOKEN_FILE}"}
    job["static_configs"] = static
    doc = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [f"{config_dir}/{RULES_FILE}"],
        "scrape_configs": [
            {"job_name": "prometheus", "static_configs": [{"targets": ["localhost:9090"]}]},
            job,
        ],
    }
    header = "# Written by gpukit.gpu.gpu_telemetry from the inventory's gpukit_metrics_*.\n"
    return header + yaml.safe_dump(doc, sort_keys=False)


def alert_rules() -> str:
    """gpukit's alert rules as shipped (gpukit/monitoring)."""
    return monitoring.text(monitoring.RULES)
