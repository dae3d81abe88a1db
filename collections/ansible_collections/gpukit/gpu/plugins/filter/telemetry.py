"""gpukit.gpu filters for the GPU telemetry (gpukit.provision.telemetry): the agent's metrics
address and auth for the device_plugin role's DaemonSet; role gpu_telemetry's Prometheus config,
operator objects and the scraper's identity.
Documentation: <filter>.yml beside this file (ansible-doc -t filter gpukit.gpu.<filter>)."""

from __future__ import annotations

from ansible_collections.gpukit.gpu.plugins.plugin_utils import gpukit_filters as gk

telemetry = gk.library("gpukit.provision.telemetry")


@gk.gpukit_filter
def metrics_agent_address(hostvars, host):
    return telemetry.agent_address(host, hostvars or {})


@gk.gpukit_filter
def metrics_agent_auth(hostvars, host):
    return telemetry.agent_auth(host, hostvars or {})


@gk.gpukit_filter
def metrics_prometheus_config(gpu_hosts, hostvars, rules_dir="/etc/prometheus", auth=None):
    return telemetry.prometheus_config(list(gpu_hosts or []), hostvars, rules_dir, auth)


@gk.gpukit_filter
def metrics_alert_rules(_ignored=None):
    return telemetry.alert_rules()


@gk.gpukit_filter
def metrics_cluster(gpu_hosts, hostvars):
    return telemetry.cluster(list(gpu_hosts or []), hostvars)


@gk.gpukit_filter
def metrics_operator_manifests(namespace, mode, port, interval, auth="kubernetes"):
    return telemetry.operator_manifests(namespace, mode, int(port), interval, auth)


@gk.gpukit_filter
def metrics_scraper(namespace):
    return telemetry.scraper(namespace)


class FilterModule:
    def filters(self):
        return gk.filter_map(metrics_agent_address, metrics_agent_auth,
                             metrics_prometheus_config, metrics_alert_rules,
                             metrics_cluster, metrics_operator_manifests, metrics_scraper)
