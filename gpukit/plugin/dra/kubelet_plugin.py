"""The DRA plugin process: discovery, ResourceSlices, the kubelet's gRPC, health.

Every `rescan_interval` (and on SIGUSR1) it rediscovers the node's GPUs through the NVML layer
and the GPU instances' placements through the MIG backend's reader (a MIG layout change shows
up as new devices), shares every device between claims when the node's label says so
(node_shares.py), taints the devices the health monitor calls unhealthy (XIDs, lost GPUs:
device_taints.py) and clears the taints when they recover, and republishes when the device
list changed; every `resync_interval` it makes sure the API still holds its slices (the
kubelet wipes a driver's slices when its plugin was gone for a while). The gRPC sockets are
served again when someone removed them.

A DRA node runs no node agent, so this process runs the agent's served-vs-declared watchdog
(gpukit/plugin/declaration_watch.py: its node's declaration entry, `declaration_dir`, against
the healthy devices it publishes, after every loop turn: the node condition
GpuDeclarationMismatch, an Event, the gauges gpukit_node_gpus_declared/served) and serves the
agent's GPU metrics (dcgm-exporter's
names, gpukit/plugin/gpu_metrics.py; a MIG device a claim holds attributed through the names it
publishes) and its /readyz (`metrics`, served by the CLI). Scrapes run on the HTTP server's
threads and take the agent's lock only to copy the device lists: a slow NVML query or
PodResources List delays the scrape, never a prepare.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpukit.contracts import dra_dynamic_mig as dynamic_contract
from gpukit.contracts import dra_metadata
from gpukit.contracts import node_declaration as nd
from gpukit.contracts.dra import (
    CDI_DIR,
    KUBELET_DIR,
    PLUGIN_DIR,
    PLUGIN_SOCKET,
    REGISTRATION_SOCKET,
    REGISTRY_DIR,
    parse_device_name,
)
from gpukit.contracts.plugin_config import DEFAULT_MPS_ROOT, HealthSettings

from .. import cdi, node_api, nvml, podresources
from ..declaration_watch import DeclarationWatch
from ..devices import NodeDevices
from ..gpu_metrics import GpuMetricsCollector, GpuMetricsSources
from ..health import HealthMonitor, HealthTracker, effective_ignored_xids
from ..metrics import PluginMetrics
from ..mps_requests import mps_control
from ..nvml import compute_mode
from ..nvml.mig import PynvmlBackend as MigReader
from ..resources import Unit
from ..served import Served, Verdict, dra_served
from . import claim_status, device_taints, nvidia_claims
from .checkpoint import open_checkpoint
from .dynamic_mig import NvmlCarver, publish_gpu
from .health_stream import DeviceState, HealthBoard, HealthService
from .node_shares import read_node_shares
from .prepare import ClaimRef, Preparer
from .server import DraServer
from .slice_devices import Placement, SliceDevice, node_slice_devices, shared
from .slices import SlicePublisher

log = logging.getLogger(__name__)
COMPONENT = "gpukit-dra-plugin"  # its Events' source
POD_RESOURCES_SOCKET = podresources.socket_path(f"{KUBELET_DIR}/device-plugins")


@dataclass
class KubeletPluginOptions:
    node: str
    nvml_library: str | None = None
    device_root: str = "/"  # host prefix of /dev nodes and driver files
    device_root_in_plugin: str = "/"  # where this process sees that tree
    proc_root: str = "/"
    plugin_dir: str = PLUGIN_DIR
    registry_dir: str = REGISTRY_DIR
    cdi_dir: str = CDI_DIR
    rescan_interval: float = 10.0
    resync_interval: float = 30.0
    health: HealthSettings = field(default_factory=HealthSettings)
    pod_resources_socket: str = POD_RESOURCES_SOCKET  # the GPU metrics' pod attribution
    pod_resources_ttl: float = podresources.DEFAULT_TTL
    health_stream: bool = True  # serve the kubelet's DRA health stream (health_stream.py)
    mps_root: str = DEFAULT_MPS_ROOT  # the claims' MPS daemons (claim_mps.py)
    mps_daemons: str = "own"  # who runs them (gpukit.plugin.mps_requests.mps_control)
    # Each device shared by this many claims (consumable capacity); None: as the node's label
    # gpukit.io/dra.shares says (gpukit_dra_shares, set by the node_labels role), re-read at
    # every rescan; 0: not shared, whatever the label says.
    shares: int | None = None
    # The nodes' declarations (a mounted ConfigMap, one entry per node): served vs declared.
    declaration_dir: str | None = None
    # Dynamic MIG (gpukit_dra_dynamic_mig): GPU index -> the profiles carved on demand there;
    # None: as the node's declaration entry says (draDynamicMig), re-read at every rescan.
    dynamic_mig: Mapping[int, tuple[str, ...]] | None = None


def placements(devices: NodeDevices, reader: MigReader) -> dict[tuple[str, int], Placement]:
    """(GPU UUID, GPU instance id) -> placement, for every MIG-enabled GPU. One reader for
    the agent's life: it checks each GPU's MIG table once and logs what it found once."""
    out: dict[tuple[str, int], Placement] = {}
    for gpu in devices.gpus:
        if gpu.mig_enabled:
            for gi in reader.gpu(gpu.index).gpu_instances:
                out[(gpu.uuid, gi.id)] = Placement(gi.start, gi.size)
    return out


class DraKubeletPlugin:
    def __init__(self, options: KubeletPluginOptions, api_client: Any) -> None:
        self.options = options
        self.api_client = api_client
        self.publisher = SlicePublisher(api_client, options.node)
        # gpukit's own file; what an earlier gpukit wrote to NVIDIA's name moved there first.
        # Entries it cannot read are quarantined at start, not a reason to stop.
        self.checkpoint = open_checkpoint(Path(options.plugin_dir), strict=False)
        self._devices: dict[str, SliceDevice] = {}
        self._node_devices = NodeDevices()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._rescan = threading.Event()
        self._resync = threading.Event()
        enabled, ignored = effective_ignored_xids(options.health)
        self.health_enabled = enabled
        self.tracker = HealthTracker(ignored, options.health.recovery_seconds)
        self.metrics = PluginMetrics()
        self.metrics.readiness = self.readiness
        self.health = HealthMonitor(self.tracker, self._units, self.request_rescan,
                                    options.health.probe_interval_seconds,
                                    on_xid=self.metrics.count_xid)
        self._nvml_ready = False
        self.pod_resources = podresources.PodResourcesCache(
            lambda: podresources.list_holders(options.pod_resources_socket),
            ttl=options.pod_resources_ttl)
        self.gpu_metrics = GpuMetricsCollector(GpuMetricsSources(
            devices=self.node_devices, nvml_ready=lambda: self._nvml_ready,
            holders=self.pod_resources.holders, last_xid=self.metrics.last_xids,
            hostname=options.node, dra_devices=self.device_uuids))
        self.metrics.add_collector(self.gpu_metrics)
        self.preparer = Preparer(
            node=options.node, read_claim=self._read_claim, devices=self.devices,
            common_edits=self._common_edits, checkpoint=self.checkpoint,
            cdi_dir=options.cdi_dir, device_root=options.device_root,
            mps=mps_control(options.mps_daemons, compute_mode.set_exclusive),
            mps_root=options.mps_root,
            report_status=None if api_client is None else self._write_claim_status,
            carver=NvmlCarver(options.proc_root),
            metadata_dir=os.path.join(options.plugin_dir, dra_metadata.HOST_SUBDIR))
        self._dynamic: Mapping[int, tuple[str, ...]] = {}
        self._counter_sets: list[dict[str, Any]] = []
        self.health_board = HealthBoard()
        self.health_service = (HealthService(self.health_board, options.node)
                               if options.health_stream else None)
        self.server = self._new_server()
        self._published: list[dict[str, Any]] | None = None
        self._healthy: list[dict[str, Any]] = []  # bodies of the healthy devices published
        self.declaration = DeclarationWatch(
            options.declaration_dir, options.node, self.metrics,
            None if api_client is None else node_api.NodeClient(
                core=client.CoreV1Api(api_client), component=COMPONENT), dra=True)
        self._mig_reader = MigReader()
        self._shares = 0  # the node label's last good value
        self.taint_clock = device_taints.TaintClock()

    # -- what the preparer asks ------------------------------------------------------------

    def devices(self) -> Mapping[str, SliceDevice]:
        """Every device of the current layout, healthy or not: a claim prepared before a
        device turned unhealthy still names it."""
        with self._lock:
            return dict(self._devices)

    def node_devices(self) -> NodeDevices:
        with self._lock:
            return self._node_devices

    def device_uuids(self) -> dict[str, str]:
        """Published device name -> its GPU's or MIG device's UUID (the metrics' attribution
        of DRA claims, which PodResources names by device)."""
        with self._lock:
            return {name: d.unit.uuid for name, d in self._devices.items()}

    def readiness(self) -> tuple[bool, str]:
        """(ready, why) for /readyz: the kubelet registered the driver over intact sockets
        and this node's devices are published (pods can be allocated and prepared here)."""
        problems: list[str] = []
        server = self.server
        if not server.sockets_intact():
            problems.append("DRA sockets not served")
        elif not server.registration.registered.is_set():
            why = server.registration.last_error
            problems.append("not registered with the kubelet" + (f": {why}" if why else ""))
        published = self._published
        if published is None:
            problems.append("ResourceSlices not published yet")
        if problems:
            return False, "; ".join(problems)
        return True, f"registered, {len(published or [])} device(s) published"

    def served(self) -> Served:
        """What the node serves for the served-vs-declared watchdog: the healthy devices of
        the last publication, by kind (a tainted device is published but not served)."""
        with self._lock:
            return dra_served(self._healthy)

    def check_declaration(self) -> Verdict | None:
        """Served vs declared, reported (declaration_watch.py); once the slices are published,
        as they are what the node serves."""
        if self._published is None:
            return None
        return self.declaration.check(self.served)

    def _units(self) -> Mapping[str, Unit]:
        with self._lock:
            return {d.unit.uuid: d.unit for d in self._devices.values()}

    def _common_edits(self) -> Mapping[str, Any]:
        with self._lock:
            version = self._node_devices.driver_version
        return cdi.node_edits(self.options.device_root_in_plugin, self.options.device_root,
                              version)

    def _claim_exists(self, ref: ClaimRef) -> bool | None:
        """The claim is in the API with this UID: True; gone (404, or another UID): False;
        the API cannot say now: None."""
        try:
            claim = self._read_claim(ref.namespace, ref.name)
        except ApiException as exc:
            return False if exc.status == 404 else None
        except Exception:  # no answer at all: keep the entry
            return None
        return bool((claim.get("metadata") or {}).get("uid") == ref.uid)

    def _write_claim_status(self, ref: ClaimRef, devices: list[dict[str, Any]]) -> None:
        """The claim's status.devices entries of this driver (claim_status.py)."""
        resp = client.ResourceV1Api(self.api_client).patch_namespaced_resource_claim_status(
            ref.name, ref.namespace, claim_status.apply_body(ref.namespace, ref.name, ref.uid,
                                                             devices),
            field_manager=claim_status.FIELD_MANAGER, force=True,
            _content_type="application/apply-patch+yaml", _request_timeout=10,
            _preload_content=False)  # the answer is not needed: not decoded into models
        resp.release_conn()

    def _read_claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        resp = client.ResourceV1Api(self.api_client).read_namespaced_resource_claim(
            name, namespace, _preload_content=False)
        claim: dict[str, Any] = json.loads(resp.data)
        return claim

    # -- lifecycle --------------------------------------------------------------------------

    def _new_server(self) -> DraServer:
        return DraServer(self.preparer, Path(self.options.plugin_dir) / PLUGIN_SOCKET,
                         Path(self.options.registry_dir) / REGISTRATION_SOCKET,
                         health=self.health_service)

    def start(self) -> None:
        if self.options.nvml_library:
            nvml.load_library(self.options.nvml_library)
        nvml.init()
        self._nvml_ready = True
        self.rescan()
        self.reconcile_dynamic_mig()  # orphaned instances gone, claimed ones kept
        self.take_over_nvidias_claims()  # before the kubelet can ask for any claim
        self.restore_claims()  # their CDI specs back before the kubelet sees the plugin
        self.server.start()
        if self.health_enabled:
            self.health.start()
        threading.Thread(target=self.publisher.watch_changes, name="gpukit-dra-slices",
                         args=(self.request_resync, self._stop), daemon=True).start()
        kept = self.checkpoint.all()
        if kept:
            log.info("prepared claims from the checkpoint: %s", ", ".join(
                f"{c.namespace}/{c.name}" for c in kept.values()))
        self.preparer.forget_gone(self._claim_exists)
        for key, problem in self.preparer.restore_mps().items():
            log.error("MPS daemon %s of a prepared claim is not serving: %s", key, problem)

    def restore_claims(self) -> dict[str, str]:
        """The prepared claims' CDI specs rewritten where missing or different, stale entries
        quarantined (Preparer.restore_specs); one line when anything was done."""
        done = self.preparer.restore_specs()
        changed = {uid: what for uid, what in done.items() if what != "present"}
        if changed:
            log.info("prepared claims restored before registering: %s", "; ".join(
                f"{uid}: {what}" for uid, what in sorted(changed.items())))
        return done

    def take_over_nvidias_claims(self) -> nvidia_claims.Takeover:
        """The claims NVIDIA's DRA driver prepared here: taken over where safe, else refused
        by name (nvidia_claims.py); either said in one log line and an Event on the node."""
        found = nvidia_claims.take_over(Path(self.options.plugin_dir), self.checkpoint,
                                        self.options.node, self.devices())
        self.preparer.not_taken = dict(found.refused)
        self.preparer.nvidia_problem = found.file_problem
        taken, refused = found.summary()
        if taken:
            log.info("%s", taken)
            self._event("NvidiaClaimsTakenOver", taken, "Normal")
        if refused:
            log.error("%s", refused)
            self._event("NvidiaClaimsNotTakenOver", refused, "Warning")
        return found

    def _event(self, reason: str, message: str, type_: str) -> None:
        if self.api_client is None:  # no API (a plugin under test)
            return
        try:
            client.CoreV1Api(self.api_client).create_namespaced_event(
                node_api.EVENT_NAMESPACE, node_api.node_event(self.options.node, reason,
                                                              message, type_, COMPONENT))
        except Exception as exc:  # the log line says it all the same
            log.warning("cannot record Event %s on node %s: %s", reason, self.options.node, exc)

    def shares(self) -> int:
        """How many claims may share each device now (0 or 1: not shared)."""
        if self.options.shares is not None:
            return self.options.shares
        if self.api_client is None:  # no API to read the node from (a plugin under test)
            return 0
        self._shares = read_node_shares(self.api_client, self.options.node, self._shares)
        return self._shares

    def dynamic_mig(self) -> Mapping[int, tuple[str, ...]]:
        """GPU index -> profiles carved on demand: the option, else the node's declaration
        entry (the last good one when it cannot be read now)."""
        if self.options.dynamic_mig is not None:
            return self.options.dynamic_mig
        if not self.options.declaration_dir:
            return {}
        path = Path(self.options.declaration_dir) / self.options.node
        try:
            decl = nd.parse(path.read_text(), str(path))
        except FileNotFoundError:
            return {}
        except (OSError, nd.DeclarationError) as exc:
            log.error("dynamic MIG: %s; keeping %s", exc, dict(self._dynamic) or "none")
            return self._dynamic
        self._dynamic = dict(decl.dra_dynamic_mig)
        return self._dynamic

    def dynamic_gpus(self, found: NodeDevices) -> dict[int, str]:
        """The GPUs carved on demand here: index -> UUID (declared and present). A GPU that
        claims hold carved instances on stays dynamic while they do, whatever the declaration
        says now."""
        declared = self.dynamic_mig()
        held = {int(d.instance["gpu"]) for c in self.checkpoint.all().values()
                for d in c.devices if d.instance is not None}
        return {g.index: g.uuid for g in found.gpus if g.index in declared or g.index in held}

    def _write_owned(self, owned: Mapping[int, str]) -> None:
        """`gpukit-dynamic-mig.json` beside the checkpoint: the MIG manager skips these GPUs."""
        path = Path(self.options.plugin_dir) / dynamic_contract.OWNED_FILE
        text = json.dumps(dynamic_contract.owned_document(owned), indent=2) + "\n"
        try:
            if path.read_text() == text:
                return
        except OSError:
            pass
        if not owned and not path.exists():
            return
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        tmp.replace(path)
        log.info("dynamic MIG GPUs (the MIG manager leaves them alone): %s",
                 ", ".join(f"{i} ({u})" for i, u in sorted(owned.items())) or "none")

    def _dynamic_profiles(self, index: int) -> tuple[str, ...]:
        return tuple((self.options.dynamic_mig if self.options.dynamic_mig is not None
                      else self._dynamic).get(index, ()))

    def reconcile_dynamic_mig(self) -> dict[str, list[str]]:
        """Instances on the dynamic GPUs no prepared claim recorded destroyed, at start. A GPU
        a checkpointed claim holds otherwise (whole, or a MIG device of a static layout it
        had before it was declared dynamic) is left alone until that claim is gone."""
        with self._lock:
            found = self._node_devices
        owned = self.dynamic_gpus(found)
        minors = {g.minor: g.index for g in found.gpus}
        otherwise = {minors.get(parsed.minor) for c in self.checkpoint.all().values()
                     for d in c.devices if d.instance is None
                     and (parsed := parse_device_name(d.device)) is not None}
        for index in sorted(i for i in otherwise if i in owned):
            log.warning("GPU %d: declared for dynamic MIG, but a prepared claim holds it "
                        "from before: its instances are left alone until the claim is gone",
                        index)
        return self.preparer.reconcile_instances(
            {i: u for i, u in owned.items() if i not in otherwise})

    def rescan(self) -> None:
        found = nvml.discover(with_topology=False)
        owned = self.dynamic_gpus(found)
        static = replace(found, gpus=tuple(g for g in found.gpus if g.index not in owned))
        listed = node_slice_devices(static, placements(static, self._mig_reader),
                                    self.options.proc_root)
        shares = self.shares()
        if shares > 1:  # dynamic MIG devices are not shared: their counters are one claim's
            listed = [shared(d, shares) for d in listed]
        counter_sets: list[dict[str, Any]] = []
        for gpu in found.gpus:
            if gpu.index in owned:
                try:
                    cset, carved = publish_gpu(gpu, found, self._dynamic_profiles(gpu.index))
                except KeyError as exc:
                    log.error("GPU %d (%s) declared for dynamic MIG: %s; not published",
                              gpu.index, gpu.uuid, exc)
                    continue
                counter_sets.append(cset)
                listed += carved
        self._write_owned(owned)
        devices = {d.name: d for d in sorted(listed, key=lambda d: d.name)}
        with self._lock:
            self._node_devices, self._devices = found, devices
            self._counter_sets = counter_sets
        self.publish()

    def publish(self, force_check: bool = False) -> None:
        with self._lock:
            current = list(self._devices.values())
        healthy = [d for d in current
                   if not self.health_enabled or self.tracker.unit_healthy(d.unit)]
        names = {d.name for d in healthy}
        taints = self.taint_clock.taints(
            (d.name, device_taints.wanted(d.unit, self.tracker.problems))
            for d in current if self.health_enabled and d.name not in names)
        bodies = [{**d.body, "taints": taints[d.name]} if d.name in taints else d.body
                  for d in current]
        self.health_board.update([DeviceState(d.name, d.name in names, "" if d.name in names
                                              else self._why_unhealthy(d))
                                  for d in current])
        if bodies == self._published and not force_check:
            return
        for d in current:
            if d.name in taints:
                log.warning("device %s (%s) tainted %s: %s", d.name, d.unit.uuid, ", ".join(
                    f"{t['key']}={t.get('value', '')}:{t['effect']}" for t in taints[d.name]),
                    self._why_unhealthy(d))
        with self._lock:
            counter_sets = list(self._counter_sets)
        if counter_sets:  # dynamic MIG GPUs' counter sets: slices of their own
            self.publisher.sync(bodies, counter_sets)
        else:
            self.publisher.sync(bodies)
        self._published = bodies
        with self._lock:
            self._healthy = [d.body for d in current if d.name in names]
        self.metrics.set_unit_health((d.unit.uuid, d.name in names) for d in current)

    def _why_unhealthy(self, d: SliceDevice) -> str:
        return self.tracker.reason(d.unit.uuid) or self.tracker.reason(d.unit.gpu.uuid) or \
            "unhealthy"

    def request_rescan(self) -> None:
        self._rescan.set()

    def request_resync(self) -> None:
        """Someone changed or removed this node's slices: check them at once."""
        self._resync.set()
        self._rescan.set()  # wakes the loop

    def request_reload(self) -> None:
        self._rescan.set()

    def request_stop(self) -> None:
        self._stop.set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._stop.wait(timeout)

    def run(self) -> None:
        """The background loop; returns when stopped."""
        next_rescan = next_resync = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            try:
                if self._rescan.is_set() or now >= next_rescan:
                    self._rescan.clear()
                    self.rescan()
                    next_rescan = now + self.options.rescan_interval
                if now >= next_resync or self._resync.is_set():
                    self._resync.clear()
                    self.publish(force_check=True)
                    next_resync = now + self.options.resync_interval
                if not self.server.sockets_intact():
                    log.warning("a DRA socket was removed: serving again")
                    self.server.stop(0)
                    self.server = self._new_server()
                    self.server.start()
            except Exception:  # the agent keeps serving prepared claims whatever fails here
                log.exception("DRA agent loop")
            try:  # also when a rescan failed: the slices published are still what is served
                self.check_declaration()
            except Exception:
                log.exception("served vs declared")
            self._rescan.wait(1.0)

    def stop(self) -> None:
        self._stop.set()
        self.health_board.close()
        self.metrics.close()
        self.health.stop()
        self.server.stop()
        self._nvml_ready = False
        nvml.shutdown()
