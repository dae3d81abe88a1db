"""Runs the device plugin: config -> discovery -> resources -> one gRPC server per resource.

One background loop (every `tick` seconds, `idle_ticks` of them while everything it must act on
at once wakes it) keeps the node and the kubelet in step:
- kubelet.sock re-created (the kubelet restarted) -> re-register every resource; a plugin socket
  removed (the kubelet wipes the directory on start) -> serve it again and re-register. An
  inotify watch on the kubelet dir (dir_watch.py) wakes the loop at once for both, so the node
  is back to its GPUs in milliseconds, not a tick later; the tick still catches what it missed.
- rescan every `rescanIntervalSeconds` (and on request: SIGUSR1, or after a MIG change): GPUs
  and MIG devices are enumerated again, resources rebuilt and reconciled without a restart;
  a resource that disappears first reports zero devices, then its socket goes.
- reload on request (SIGHUP) or when the selected config changes (node label, file content):
  an invalid new config is reported (log, metric, node label, Event) and the running one kept;
  every good one is recorded on the node, so a restart into bad input serves the last good
  config instead of crash-looping with the node at 0 GPUs (see last_good.py);
- node labels re-asserted: a watch on the own Node restores drifted owned labels within a
  tick, and all are re-asserted every `label_reassert_seconds` (as GFD rewrites its labels).
SIGHUP/SIGUSR1 requests, label drift and the MIG manager's pause file (watched like the kubelet
dir) wake the loop at once. Health changes from the NVML event loop update ListAndWatch
immediately.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from gpukit.contracts import label_names as ln
from gpukit.contracts.plugin_config import Config, ConfigError

from . import cdi, nvml
from .allocate import Allocator
from .api import KUBELET_SOCKET_NAME
from .config_keeper import ConfigKeeper
from .config_source import ConfigSource, LoadedConfig
from .declaration_watch import DeclarationWatch
from .devices import NodeDevices
from .dir_watch import DirWatch
from .health import HealthMonitor, HealthTracker, effective_ignored_xids
from .kubelet_registration import KubeletRegistration, RegisterFn
from .label_publisher import LabelPublisher
from .labels import compute_labels
from .metrics import PluginMetrics
from .mig.pause import PauseWatcher
from .mps import MpsLayout, mps_layout
from .mps_daemons import MpsControl
from .mps_requests import mps_control
from .node_api import NodeClient
from .nvml_backend import InitError as InitError
from .nvml_backend import NvmlBackend as NvmlBackend
from .nvml_backend import PynvmlBackend as PynvmlBackend
from .nvml_backend import no_compute_mode, no_reading
from .resources import Resource, ResourceError, ResourceSet, Unit, build_resources
from .served import Served
from .server import DeviceView, PluginServer, ResourceState, inode, register

log = logging.getLogger(__name__)


@dataclass
class ManagerOptions:
    proc_root: str = "/"
    tick: float = 0.5
    # While every change the loop must act on at once wakes it (the kubelet dir and the pause
    # file watched, label drift, requests) and nothing waits for a retry, it sleeps this many
    # ticks: what is left (config polls, re-assertions, rescans) is periodic anyway.
    idle_ticks: int = 4
    config_poll_seconds: float = 10.0
    register_retry_seconds: float = 3.0
    register_timeout: float = 5.0
    nvml_retry_seconds: float = 30.0
    labels_file: str | None = None
    node_labels: bool = False
    health: bool = True
    pause_file: str | None = None  # the MIG manager's pause file (gpukit.plugin.mig.hooks)
    last_good_file: str | None = None  # the last good config record (last_good.py)
    declaration_dir: str | None = None  # the nodes' declarations (declaration_watch.py)
    label_reassert_seconds: float = 60.0
    # A registered resource with no ListAndWatch stream for this long was dropped by the
    # kubelet: registered again (see `_dropped_by_kubelet`).
    stream_grace_seconds: float = 15.0
    # How long the GPU metrics reuse the kubelet's PodResources answer (pod attribution);
    # None: podresources.DEFAULT_TTL.
    pod_resources_ttl: float | None = None
    # Who runs the MPS daemons: "own" (this process: a host service) or "delegate" (gpukit's
    # MPS control container: the hardened DaemonSet container cannot open the GPUs);
    # gpukit.plugin.mps_requests.mps_control.
    mps_daemons: str = "own"


class PluginManager:
    def __init__(
        self,
        source: ConfigSource,
        backend: NvmlBackend,
        metrics: PluginMetrics | None = None,
        options: ManagerOptions | None = None,
        register_fn: RegisterFn = register,
        node_client: NodeClient | None = None,
    ) -> None:
        self.source = source
        self.backend = backend
        self.metrics = metrics or PluginMetrics()
        self.options = options or ManagerOptions()
        self.register_fn = register_fn
        self.node_client = node_client
        self.loaded: LoadedConfig | None = None
        self.devices = NodeDevices()
        self.resources = ResourceSet(resources={})
        self.servers: dict[str, PluginServer] = {}
        # Retired resources whose sockets close shortly (see `_retire`), by name.
        self._retiring: dict[str, tuple[PluginServer, threading.Timer]] = {}
        self.tracker = HealthTracker((), None)
        self.monitor: HealthMonitor | None = None
        self.nvml_ready = False
        self._health_enabled = self.options.health
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._wake = threading.Event()  # run the loop now (kubelet dir change, stop)
        self.kubelet_dir_watch = DirWatch(self._wake.set)
        self._reload_requested = threading.Event()
        self._rescan_requested = threading.Event()
        self._loop: threading.Thread | None = None
        self.registration = KubeletRegistration(
            register_fn, self.metrics, self.options.register_timeout,
            self.options.register_retry_seconds, self.options.stream_grace_seconds)
        self._next_serve_retry = 0.0
        self._next_rescan = 0.0
        self._next_config_poll = 0.0
        self._next_nvml_retry = 0.0
        self._config_fingerprint: tuple[object, ...] = ()
        self.configs = ConfigKeeper(source, self.metrics, node_client,
                                    self.options.last_good_file)
        self.labels = LabelPublisher(self.metrics, node_client, source.node_name or "",
                                     self.options, on_drift=self._wake.set)
        self.declaration = DeclarationWatch(self.options.declaration_dir,
                                            source.node_name or "", self.metrics, node_client)
        self._last_cdi: dict[str, object] | None = None
        mps = mps_control(self.options.mps_daemons,
                          getattr(backend, "set_compute_mode", no_compute_mode))
        if mps is None:
            raise ValueError("the node agent needs someone to run its MPS daemons "
                             "(--mps-daemons own or delegate)")
        self.mps: MpsControl = mps
        self.mps_layout: MpsLayout | None = None  # None: no GPU shared through MPS
        self.pause = PauseWatcher(self.options.pause_file) if self.options.pause_file else None
        # The MIG manager's pause wakes the loop (written by rename, removed by unlink).
        self.pause_watch = (DirWatch(self._wake.set, "MIG manager pauses", "gpukit-pause-dir")
                            if self.pause is not None else None)
        self.metrics.readiness = self.readiness
        self._gpu_metrics_added = False

    # -- properties ---------------------------------------------------------------------------

    @property
    def config_failure(self) -> str | None:
        """Why the selected config is refused while an older one is served; None when fine."""
        return self.configs.failure

    @property
    def config(self) -> Config:
        return self.loaded.config if self.loaded else Config()

    @property
    def kubelet_dir(self) -> str:
        return self.config.gpukit.kubelet_dir

    @property
    def kubelet_socket(self) -> str:
        return os.path.join(self.kubelet_dir, KUBELET_SOCKET_NAME)

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Load config, init NVML, serve and register. Raises ConfigError (with no last good
        config to fall back on) or InitError."""
        # Fingerprinted before reading: a file rewritten while it is read (an editor's
        # truncate, then write) differs at the next poll and is read again.
        seen = self.source.fingerprint()
        try:
            loaded = self.source.load()
        except ConfigError as exc:
            loaded = self.configs.last_good_or_raise(exc)
        else:
            self.configs.accepted(loaded)
        self._set_config(loaded)
        self._config_fingerprint = seen
        self.kubelet_dir_watch.ensure(self.kubelet_dir)
        self._watch_pause()
        self._init_nvml(startup=True)
        self.rescan(startup=True)
        self._loop = threading.Thread(target=self._run, name="gpukit-manager", daemon=True)
        self._loop.start()
        self.labels.start_watch(self._stop)
        self._add_gpu_metrics()

    def _add_gpu_metrics(self) -> None:
        """The per-GPU telemetry collector, once, after the first registration: its modules
        (the DCGM field table, the PodResources stubs) are not on the way to the kubelet."""
        if self._gpu_metrics_added:
            return
        self._gpu_metrics_added = True
        from . import podresources
        from .gpu_metrics import GpuMetricsCollector, GpuMetricsSources

        ttl = self.options.pod_resources_ttl
        pod_resources = podresources.PodResourcesCache(
            lambda: podresources.list_holders(podresources.socket_path(self.kubelet_dir)),
            ttl=podresources.DEFAULT_TTL if ttl is None else ttl)
        backend = self.backend
        self.metrics.add_collector(GpuMetricsCollector(GpuMetricsSources(
            devices=lambda: self.devices, nvml_ready=lambda: self.nvml_ready,
            holders=pod_resources.holders, last_xid=self.metrics.last_xids,
            hostname=self.source.node_name or socket.gethostname(),
            read_gpu=getattr(backend, "read_gpu", no_reading),
            read_mig=getattr(backend, "read_mig", no_reading))))

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        # A SIGTERM at startup can interrupt Thread.start() before it saw its thread run: join
        # then raises; such a thread sees _stop set and ends by itself.
        if self._loop is not None and self._loop.ident is not None and self._loop.is_alive():
            self._loop.join(timeout=10)
        self.kubelet_dir_watch.stop()
        if self.pause_watch is not None:
            self.pause_watch.stop()
        if self.monitor is not None:
            self.monitor.stop()
            self.monitor = None
        with self._lock:
            for server in self.servers.values():
                server.stop()
            self.servers.clear()
            for server, timer in self._retiring.values():
                timer.cancel()
                server.stop()
            self._retiring.clear()
        if self.nvml_ready:
            self.backend.shutdown()
            self.nvml_ready = False

    def wait(self, timeout: float | None = None) -> bool:
        return self._stop.wait(timeout)

    def request_stop(self) -> None:
        """Safe from a signal handler: the caller's wait() returns, then it calls stop()."""
        self._stop.set()
        self._wake.set()

    def request_reload(self) -> None:
        self._reload_requested.set()
        self._wake.set()

    def request_rescan(self) -> None:
        self._rescan_requested.set()
        self._wake.set()

    # -- config and NVML ----------------------------------------------------------------------

    def _set_config(self, loaded: LoadedConfig) -> None:
        for warning in loaded.config.warnings:
            log.warning("config: %s", warning)
        self.loaded = loaded
        enabled, ignored = effective_ignored_xids(loaded.config.gpukit.health)
        self.tracker.ignored = ignored
        self.tracker.recovery = loaded.config.gpukit.health.recovery_seconds
        self._health_enabled = enabled and self.options.health
        log.info("config %s: migStrategy=%s deviceListStrategy=%s sharing=%s",
                 f"{loaded.name or 'file'} ({loaded.path})" if loaded.path else "defaults",
                 loaded.config.flags.mig_strategy,
                 ",".join(loaded.config.flags.plugin.device_list_strategy),
                 loaded.config.sharing_strategy)

    def _init_nvml(self, startup: bool = False) -> None:
        try:
            self.backend.init()
        except nvml.NvmlError as exc:
            self.metrics.errors.labels(kind="nvml").inc()
            if startup and self.config.flags.fail_on_init_error:
                raise InitError(
                    f"NVML initialisation failed: {exc}. Set flags.failOnInitError=false (or "
                    "FAIL_ON_INIT_ERROR=false) to keep running without GPUs."
                ) from exc
            if startup:
                log.error("NVML initialisation failed: %s; serving no devices "
                          "(failOnInitError=false), retrying every %.0fs", exc,
                          self.options.nvml_retry_seconds)
            self._next_nvml_retry = time.monotonic() + self.options.nvml_retry_seconds
            return
        self.nvml_ready = True
        log.info("NVML initialised")

    def reload(self) -> bool:
        """Re-read the config; keep the running one if the new one is invalid."""
        # Fingerprinted before reading (as at start): a write that ends after the read is a
        # change the next poll sees, not the input just judged.
        seen = self.source.fingerprint()
        try:
            loaded = self.source.load()
        except ConfigError as exc:
            self.metrics.config_reloads.labels(result="rejected").inc()
            # Noted as seen: the same bad input is not retried every poll, and a selection
            # back to the running config is a change that reloads (and clears the failure).
            self._config_fingerprint = seen
            self.configs.refused(exc, "keeping the current config")
            self.labels.publish(self._wanted_labels)
            return False
        self.configs.accepted(loaded)
        self._config_fingerprint = seen
        with self._lock:
            old = self.config
            self._set_config(loaded)
            if old.gpukit.kubelet_dir != self.kubelet_dir:
                log.info("kubelet dir changed to %s: restarting all servers", self.kubelet_dir)
                for server in self.servers.values():
                    server.stop()
                self.servers.clear()
                self.registration.forget_kubelet()
            if old.gpukit.metrics_address != self.config.gpukit.metrics_address:
                log.warning("metricsAddress changes take effect at the next restart")
        self.metrics.config_reloads.labels(result="ok").inc()
        self.rescan()
        return True

    # -- discovery and reconcile --------------------------------------------------------------

    def _discover(self) -> NodeDevices | None:
        if not self.nvml_ready:
            if time.monotonic() < self._next_nvml_retry:
                return None
            self._init_nvml()
            if not self.nvml_ready:
                return None
        old = self.devices
        try:
            found = self.backend.discover(with_topology=not old.links)
        except nvml.NvmlError as exc:
            log.error("GPU discovery failed, keeping the previous view: %s", exc)
            self.metrics.errors.labels(kind="nvml").inc()
            return None
        if found.lost_indices:  # keep lost GPUs advertised (Unhealthy) instead of dropping them
            carried = [g for g in old.gpus if g.index in found.lost_indices]
            found = replace(found, gpus=tuple(sorted(found.gpus + tuple(carried),
                                                 key=lambda g: g.index)))
        same_gpus = {g.uuid for g in found.gpus} == {g.uuid for g in old.gpus}
        if not found.links and old.links and same_gpus:
            found = replace(found, links=old.links)
        elif not found.links and not same_gpus and len(found.gpus) > 1:
            try:
                found = replace(found, links=self.backend.discover(with_topology=True).links)
            except nvml.NvmlError as exc:
                log.warning("topology discovery failed: %s", exc)
        return found

    def rescan(self, startup: bool = False) -> None:
        found = self._discover()
        with self._lock:
            if found is not None:
                self.devices = found
            try:
                rs = build_resources(self.devices, self.config, self.options.proc_root)
            except ResourceError as exc:
                self.metrics.errors.labels(kind="resources").inc()
                if startup and self.config.flags.fail_on_init_error:
                    raise InitError(f"cannot serve this node's devices: {exc}") from exc
                log.error("cannot serve this node's devices, serving none: %s", exc)
                rs = ResourceSet(resources={})
            for warning in rs.warnings:
                log.warning("%s", warning)
            if rs.resources != self.resources.resources or startup:
                log.info("resources: %s", ", ".join(
                    f"{n}={len(r.devices)}" for n, r in rs.resources.items()) or "none")
            self.resources = rs
            self._reconcile_mps()
            self._reconcile()
            self._write_cdi()
        self._apply_health()
        self._register_pending()  # before the labels: a node API round trip can wait
        self.labels.publish(self._wanted_labels)
        self._next_rescan = time.monotonic() + self.config.gpukit.rescan_interval_seconds

    def _views(self, resource: Resource) -> list[DeviceView]:
        pause = self.pause
        # A replica shared through MPS is offered healthy only while its GPU's daemon serves.
        no_mps = self.mps.problems.keys() if self.mps_layout is not None else set()
        return [DeviceView(d.id, self.tracker.unit_healthy(d.unit)
                           and not (pause is not None and pause.covers(d.unit.gpu.uuid))
                           and not (d.is_replica and d.unit.gpu.uuid in no_mps),
                           d.unit.numa_node)
                for d in resource.devices]

    def _reconcile_mps(self) -> None:
        """MPS daemons before the replicas they serve are (re)offered; also stops what a
        previous config or agent left running."""
        root = self.config.flags.mps_root
        if self.config.sharing_strategy == "mps":
            layout = mps_layout(self.resources, root)
        else:
            layout = MpsLayout(root=root, shares={})
        # Keys of the device plugin's daemons are GPU UUIDs; the DRA plugin's are claim-<uid>.
        self.mps.reconcile(root, layout.daemons(), prefix="GPU-")
        self.mps_layout = layout if layout.shares else None

    def _reconcile(self) -> None:
        wanted = self.resources.resources
        policy = self.config.gpukit.replica_policy
        for name in [n for n in self.servers if n not in wanted]:
            self._retire(name)
        for name, res in wanted.items():
            allocator = Allocator(res, self.config, mps=self.mps_layout)
            views = self._views(res)
            server = self.servers.get(name)
            if server is None and name in self._retiring:
                # Back before its socket closed: serve on with the same server. A new one on
                # the same socket path would register while the kubelet still holds the old
                # connection; from 1.36 the kubelet refuses that ("device plugin already
                # connected") and, once the old stream ends, keeps a stale endpoint that
                # refuses every later registration of the resource until it restarts.
                server, timer = self._retiring.pop(name)
                timer.cancel()
                self.servers[name] = server
                log.info("resource %s is back: serving on %s", name, server.path)
            if server is not None:
                server.state.update(res, allocator, self.devices, views, policy)
                continue
            state = ResourceState(res, allocator, self.devices, views, policy)
            server = PluginServer(state, self.kubelet_dir, self.metrics)
            try:
                server.start()
            except OSError as exc:
                log.error("cannot serve %s: %s", name, exc)
                self.metrics.errors.labels(kind="serve").inc()
                continue
            self.servers[name] = server
            self.registration.want(name)
        self._update_device_metrics()

    def _retire(self, name: str) -> None:
        """Tell the kubelet the resource has no devices, then close its socket shortly after
        (closing at once could cut the stream before the empty list is sent)."""
        server = self.servers.pop(name)
        self.registration.forget(name)
        empty = Resource(name=name, devices=())
        server.state.update(empty, Allocator(empty, self.config), self.devices, [],
                            self.config.gpukit.replica_policy)
        log.info("resource %s is gone: reporting zero devices and closing its socket", name)
        timer = threading.Timer(1.0, self._close_retired, (name, server))
        timer.daemon = True
        self._retiring[name] = (server, timer)
        timer.start()

    def _close_retired(self, name: str, server: PluginServer) -> None:
        with self._lock:
            if self._retiring.get(name, (None,))[0] is not server:
                return  # served again meanwhile
            del self._retiring[name]
        server.stop()

    def refresh_health(self) -> None:
        """Called by the health monitor after a transition."""
        with self._lock:
            for name, server in self.servers.items():
                res = self.resources.resources.get(name)
                if res is None:
                    continue
                state = server.state
                state.update(res, state.allocator, self.devices, self._views(res),
                             state.replica_policy)
            self._update_device_metrics()

    def _update_device_metrics(self) -> None:
        counts: dict[str, dict[str, int]] = {}
        for name, res in self.resources.resources.items():
            healthy = sum(self.tracker.unit_healthy(d.unit) for d in res.devices)
            counts[name] = {"Healthy": healthy, "Unhealthy": len(res.devices) - healthy}
        self.metrics.set_devices(counts)
        self.metrics.set_unit_health(
            (uuid, self.tracker.unit_healthy(u)) for uuid, u in self.resources.units().items()
        )

    def served(self) -> Served:
        """What the node serves for the served-vs-declared watchdog: per resource the devices
        the kubelet may allocate (healthy, not paused), and a config fallback."""
        with self._lock:
            counts = {name: sum(v.healthy for v in self._views(res))
                      for name, res in self.resources.resources.items()}
        return Served(counts, self.config_failure)

    def units(self) -> dict[str, Unit]:
        with self._lock:
            return self.resources.units()

    def _apply_health(self) -> None:
        """Make the health monitor match the config: start, stop or retune it. Runs after
        every rescan, so a reload applies `gpukit.health` without a restart (ignoredXids and
        recoverySeconds live in the shared tracker, set by `_set_config`)."""
        want = self.nvml_ready and self._health_enabled
        interval = self.config.gpukit.health.probe_interval_seconds
        monitor = self.monitor
        if monitor is not None and not want:
            self.monitor = None
            monitor.stop()
            # Said once it is true: the monitor's thread has ended and its event set is freed.
            log.info("health checks disabled: health monitor stopped")
            # Nothing watches the devices now: an XID or lost GPU seen before must not keep
            # them Unhealthy for good (disabled checks report every device Healthy).
            self.tracker.clear()
            self.refresh_health()
        elif monitor is not None:
            if monitor.probe_interval != interval:
                log.info("health probe interval now %gs", interval)
                monitor.retune(interval)
        elif want:
            self.monitor = HealthMonitor(self.tracker, self.units, self.refresh_health,
                                         probe_interval=interval, on_xid=self.metrics.count_xid)
            self.monitor.start()
            log.info("health monitor started (probe interval %gs)", interval)

    # -- CDI and labels -----------------------------------------------------------------------

    def _write_cdi(self) -> None:
        config = self.config
        if not {"cdi-annotations", "cdi-cri"} & set(config.flags.plugin.device_list_strategy):
            return
        # The driver's files as nvidia-ctk finds them (every *.so.<driver version>), under
        # the driver root as the agent sees it.
        spec = cdi.agent_spec(self.resources.units().values(), config,
                              self.devices.driver_version)
        if spec == self._last_cdi:
            return
        try:
            path = cdi.write_spec(spec, config.gpukit.cdi_spec_dir)
        except OSError as exc:
            log.error("cannot write the CDI spec to %s: %s", config.gpukit.cdi_spec_dir, exc)
            self.metrics.errors.labels(kind="cdi").inc()
            return
        self._last_cdi = spec
        log.info("CDI spec written to %s (%d devices)", path, len(spec["devices"]))

    def _wanted_labels(self) -> dict[str, str]:
        labels = compute_labels(self.devices, self.config)
        if self.source.config_dir is not None:  # a selection by node label that may fail
            labels[ln.DEVICE_PLUGIN_CONFIG_STATE] = (
                ln.CONFIG_STATE_FAILED if self.config_failure else ln.CONFIG_STATE_SUCCESS)
        return labels

    # -- kubelet ------------------------------------------------------------------------------

    def _register_pending(self) -> None:
        def endpoints(names: Sequence[str]) -> list[tuple[str, str]]:
            with self._lock:
                return [(n, self.servers[n].endpoint) for n in names if n in self.servers]
        self.registration.register_pending(self.kubelet_socket, endpoints)

    def check_kubelet(self) -> None:
        """Re-serve removed sockets; re-register everything when kubelet.sock is new."""
        self.kubelet_dir_watch.ensure(self.kubelet_dir)
        with self._lock:
            missing = set(self.resources.resources) - set(self.servers)
            if missing and time.monotonic() >= self._next_serve_retry:
                # a server that could not start, e.g. the kubelet dir did not exist yet
                self._next_serve_retry = time.monotonic() + self.options.register_retry_seconds
                self._reconcile()
            for name, server in self.servers.items():
                if not server.socket_intact():
                    log.warning("socket for %s was removed (kubelet restart?): serving again",
                                name)
                    try:
                        server.restart()
                    except OSError as exc:
                        log.error("cannot serve %s again: %s", name, exc)
                        continue
                    self.registration.want(name)
            if self.registration.kubelet_restarted(self.kubelet_socket):
                self.registration.want(*self.servers)
            elif inode(self.kubelet_socket) is not None:
                self.registration.dropped(self.servers)
        self._register_pending()

    def readiness(self) -> tuple[bool, str]:
        """(ready, why) for /readyz: every current resource is served, registered with the
        kubelet, and the kubelet has its ListAndWatch stream open (it took the device list).
        No resources (no GPUs, or NVML down with failOnInitError false) is ready: the
        agent serves all there is, and a DaemonSet rollout must not stall on such a node."""
        problems: list[str] = []
        with self._lock:
            names = sorted(self.resources.resources)
            for name in names:
                server = self.servers.get(name)
                if server is None or not server.socket_intact():
                    problems.append(f"{name}: not serving its socket")
                elif not self.registration.is_registered(name):
                    problems.append(f"{name}: not registered with the kubelet")
                elif server.state.streamless_since() is not None:
                    problems.append(f"{name}: registered, the kubelet has no ListAndWatch open")
            problems.extend(f"MPS: {why}" for why in self.mps.problems.values())
        if problems and inode(self.kubelet_socket) is None:
            problems.append(f"no kubelet socket at {self.kubelet_socket}")
        if problems:
            return False, "; ".join(problems)
        return True, f"{len(names)} resource(s) registered: {', '.join(names) or 'none'}"

    def _watch_pause(self) -> None:
        if self.pause is not None and self.pause_watch is not None:
            self.pause_watch.ensure(os.path.dirname(os.path.abspath(self.pause.path)))

    def _next_wait(self) -> float:
        """The tick, or `idle_ticks` of them while nothing needs polling (see ManagerOptions)."""
        tick = self.options.tick
        pause, pause_watch = self.pause, self.pause_watch
        watched = self.kubelet_dir_watch.watching and (
            pause is None or (pause_watch is not None and pause_watch.watching
                              and not pause.paused))
        if not watched:
            return tick
        with self._lock:
            settled = (not self.registration.pending and not self._retiring
                       and set(self.resources.resources) <= set(self.servers))
        return tick * max(1, self.options.idle_ticks) if settled else tick

    def _run(self) -> None:
        while True:
            self._wake.wait(self._next_wait())
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.check_kubelet()
                self.declaration.check(self.served)  # also while paused for a MIG change
                if self.pause is not None:
                    self._watch_pause()
                    if self.pause.poll():
                        if self.pause.paused:  # MIG change starting: its GPUs Unhealthy now
                            self.refresh_health()
                        else:  # MIG change done: re-enumerate at once
                            self._rescan_requested.set()
                    if self.pause.paused:
                        continue  # no rescan or reload mid-change; requests stay queued
                now = time.monotonic()
                if self.source.config_dir is not None and now >= self._next_config_poll:
                    self._next_config_poll = now + self.options.config_poll_seconds
                    if self.source.fingerprint() != self._config_fingerprint:
                        log.info("selected config changed: reloading")
                        self._reload_requested.set()
                if self._reload_requested.is_set():
                    self._reload_requested.clear()
                    self.reload()
                    continue
                if self.labels.due(now):
                    self.labels.publish(self._wanted_labels, reassert=True)
                interval = self.config.gpukit.rescan_interval_seconds
                due = interval > 0 and now >= self._next_rescan
                if self._rescan_requested.is_set() or due:
                    self._rescan_requested.clear()
                    self.rescan()
            except Exception:  # the loop must survive anything a node can throw at it
                log.exception("manager loop error; continuing")
