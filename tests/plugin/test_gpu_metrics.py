"""The agent's GPU metrics (gpukit/plugin/gpu_metrics.py): dcgm-exporter's names and labels, attributed
to the containers the kubelet's PodResources API names, computed at scrape time.

First with hand-made devices and readings (names, labels, attribution of whole GPUs, MIG devices,
time-sliced replicas and index IDs, a failing query, a lost GPU, a collector that throws), then
end to end: an agent on the mock NVML (in-process pynvml) with a stand-in kubelet serving
Registration and PodResources on real unix sockets, scraped over HTTP: the series move when a
process works on a GPU, carry the holder's pod labels, and agree with NVML."""

from __future__ import annotations

import socket
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pynvml
import pytest
from plugin_testlib import FakeKubelet, gpu_uuid, make_gpu, make_inventory, mig_uuid
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpukit.plugin import gpu_metrics as gm
from gpukit.plugin import podresources
from gpukit.plugin.api import podresources_grpc
from gpukit.plugin.api import podresources_pb2 as pr
from gpukit.plugin.config_source import ConfigSource, Override
from gpukit.plugin.devices import NodeDevices
from gpukit.plugin.manager import ManagerOptions, PluginManager, PynvmlBackend
from gpukit.plugin.nvml.telemetry import Reading

Sample = tuple[str, dict[str, str], float]

IDLE = {"sm_clock_mhz": 210.0, "mem_clock_mhz": 1215.0, "gpu_temp_c": 31.0, "power_w": 62.0,
        "energy_mj": 1000.0, "gpu_util": 0.0, "mem_copy_util": 0.0, "fb_used_mib": 0.0,
        "fb_free_mib": 40536.0, "pcie_tx_kb": 6.0, "pcie_rx_kb": 3.0, "pcie_replays": 0.0,
        "ecc_sbe_vol": 0.0, "ecc_dbe_vol": 0.0, "ecc_sbe_agg": 0.0, "ecc_dbe_agg": 0.0,
        "remapped_rows_correctable": 0.0, "remapped_rows_uncorrectable": 0.0,
        "row_remap_pending": 0.0, "row_remap_failure": 0.0}


def scrape(collector: Any) -> list[Sample]:
    registry = CollectorRegistry()
    registry.register(collector)
    return parse(generate_latest(registry).decode())


def parse(text: str) -> list[Sample]:
    return [(s.name, dict(s.labels), s.value) for fam in text_string_to_metric_families(text)
            for s in fam.samples]


def series(samples: list[Sample], name: str, **labels: str) -> list[Sample]:
    return [s for s in samples if s[0] == name and all(s[1].get(k) == v
                                                       for k, v in labels.items())]


def holder(pod: str, device_id: str, resource: str = "nvidia.com/gpu", ns: str = "team-a",
           container: str = "main") -> podresources.Holder:
    return podresources.Holder(pod, ns, container, resource, device_id)


def collector(devices: NodeDevices, holders: list[podresources.Holder] | None = None,
              readings: dict[str, Reading] | None = None, xids: dict[str, int] | None = None,
              ready: bool = True, dra_devices: dict[str, str] | None = None
              ) -> gm.GpuMetricsCollector:
    def read(uuid: str) -> Reading:
        if readings and uuid in readings:
            return readings[uuid]
        if uuid.startswith("MIG-"):
            return Reading({"fb_used_mib": 10.0, "fb_free_mib": 4854.0})
        return Reading(dict(IDLE))

    return gm.GpuMetricsCollector(gm.GpuMetricsSources(
        devices=lambda: devices, nvml_ready=lambda: ready, holders=lambda: holders or [],
        last_xid=lambda: xids or {}, hostname="gpu-a100", read_gpu=read, read_mig=read,
        dra_devices=None if dra_devices is None else lambda: dra_devices))


def test_dcgm_names_and_labels_for_a_whole_gpu() -> None:
    devices = make_inventory([make_gpu(0), make_gpu(1)])
    devices = NodeDevices(gpus=devices.gpus, driver_version="550.90.07")
    got = scrape(collector(devices))
    (util,) = series(got, "DCGM_FI_DEV_GPU_UTIL", gpu="1")
    assert util[1] == {"gpu": "1", "UUID": gpu_uuid(1), "pci_bus_id": util[1]["pci_bus_id"],
                       "device": "nvidia1", "modelName": "NVIDIA A100-SXM4-40GB",
                       "hostname": "gpu-a100", "DCGM_FI_DRIVER_VERSION": "550.90.07"}
    names = {s[0] for s in got}
    want = {f.name for f in gm.GPU_FIELDS} | {"DCGM_FI_DEV_XID_ERRORS", "gpukit_gpu_lost",
                                              "gpukit_gpu_metrics_scrape_seconds"}
    assert names == want and names <= gm.METRIC_NAMES
    assert series(got, "DCGM_FI_DEV_POWER_USAGE", gpu="0")[0][2] == 62.0
    assert series(got, "DCGM_FI_DEV_XID_ERRORS", gpu="0")[0][2] == 0.0  # none yet, as dcgm
    assert not any("pod" in s[1] for s in got)  # nobody holds them


def test_bus_id_in_nvmls_form() -> None:
    assert gm.dcgm_bus_id("0000:07:00.0") == "00000000:07:00.0"
    assert gm.dcgm_bus_id("0001:bd:00.0") == "00000001:BD:00.0"
    assert gm.dcgm_bus_id("") == ""


def test_attribution_whole_time_sliced_mig_and_index_ids() -> None:
    devices = make_inventory([make_gpu(0), make_gpu(1), make_gpu(2, migs=("3g.20gb", "3g.20gb")),
                              make_gpu(3)])
    holders = [
        holder("whole", gpu_uuid(0)),
        holder("shared-a", f"{gpu_uuid(1)}::0", ns="team-b"),  # a time-sliced pair
        holder("shared-b", f"{gpu_uuid(1)}::3", ns="team-b"),
        holder("shared-b", f"{gpu_uuid(1)}::4", ns="team-b"),  # two replicas: one series
        holder("mig", mig_uuid(2, 1), resource="nvidia.com/mig-3g.20gb", container="c"),
        holder("by-index", "3"),  # deviceIDStrategy index
    ]
    got = scrape(collector(devices, holders))
    pods = {s[1]["gpu"]: s[1].get("pod") for s in series(got, "DCGM_FI_DEV_GPU_UTIL")}
    assert pods == {"0": "whole", "2": None, "3": "by-index"} | {"1": pods["1"]}
    shared = series(got, "DCGM_FI_DEV_FB_USED", gpu="1")
    assert sorted((s[1]["pod"], s[1]["namespace"]) for s in shared) == [
        ("shared-a", "team-b"), ("shared-b", "team-b")]
    migs = series(got, "DCGM_FI_DEV_FB_USED", gpu="2", GPU_I_PROFILE="3g.20gb")
    assert len(migs) == 2
    (held,) = [s for s in migs if "pod" in s[1]]
    assert (held[1]["pod"], held[1]["container"], held[1]["UUID"]) == ("mig", "c", gpu_uuid(2))
    assert held[1]["GPU_I_ID"] == str(devices.gpus[2].mig_devices[1].gi)
    assert held[1]["device"] == "nvidia2"
    # the GPU's own series (power, ...) are not the MIG holder's
    assert "pod" not in series(got, "DCGM_FI_DEV_POWER_USAGE", gpu="2")[0][1]


def test_a_dra_claims_whole_gpu_is_attributed_by_its_slice_name() -> None:
    """PodResources' dynamic resources: a claim's device allocated by gpu.nvidia.com, named as
    in the ResourceSlice (gpu-<minor>); another driver's devices are not ours."""
    answer = pr.ListPodResourcesResponse(pod_resources=[pr.PodResources(
        name="dra-pod", namespace="team-c", containers=[pr.ContainerResources(
            name="c", dynamic_resources=[pr.DynamicResource(
                claim_name="gpu", claim_namespace="team-c", claim_resources=[
                    pr.ClaimResource(driver_name="gpu.nvidia.com", pool_name="gpu-a100",
                                     device_name="gpu-2"),
                    pr.ClaimResource(driver_name="example.com", device_name="gpu-3")])])])])
    holders = podresources.holders_of(answer)
    assert [(h.pod, h.resource, h.device_id) for h in holders] == [
        ("dra-pod", "gpu.nvidia.com", "gpu-2")]
    got = scrape(collector(make_inventory([make_gpu(i) for i in range(4)]), holders))
    assert {s[1]["gpu"] for s in series(got, "DCGM_FI_DEV_GPU_UTIL", pod="dra-pod")} == {"2"}


def test_a_dra_claims_mig_device_is_attributed_through_the_published_names() -> None:
    """The DRA plugin's names (gpu-<minor>-mig-<profile>-<GI profile id>-<start>) carry a
    placement NVML's device list does not: the publisher's name -> UUID map says which MIG
    device a claim holds. Its series carry the pod; its sibling's and the GPU's do not."""
    devices = make_inventory([make_gpu(0, migs=("3g.20gb", "3g.20gb")), make_gpu(1)])
    published = {"gpu-0-mig-3g20gb-9-0": mig_uuid(0, 0), "gpu-0-mig-3g20gb-9-4": mig_uuid(0, 1),
                 "gpu-1": gpu_uuid(1)}
    holders = [holder("train", "gpu-0-mig-3g20gb-9-4", resource="gpu.nvidia.com", ns="team-c",
                      container="c"),
               holder("whole", "gpu-1", resource="gpu.nvidia.com"),
               holder("stale", "gpu-0-mig-1g5gb-19-6", resource="gpu.nvidia.com")]
    got = scrape(collector(devices, holders, dra_devices=published))
    migs = series(got, "DCGM_FI_DEV_FB_USED", gpu="0", GPU_I_PROFILE="3g.20gb")
    assert {(s[1]["GPU_I_ID"], s[1].get("pod")) for s in migs} == {("1", None), ("2", "train")}
    (held,) = [s for s in migs if "pod" in s[1]]
    assert (held[1]["namespace"], held[1]["container"], held[1]["UUID"]) == (
        "team-c", "c", gpu_uuid(0))
    assert "pod" not in series(got, "DCGM_FI_DEV_POWER_USAGE", gpu="0")[0][1]
    assert {s[1].get("pod") for s in series(got, "DCGM_FI_DEV_GPU_UTIL", gpu="1")} == {"whole"}
    assert not series(got, "DCGM_FI_DEV_FB_USED", pod="stale")  # a name not published now
    # Without the publisher's map (the node agent), whole GPUs by name still count.
    plain = scrape(collector(devices, holders))
    assert not [s for s in plain if s[1].get("pod") == "train"]
    assert series(plain, "DCGM_FI_DEV_GPU_UTIL", gpu="1", pod="whole")


def test_a_failing_query_drops_its_series_a_lost_gpu_all_but_lost() -> None:
    devices = make_inventory([make_gpu(0), make_gpu(1)])
    partial = dict(IDLE)
    del partial["gpu_util"]  # e.g. NOT_SUPPORTED with MIG enabled
    got = scrape(collector(devices, readings={
        gpu_uuid(0): Reading(partial), gpu_uuid(1): Reading(lost="GPU is lost")}))
    assert series(got, "DCGM_FI_DEV_GPU_UTIL") == []
    assert len(series(got, "DCGM_FI_DEV_POWER_USAGE")) == 1
    assert series(got, "gpukit_gpu_lost", gpu="1")[0][2] == 1.0
    assert series(got, "gpukit_gpu_lost", gpu="0")[0][2] == 0.0
    assert series(got, "DCGM_FI_DEV_GPU_TEMP", gpu="1") == []


def test_last_xid_of_a_gpu_or_its_mig_devices() -> None:
    devices = make_inventory([make_gpu(0), make_gpu(1, migs=("1g.5gb",))])
    got = scrape(collector(devices, xids={gpu_uuid(0): 79, mig_uuid(1, 0): 43}))
    assert series(got, "DCGM_FI_DEV_XID_ERRORS", gpu="0")[0][2] == 79.0
    assert series(got, "DCGM_FI_DEV_XID_ERRORS", gpu="1")[0][2] == 43.0


def test_nothing_here_fails_the_scrape() -> None:
    def broken(uuid: str) -> Reading:
        raise RuntimeError("boom")

    c = collector(make_inventory([make_gpu(0)]))
    c.sources.read_gpu = broken
    got = scrape(c)
    assert [s[0] for s in got] == ["gpukit_gpu_metrics_scrape_seconds"]
    assert [s[0] for s in scrape(collector(make_inventory([make_gpu(0)]), ready=False))] == [
        "gpukit_gpu_metrics_scrape_seconds"]


def test_podresources_cache_lists_at_most_once_per_ttl_and_keeps_the_last_answer() -> None:
    now = [0.0]
    calls: list[int] = []
    answers: list[Any] = [[holder("a", "x")], grpc.RpcError("down")]

    def lister() -> list[podresources.Holder]:
        calls.append(1)
        got = answers.pop(0)
        if isinstance(got, Exception):
            raise got
        return list(got)

    cache = podresources.PodResourcesCache(lister, ttl=5.0, clock=lambda: now[0])
    assert [h.pod for h in cache.holders()] == ["a"]
    now[0] = 4.9
    cache.holders()
    assert len(calls) == 1
    now[0] = 5.1
    assert [h.pod for h in cache.holders()] == ["a"] and cache.error  # failed: kept
    assert len(calls) == 2


def test_socket_path_beside_device_plugins() -> None:
    assert podresources.socket_path("/var/lib/kubelet/device-plugins/") == \
        "/var/lib/kubelet/pod-resources/kubelet.sock"


# ---- end to end on the mock NVML -----------------------------------------------------------


class FakePodResources(podresources_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    """The kubelet's PodResources List, answering what the test says pods hold."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / "kubelet.sock"
        self.pods: list[tuple[str, str, str, str, list[str]]] = []
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        podresources_grpc.add_PodResourcesListerServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"unix://{self.path}")
        self.server.start()

    def List(self, request: Any, context: Any) -> Any:
        return pr.ListPodResourcesResponse(pod_resources=[
            pr.PodResources(name=pod, namespace=ns, containers=[pr.ContainerResources(
                name=container, devices=[pr.ContainerDevices(resource_name=resource,
                                                             device_ids=ids)])])
            for pod, ns, container, resource, ids in self.pods])

    def stop(self) -> None:
        self.server.stop(0)


@pytest.fixture
def agent(mock_node: Callable[[str], Any], short_tmp: Path
          ) -> Iterator[tuple[Any, FakePodResources, Callable[[], list[Sample]]]]:
    ctl = mock_node("a100-sxm4-40gb-x8")
    plugins = short_tmp / "device-plugins"
    plugins.mkdir()
    kubelet = FakeKubelet(plugins)
    kubelet.start()
    pods = FakePodResources(short_tmp / "pod-resources")
    manager = PluginManager(
        ConfigSource(overrides=[Override("gpukit.kubeletDir", str(plugins), "test"),
                                Override("gpukit.rescanIntervalSeconds", 0, "test")],
                     node_name="gpu-a100"),
        PynvmlBackend(), options=ManagerOptions(tick=0.05, health=False, pod_resources_ttl=0.1))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    url = f"http://127.0.0.1:{port}/metrics"

    def get() -> list[Sample]:
        time.sleep(0.35)  # past the mock's 0.2 s look at workloads and the 0.1 s cache
        with urllib.request.urlopen(url, timeout=10) as r:
            return parse(r.read().decode())

    try:
        manager.start()
        manager.metrics.serve(f"127.0.0.1:{port}")
        yield ctl, pods, get
    finally:
        manager.metrics.close()
        manager.stop()
        pods.stop()
        kubelet.stop()


def test_a_working_pod_moves_its_gpus_series_and_they_agree_with_nvml(
        agent: tuple[Any, FakePodResources, Callable[[], list[Sample]]]) -> None:
    ctl, pods, get = agent
    uuid = ctl.status()["gpus"][3]["uuid"]
    idle = get()
    assert series(idle, "DCGM_FI_DEV_GPU_UTIL", UUID=uuid)[0][2] == 0.0
    assert series(idle, "DCGM_FI_DEV_GPU_UTIL", UUID=uuid)[0][1]["hostname"] == "gpu-a100"
    pods.pods = [("trainer-0", "ml", "train", "nvidia.com/gpu", [uuid])]
    ctl.set_process(3, pid=4242, mem_mb=4096, util=80)
    busy = get()
    (util,) = series(busy, "DCGM_FI_DEV_GPU_UTIL", UUID=uuid)
    assert util[2] == 80.0
    assert (util[1]["pod"], util[1]["namespace"], util[1]["container"]) == ("trainer-0", "ml",
                                                                           "train")
    (used,) = series(busy, "DCGM_FI_DEV_FB_USED", UUID=uuid)
    h = pynvml.nvmlDeviceGetHandleByUUID(uuid)
    mem = pynvml.nvmlDeviceGetMemoryInfo(h)
    assert used[2] == mem.used / 2**20 and used[2] >= 4096
    assert series(busy, "DCGM_FI_DEV_POWER_USAGE", UUID=uuid)[0][2] == \
        pynvml.nvmlDeviceGetPowerUsage(h) / 1000
    assert series(busy, "DCGM_FI_DEV_SM_CLOCK", UUID=uuid)[0][2] == 1410.0
    assert series(busy, "DCGM_FI_DEV_GPU_UTIL", gpu="2")[0][2] == 0.0  # others idle
    e1 = series(busy, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", UUID=uuid)[0][2]
    # the pod ends: its process goes, the kubelet forgets it
    ctl.clear_processes(pid=4242)
    pods.pods = []
    after = get()
    (util,) = series(after, "DCGM_FI_DEV_GPU_UTIL", UUID=uuid)
    assert util[2] == 0.0 and "pod" not in util[1]
    assert series(after, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", UUID=uuid)[0][2] >= e1


def test_an_injected_xid_and_ecc_error_show(
        agent: tuple[Any, FakePodResources, Callable[[], list[Sample]]]) -> None:
    ctl, _pods, get = agent
    ctl.inject_xid(5, 48, event_type="double-bit-ecc")
    got = get()
    assert series(got, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", gpu="5")[0][2] == 1.0
    assert series(got, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", gpu="5")[0][2] == 1.0
    assert series(got, "DCGM_FI_DEV_ROW_REMAP_PENDING", gpu="5")[0][2] == 1.0
    ctl.lose(6)
    got = get()
    assert series(got, "gpukit_gpu_lost", gpu="6")[0][2] == 1.0
    assert series(got, "DCGM_FI_DEV_GPU_TEMP", gpu="6") == []
    assert len(series(got, "DCGM_FI_DEV_GPU_TEMP")) == 7
    ctl.restore(6)
