"""What gpukit ships for watching GPUs: Prometheus alert rules (`gpu-alerts.rules.yaml`, with
their promtool unit tests `gpu-alerts.test.yaml`) and a Grafana dashboard (`gpu-dashboard.json`),
written against the node agent's metrics (dcgm-exporter's names: gpukit/plugin/gpu_metrics.py, and
its own gpukit_plugin_*). Package data, so the controller's gpukit (the roles' library) carries
them;
`gpukit.telemetry_manifests` wraps them for clusters with the Prometheus operator."""

from __future__ import annotations

from importlib import resources

RULES = "gpu-alerts.rules.yaml"
RULES_TESTS = "gpu-alerts.test.yaml"
DASHBOARD = "gpu-dashboard.json"


def text(name: str) -> str:
    """The shipped file's text (RULES, RULES_TESTS or DASHBOARD)."""
    if name not in (RULES, RULES_TESTS, DASHBOARD):
        raise ValueError(f"{name!r} is not one of gpukit's monitoring files "
                         f"({RULES}, {RULES_TESTS}, {DASHBOARD})")
    return resources.files(__name__).joinpath(name).read_text()
