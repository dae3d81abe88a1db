"""Who may read gpukit's GPU metrics: the modes the inventory (`gpukit_metrics_auth`), the
rendered DaemonSets (GPUKIT_METRICS_AUTH) and the agent (gpukit/plugin/metrics_auth.py) share,
and what a scraper must be allowed: the attributes the kubelet checks for its own /metrics, so
a Prometheus that may scrape kubelets may scrape gpukit's agents."""

from __future__ import annotations

AUTH_KUBERNETES = "kubernetes"  # each scrape's bearer token reviewed by the API server
AUTH_NONE = "none"  # anyone who reaches the port
MODES = (AUTH_KUBERNETES, AUTH_NONE)
ENV = "GPUKIT_METRICS_AUTH"
VERB = "get"
RESOURCE = "nodes"
SUBRESOURCE = "metrics"
# The RBAC rule that grants it (a scraper's ClusterRole).
SCRAPER_RULE = {"apiGroups": [""], "resources": [f"{RESOURCE}/{SUBRESOURCE}"], "verbs": [VERB]}
