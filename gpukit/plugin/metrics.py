"""Prometheus metrics for the device plugin, on a registry of its own, and its readiness.

Labels carry only resource names, device IDs (GPU/MIG UUIDs), XID numbers and error kinds:
nothing from the config file or the environment, so the endpoint exposes no secrets. The GPU
metrics (dcgm-exporter's names, attributed to pods: gpukit/plugin/gpu_metrics.py) are a collector on
the same registry, computed at each scrape.

The same HTTP endpoint answers `/readyz` (the DaemonSet's readinessProbe): 200 when the
`readiness` callable (set by the manager) says every resource is registered and served, else
503; the body says why. Any other path is 404 (no exposition under every URL a scanner tries).

With an `authorizer` (gpukit/plugin/metrics_auth.py: `--metrics-auth kubernetes`) each /metrics
request is authenticated and authorised first (401, 403, or 503 when the API cannot say);
/readyz never is (the kubelet's probe carries no token).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from gpukit.contracts.plugin_config import parse_host_port

from .metrics_auth import Authorizer

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer
    from wsgiref.types import StartResponse, WSGIEnvironment

    from prometheus_client import CollectorRegistry, Counter, Gauge
    from prometheus_client.registry import Collector

log = logging.getLogger(__name__)
_STATUS_LINES = {401: "401 Unauthorized", 403: "403 Forbidden", 503: "503 Service Unavailable"}
Readiness = Callable[[], tuple[bool, str]]  # (ready, why)
READY_PATH = "/readyz"
METRICS_PATH = "/metrics"
# The metric attributes, made at first use (see PluginMetrics).
_METRICS = frozenset({
    "registry", "devices", "device_healthy", "allocations", "allocated_devices", "xids",
    "errors", "registrations", "device_lists", "config_reloads", "config_failed",
    "labels_restored", "gpus_declared", "gpus_served", "_metrics_app",
})


class PluginMetrics:
    """The agent's metrics. prometheus_client (and the HTTP stack it imports) is imported when
    a metric is first used, not when this is made: the agent builds this before registering
    with the kubelet, and registers before it touches a metric. Device counts set before then
    are kept and written when the metrics are made."""

    registry: CollectorRegistry
    devices: Gauge
    device_healthy: Gauge
    allocations: Counter
    allocated_devices: Counter
    xids: Counter
    errors: Counter
    registrations: Counter
    device_lists: Counter
    config_reloads: Counter
    config_failed: Gauge
    labels_restored: Counter
    gpus_declared: Gauge
    gpus_served: Gauge
    _metrics_app: Callable[..., Iterable[bytes]]

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        # The last XID per device (GPU or MIG UUID), whatever its class: DCGM_FI_DEV_XID_ERRORS.
        self.last_xid: dict[str, int] = {}
        self.readiness: Readiness | None = None
        # None: every scrape is served (--metrics-auth none); else each is checked first.
        self.authorizer: Authorizer | None = None
        self._server: WSGIServer | None = None
        self._make_lock = threading.Lock()
        self._made = False
        # Set before the metrics are made: (device counts, unit health, collectors).
        self._early_devices: Mapping[str, Mapping[str, int]] | None = None
        self._early_health: list[tuple[str, bool]] | None = None
        self._early_config_failed = False
        self._early_collectors: list[Collector] = []
        if registry is not None:  # the caller has prometheus_client already
            self._make(registry)

    def __getattr__(self, name: str) -> Any:
        # Only for attributes not set yet: the metrics before their first use.
        if name not in _METRICS:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        self._make(None)
        return object.__getattribute__(self, name)

    def _make(self, registry: CollectorRegistry | None) -> None:
        with self._make_lock:
            if self._made:
                return
            from prometheus_client import CollectorRegistry, Counter, Gauge, make_wsgi_app

            r = registry or CollectorRegistry()
            self.devices = Gauge(
                "gpukit_plugin_devices",
                "Devices advertised to the kubelet, by resource and health",
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
            self.config_failed = Gauge(
                "gpukit_plugin_config_failed",
                "1 while the selected config is refused and an earlier one is served",
                registry=r,
            )
            self.labels_restored = Counter(
                "gpukit_plugin_labels_restored", "Owned node labels found drifted and restored",
                registry=r,
            )
            # Served vs declared (served.py): per resource, what the node's declaration says
            # and what the agent serves healthy; equal while the node serves its declaration.
            self.gpus_declared = Gauge(
                "gpukit_node_gpus_declared",
                "Devices the node's declaration (the inventory) says it serves, by resource",
                ["resource"], registry=r,
            )
            self.gpus_served = Gauge(
                "gpukit_node_gpus_served", "Healthy devices the agent serves, by resource",
                ["resource"], registry=r,
            )
            self._metrics_app = make_wsgi_app(r)
            for collector in self._early_collectors:
                r.register(collector)
            self.registry = r
            # Under the lock: a later set_devices waits for it and writes after these.
            if self._early_devices is not None:
                self._write_devices(self._early_devices)
            if self._early_health is not None:
                self._write_health(self._early_health)
            self.config_failed.set(1 if self._early_config_failed else 0)
            self._early_devices, self._early_health, self._early_collectors = None, None, []
            self._made = True

    def count_xid(self, device: str, xid: int, critical: bool) -> None:
        """Every XID event, also those whose log lines are summarised (health.XidLog)."""
        self.xids.labels(device=device, xid=str(xid), critical=str(critical).lower()).inc()
        self.last_xid[device] = xid

    def last_xids(self) -> dict[str, int]:
        return dict(self.last_xid)

    def add_collector(self, collector: Collector) -> None:
        """A collector computed at scrape time (the GPU metrics, gpukit/plugin/gpu_metrics.py)."""
        with self._make_lock:
            if not self._made:
                self._early_collectors.append(collector)
                return
        self.registry.register(collector)

    def set_config_failed(self, failed: bool) -> None:
        """1 while the selected config is refused and an earlier one is served."""
        with self._make_lock:
            if not self._made:
                self._early_config_failed = failed
                return
        self.config_failed.set(1 if failed else 0)

    def set_devices(self, counts: Mapping[str, Mapping[str, int]]) -> None:
        """counts: resource -> {"Healthy": n, "Unhealthy": m}; resources gone are zeroed."""
        with self._make_lock:
            if not self._made:
                self._early_devices = counts
                return
        self._write_devices(counts)

    def _write_devices(self, counts: Mapping[str, Mapping[str, int]]) -> None:
        self.devices.clear()
        for resource, by_health in counts.items():
            for health, n in by_health.items():
                self.devices.labels(resource=resource, health=health).set(n)

    def set_declared_served(self, declared: Mapping[str, int], served: Mapping[str, int]
                            ) -> None:
        """Both gauges for every resource named (empty mappings: the node has no declaration,
        both series go)."""
        self.gpus_declared.clear()
        self.gpus_served.clear()
        for resource, n in declared.items():
            self.gpus_declared.labels(resource=resource).set(n)
        for resource, n in served.items():
            self.gpus_served.labels(resource=resource).set(n)

    def set_unit_health(self, health: Iterable[tuple[str, bool]]) -> None:
        with self._make_lock:
            if not self._made:
                self._early_health = list(health)
                return
        self._write_health(health)

    def _write_health(self, health: Iterable[tuple[str, bool]]) -> None:
        self.device_healthy.clear()
        for uuid, ok in health:
            self.device_healthy.labels(device=uuid).set(1 if ok else 0)

    def ready(self) -> tuple[bool, str]:
        if self.readiness is None:
            return False, "no readiness check installed"
        try:
            return self.readiness()
        except Exception as exc:  # a probe must get an answer, not a dropped connection
            log.exception("readiness check failed")
            return False, f"readiness check failed: {exc}"

    def app(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterator[bytes]:
        """WSGI: /metrics the Prometheus exposition (once the authorizer, if any, allows the
        request), /readyz the readiness, else 404."""
        path = environ.get("PATH_INFO")
        headers = [("Content-Type", "text/plain; charset=utf-8")]
        if path == METRICS_PATH:
            decision = (None if self.authorizer is None
                        else self.authorizer.authorize(environ.get("HTTP_AUTHORIZATION")))
            if decision is None or decision.allowed:
                yield from self._metrics_app(environ, start_response)
                return
            status = _STATUS_LINES.get(decision.status, f"{decision.status} Error")
            body = decision.why.encode()
            if decision.status == 401:
                headers.append(("WWW-Authenticate", 'Bearer realm="gpukit-node-agent"'))
        elif path == READY_PATH:
            ok, why = self.ready()
            status = "200 OK" if ok else "503 Service Unavailable"
            body = f"{'ok' if ok else 'not ready'}: {why}\n".encode()
        else:
            status = "404 Not Found"
            body = f"not found; this endpoint serves {METRICS_PATH} and {READY_PATH}\n".encode()
        start_response(status, [*headers, ("Content-Length", str(len(body)))])
        yield body

    def serve(self, address: str) -> tuple[str, int] | None:
        """Start the HTTP endpoint at host:port ("" disables it); returns where it listens."""
        if not address:
            return None
        host, port = parse_host_port(address)
        from . import metrics_http

        server = metrics_http.start(host, port, self.app)
        self._server = server
        log.info("metrics on http://%s:%d/metrics (%s), readiness on %s", host,
                 server.server_port,
                 "open to anyone" if self.authorizer is None else "scrapes authorised",
                 READY_PATH)
        return host, server.server_port

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
