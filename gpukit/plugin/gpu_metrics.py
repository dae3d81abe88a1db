"""GPU metrics under dcgm-exporter's names, computed at scrape time, each series attributed to the
pods that hold its device.

Names, units and labels are dcgm-exporter's (its default counters, `etc/default-counters.csv`,
plus the ECC and row-remap counters it lists there), so dashboards and alerts written for it
work unchanged (dcgm-exporter 4.8's: `hostname` since its PR #655, `Hostname` before): `gpu`,
`UUID`, `pci_bus_id`, `device` (nvidia<minor>), `modelName`, `GPU_I_PROFILE`/`GPU_I_ID` on MIG
devices, `hostname`, `DCGM_FI_DRIVER_VERSION`, and for a device
a container holds (through a device plugin or a DRA claim), `container`, `namespace`, `pod`
(one series per holding container: a time-sliced GPU shared by two pods has two of each, as
dcgm-exporter does). On a MIG device the `UUID`, `gpu` and `device` are its parent's, as
dcgm-exporter reports them; the device's own series are its memory (FB_USED/FB_FREE); the
GPU's power, temperature, clocks, energy, PCIe and ECC stay on the GPU's series (NVML answers
them only for the GPU; utilisation not at all with MIG enabled). The node agent serves them on
device-plugin nodes, the DRA plugin (gpukit/plugin/dra/telemetry.py) on DRA nodes.

Bounded cost: one NVML reading per GPU and MIG device per scrape, the kubelet's PodResources
List at most once per cache interval. A query NVML does not answer drops that series only; a
GPU that is gone has none but `gpukit_gpu_lost` 1; nothing here fails the scrape.

dcgm-exporter declares its counters (energy, PCIe, ECC, remapped rows) `counter` without the
`_total` suffix; the Prometheus client library cannot write that, so they are `untyped` here,
under the same names (queries and `rate()` are the same).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from gpukit.contracts.dcgm_fields import Field, gpu_fields
from gpukit.contracts.device_ids import strip_replica
from gpukit.contracts.dra import DRIVER as DRA_DRIVER

from .devices import Gpu, MigDevice, NodeDevices
from .dra.slice_devices import gpu_name
from .nvml.telemetry import Reading, read_gpu, read_mig
from .podresources import Holder

log = logging.getLogger(__name__)


GPU_FIELDS = gpu_fields()
MIG_FIELDS = tuple(f for f in GPU_FIELDS if f.mig)
XID = Field("", "DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.")
LOST = Field("", "gpukit_gpu_lost", "gauge",
             "1 while NVML says the GPU is gone (fallen off the bus, needs a reset)")
SCRAPE = Field("", "gpukit_gpu_metrics_scrape_seconds", "gauge",
               "How long computing the GPU metrics took at this scrape")
# Every metric name this module can export (the dashboard and rules tests hold them to it).
METRIC_NAMES = frozenset(f.name for f in (*GPU_FIELDS, XID, LOST, SCRAPE))


def dcgm_bus_id(bus_id: str) -> str:
    """`0000:07:00.0` -> NVML's `00000000:07:00.0`, the form dcgm-exporter's label carries."""
    if bus_id.count(":") != 2:
        return bus_id
    domain, rest = bus_id.split(":", 1)
    try:
        return f"{int(domain, 16):08X}:{rest.upper()}"
    except ValueError:
        return bus_id


def attribution(holders: Iterable[Holder], devices: NodeDevices,
                dra_devices: Mapping[str, str] | None = None
                ) -> dict[str, list[tuple[str, str, str]]]:
    """Physical device UUID (GPU or MIG device) -> the (container, namespace, pod) holding it,
    each once, in a stable order. Device IDs are UUIDs, time-sliced replicas of them
    (`<uuid>::<n>`) or, with deviceIDStrategy index, index IDs (`0`, `0:1`); a DRA claim's
    device is its ResourceSlice device name, looked up in `dra_devices` (name -> GPU or MIG
    UUID: what the DRA plugin publishes; a MIG device's name carries its placement, which
    only the publisher knows). Without it, whole GPUs only (`gpu-<minor>`)."""
    by_index = {str(g.index): g.uuid for g in devices.gpus}
    by_index.update((m.index_id, m.uuid) for m in devices.mig_devices())
    by_dra_name = dict(dra_devices) if dra_devices is not None else {
        gpu_name(g): g.uuid for g in devices.gpus}
    uuids = set(by_index.values())
    out: dict[str, list[tuple[str, str, str]]] = {}
    for h in holders:
        if h.resource == DRA_DRIVER:
            uuid = by_dra_name.get(h.device_id)
        else:
            device = strip_replica(h.device_id)
            uuid = device if device in uuids else by_index.get(device)
        if uuid is None:
            continue
        who = (h.container, h.namespace, h.pod)
        held = out.setdefault(uuid, [])
        if who not in held:
            held.append(who)
    for held in out.values():
        held.sort(key=lambda w: (w[1], w[2], w[0]))
    return out


class _Families:
    def __init__(self) -> None:
        self.by_name: dict[str, Metric] = {}

    def add(self, f: Field, labels: dict[str, str], value: float) -> None:
        m = self.by_name.get(f.name)
        if m is None:
            m = self.by_name[f.name] = Metric(f.name, f.help, "unknown" if f.kind == "untyped"
                                              else f.kind)
        m.add_sample(f.name, labels, value)


@dataclass
class GpuMetricsSources:
    """What the collector reads at each scrape (the manager's view, the kubelet's, NVML)."""

    devices: Callable[[], NodeDevices]
    nvml_ready: Callable[[], bool]
    holders: Callable[[], Sequence[Holder]]
    last_xid: Callable[[], Mapping[str, int]]
    hostname: str = ""
    read_gpu: Callable[[str], Reading] = read_gpu
    read_mig: Callable[[str], Reading] = read_mig
    # The DRA plugin's published devices, name -> GPU or MIG UUID (see `attribution`).
    dra_devices: Callable[[], Mapping[str, str]] | None = None


class GpuMetricsCollector(Collector):
    """A prometheus_client collector: `collect()` runs at every scrape."""

    def __init__(self, sources: GpuMetricsSources) -> None:
        self.sources = sources

    def describe(self) -> Iterable[Metric]:
        return []  # names depend on what NVML answers: no describe-time collect

    def collect(self) -> Iterator[Metric]:
        started = time.monotonic()
        families = _Families()
        try:
            self._collect(families)
        except Exception:  # a scrape must answer, whatever a node throws at it
            log.exception("GPU metrics: collecting failed; this scrape has none")
            families = _Families()
        families.add(SCRAPE, {"hostname": self.sources.hostname}, time.monotonic() - started)
        yield from families.by_name.values()

    def _collect(self, out: _Families) -> None:
        s = self.sources
        if not s.nvml_ready():
            return
        devices = s.devices()
        held = attribution(s.holders(), devices,
                           s.dra_devices() if s.dra_devices is not None else None)
        xids = s.last_xid()
        for gpu in devices.gpus:
            base = self._gpu_labels(gpu, devices.driver_version)
            reading = s.read_gpu(gpu.uuid)
            out.add(LOST, base, 1.0 if reading.lost else 0.0)
            if reading.lost:
                continue
            whole = held.get(gpu.uuid, [])
            for f in GPU_FIELDS:
                if f.reading in reading.values:
                    _add_attributed(out, f, base, whole, reading.values[f.reading])
            last = max((xids.get(u, 0) for u in (gpu.uuid, *(m.uuid for m in gpu.mig_devices))),
                       default=0)
            _add_attributed(out, XID, base, whole, float(last))
            for mig in gpu.mig_devices:
                self._mig(out, base, mig, held.get(mig.uuid, []))

    def _mig(self, out: _Families, base: dict[str, str], mig: MigDevice,
             held: list[tuple[str, str, str]]) -> None:
        reading = self.sources.read_mig(mig.uuid)
        # dcgm-exporter's order: the GPU's labels, the instance's, then hostname and the rest
        labels = {k: v for k, v in base.items()
                  if k not in ("hostname", "DCGM_FI_DRIVER_VERSION")}
        labels.update(GPU_I_PROFILE=mig.profile, GPU_I_ID=str(mig.gi),
                      hostname=base["hostname"],
                      DCGM_FI_DRIVER_VERSION=base["DCGM_FI_DRIVER_VERSION"])
        for f in MIG_FIELDS:
            if f.reading in reading.values:
                _add_attributed(out, f, labels, held, reading.values[f.reading])

    def _gpu_labels(self, gpu: Gpu, driver: str) -> dict[str, str]:
        return {
            "gpu": str(gpu.index), "UUID": gpu.uuid, "pci_bus_id": dcgm_bus_id(gpu.pci_bus_id),
            "device": f"nvidia{gpu.minor}", "modelName": gpu.name,
            "hostname": self.sources.hostname, "DCGM_FI_DRIVER_VERSION": driver,
        }


def _add_attributed(out: _Families, f: Field, labels: dict[str, str],
                    held: list[tuple[str, str, str]], value: float) -> None:
    """One series per holding container (none held: one series without pod labels)."""
    if not held:
        out.add(f, labels, value)
        return
    for container, namespace, pod in held:
        out.add(f, {**labels, "container": container, "namespace": namespace, "pod": pod},
                value)
