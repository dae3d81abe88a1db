"""Prometheus metrics for the device plugin, on a registry of its own.

Labels carry only resource names, device IDs (GPU/MIG UUIDs), XID numbers and error kinds:
nothing from the config file or the environment, so the endpoint exposes no secrets.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from .config import parse_host_port

log = logging.getLogger(__name__)


class PluginMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.devices = Gauge(
            "gpukit_plugin_devices", "Devices advertised to the kubelet, by resource and health",
            ["resource", "health"], registry=r,
        )
        self.device_healthy = Gauge(
            "gpukit_plugin_device_healthy", "1 when a GPU or MIG device is healthy",
            ["device"], registry=r,
        )
        self.allocations = Counter(
            "gpukit_plugin_allocations", "Allocate container requests answered",
            ["resource", "result"], registry=r,
        )
        self.allocated_devices = Counter(
            "gpukit_plugin_allocated_devices", "Device IDs handed out by Allocate",
            ["resource"], registry=r,
        )
        self.xids = Counter(
            "gpukit_plugin_xid_events", "XID events seen", ["device", "xid", "critical"],
            registry=r,
        )
        self.errors = Counter(
            "gpukit_plugin_errors", "Errors by kind (nvml, config, register, resources, cdi)",
            ["kind"], registry=r,
        )
        self.registrations = Counter(
            "gpukit_plugin_registrations", "Registrations with the kubelet",
            ["resource", "result"], registry=r,
        )
        self.device_lists = Counter(
            "gpukit_plugin_device_lists_sent", "ListAndWatch responses sent to the kubelet",
            ["resource", "reason"], registry=r,
        )
        self.config_reloads = Counter(
            "gpukit_plugin_config_reloads", "Config reloads", ["result"], registry=r,
        )

    def set_devices(self, counts: Mapping[str, Mapping[str, int]]) -> None:
        """counts: resource -> {"Healthy": n, "Unhealthy": m}; resources gone are zeroed."""
        self.devices.clear()
        for resource, by_health in counts.items():
            for health, n in by_health.items():
                self.devices.labels(resource=resource, health=health).set(n)

    def set_unit_health(self, health: Iterable[tuple[str, bool]]) -> None:
        self.device_healthy.clear()
        for uuid, ok in health:
            self.device_healthy.labels(device=uuid).set(1 if ok else 0)

    def serve(self, address: str) -> None:
        """Start the HTTP endpoint at host:port ("" disables it)."""
        if not address:
            return
        host, port = parse_host_port(address)
        start_http_server(port, addr=host, registry=self.registry)
        log.info("metrics on http://%s:%d/metrics", host, port)
