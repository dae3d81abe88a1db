"""Discovery, health and re-enumeration against the lab's mock libnvidia-ml.so.1 through pynvml,
in-process (the mock is loaded into this process's pynvml, as the lab helper documents)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml
import pytest
from plugin_testlib import FakeKubelet, dial

from gpukit.contracts import label_names as ln
from gpukit.plugin import nvml
from gpukit.plugin.api import deviceplugin_pb2 as pb
from gpukit.plugin.config_source import ConfigSource, Override
from gpukit.plugin.devices import TOPOLOGY_SINGLE, NodeDevices
from gpukit.plugin.labels import compute_labels
from gpukit.plugin.manager import ManagerOptions, PluginManager, PynvmlBackend
from gpukit.plugin.resources import build_resources

REPO = Path(__file__).resolve().parents[2]


def _library() -> Path | None:
    explicit = os.environ.get("GPUKIT_NVML_LIB")
    if explicit:
        return Path(explicit)
    built = REPO / "build" / "nvml" / "libnvidia-ml.so.1"
    return built if built.exists() else None


LIB = _library()
pytestmark = [
    pytest.mark.nvml,
    pytest.mark.skipif(LIB is None, reason="mock NVML not built (make nvml)"),
]
GI_PROFILES = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4}  # slices -> NVML_GPU_INSTANCE_PROFILE_<n>_SLICE


def discover() -> NodeDevices:
    nvml.init()
    try:
        return nvml.discover()
    finally:
        nvml.shutdown()


def make_mig(ctl: Any, gpu: int, slices: list[int]) -> None:
    """Enable MIG on a GPU (mode change + reset) and create full-size compute instances."""
    nvml.init()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(gpu)
        pynvml.nvmlDeviceSetMigMode(h, pynvml.NVML_DEVICE_MIG_ENABLE)
        ctl.reset(gpu)
        h = pynvml.nvmlDeviceGetHandleByIndex(gpu)
        for n in slices:
            info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(h, GI_PROFILES[n])
            gi = pynvml.nvmlDeviceCreateGpuInstance(h, info.id)
            ci_info = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi, GI_PROFILES[n], pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
            pynvml.nvmlGpuInstanceCreateComputeInstance(gi, ci_info.id)
    finally:
        nvml.shutdown()


def test_discovery_a100(mock_node: Callable[[str], Any]) -> None:
    mock_node("a100-sxm4-40gb-x8")
    inv = discover()
    assert len(inv.gpus) == 8
    g = inv.gpus[0]
    assert (g.name, g.memory_mb, g.compute_major, g.architecture) == (
        "NVIDIA A100-SXM4-40GB", 40960, 8, "ampere")
    assert g.mig_capable and not g.mig_enabled
    assert [x.numa_node for x in inv.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert inv.gpus[1].pci_bus_id == "0000:0f:00.0"
    # Six NVSwitches, two links from every GPU to each: NV12 between any two GPUs.
    assert inv.link(inv.gpus[0].uuid, inv.gpus[1].uuid).nvlinks == 12
    assert inv.link(inv.gpus[0].uuid, inv.gpus[1].uuid).ancestor == TOPOLOGY_SINGLE
    assert inv.link(inv.gpus[0].uuid, inv.gpus[2].uuid).nvlinks == 12
    assert inv.driver_version == "550.90.07" and inv.cuda_version == (12, 4)


def test_discovery_t4_and_labels(mock_node: Callable[[str], Any]) -> None:
    mock_node("t4-x2")
    inv = discover()
    assert [g.name for g in inv.gpus] == ["Tesla T4", "Tesla T4"]
    assert not any(g.mig_capable for g in inv.gpus)
    labels = compute_labels(inv, ConfigSource().load().config)
    assert labels["nvidia.com/gpu.product"] == "Tesla-T4"
    assert labels["nvidia.com/gpu.family"] == "turing"
    assert labels["nvidia.com/mig.capable"] == "false"


@pytest.mark.parametrize(("profile", "name", "memory", "product", "numa", "nvlinks"), [
    ("b200-x8", "NVIDIA B200", 183359, "NVIDIA-B200", [0, 0, 0, 0, 1, 1, 1, 1], 18),
    ("gb200-x4", "NVIDIA GB200", 189471, "NVIDIA-GB200", [0, 0, 1, 1], 18),
])
def test_discovery_and_labels_of_blackwell_nodes(
        mock_node: Callable[[str], Any], profile: str, name: str, memory: int, product: str,
        numa: list[int], nvlinks: int) -> None:
    """The B200 and GB200 mocks as gpukit sees them: compute capability 10.0, architecture
    blackwell (GFD's family too), MIG capable with their own tables, NVLink 5 to switches."""
    mock_node(profile)
    inv = discover()
    g = inv.gpus[0]
    assert (g.name, g.memory_mb, g.compute_major, g.compute_minor, g.architecture) == (
        name, memory, 10, 0, "blackwell")
    assert g.mig_capable and not g.mig_enabled
    assert [x.numa_node for x in inv.gpus] == numa
    assert inv.link(inv.gpus[0].uuid, inv.gpus[1].uuid).nvlinks == nvlinks
    labels = compute_labels(inv, ConfigSource().load().config)
    assert labels["nvidia.com/gpu.product"] == product
    assert labels["nvidia.com/gpu.family"] == "blackwell"
    assert (labels["nvidia.com/gpu.compute.major"], labels["nvidia.com/gpu.compute.minor"]) == (
        "10", "0")
    assert labels["nvidia.com/mig.capable"] == "true"


def test_gb200_fabric_is_discovered_and_labelled_as_gfd_does(
        mock_node: Callable[[str], Any]) -> None:
    """gb200-x4 declares a completed fabric (one cluster, clique 32766): every GPU carries it,
    and the node gets GFD's nvidia.com/gpu.clique = <cluster UUID>.<clique id>."""
    mock_node("gb200-x4")
    inv = discover()
    cluster = "6f1c2a9e-3b7d-4e58-a0c4-9d21e5b7f360"
    for g in inv.gpus:
        assert g.fabric is not None and g.fabric.attached
        assert (g.fabric.cluster_uuid, g.fabric.clique_id) == (cluster, 32766)
    labels = compute_labels(inv, ConfigSource().load().config)
    assert labels[ln.GPU_CLIQUE] == f"{cluster}.32766"


@pytest.mark.parametrize("profile", ["a100-sxm4-40gb-x8", "h100-80gb-x8", "b200-x8", "t4-x2"])
def test_gpus_without_a_fabric_have_no_clique(mock_node: Callable[[str], Any],
                                              profile: str) -> None:
    mock_node(profile)
    inv = discover()
    assert all(g.fabric is None for g in inv.gpus)
    assert ln.GPU_CLIQUE not in compute_labels(inv, ConfigSource().load().config)


def test_mig_discovery_and_mixed_resources(mock_node: Callable[[str], Any]) -> None:
    ctl = mock_node("a100-sxm4-40gb-x8")
    make_mig(ctl, 1, [3, 3])
    make_mig(ctl, 2, [1, 1, 2])
    inv = discover()
    migs = inv.gpus[1].mig_devices
    assert [m.profile for m in migs] == ["3g.20gb", "3g.20gb"]
    assert migs[0].memory_mb == 19968 and migs[0].multiprocessors == 42
    assert all(m.parent_uuid == inv.gpus[1].uuid for m in migs)
    config = ConfigSource(overrides=[Override("flags.migStrategy", "mixed", "test")]).load().config
    rs = build_resources(inv, config)
    assert {n: len(r.devices) for n, r in rs.resources.items()} == {
        "nvidia.com/gpu": 6, "nvidia.com/mig-3g.20gb": 2, "nvidia.com/mig-1g.5gb": 2,
        "nvidia.com/mig-2g.10gb": 1}
    labels = compute_labels(inv, config)
    assert labels["nvidia.com/mig-3g.20gb.count"] == "2"
    assert labels["nvidia.com/mig-1g.5gb.slices.gi"] == "1"


def start_manager(directory: Path, *extra: Override) -> PluginManager:
    source = ConfigSource(overrides=[
        Override("gpukit.kubeletDir", str(directory), "test"),
        Override("gpukit.rescanIntervalSeconds", 0, "test"),
        Override("gpukit.health.probeIntervalSeconds", 0.1, "test"),
        Override("gpukit.health.recoverySeconds", 1.0, "test"),
        *extra,
    ])
    manager = PluginManager(source, PynvmlBackend(), options=ManagerOptions(tick=0.05))
    manager.start()
    return manager


def health(resp: Any) -> dict[str, str]:
    return {d.ID: d.health for d in resp.devices}


def test_xid_flips_health_and_back(mock_node: Callable[[str], Any], kubelet: FakeKubelet,
                                   short_tmp: Path) -> None:
    ctl = mock_node("t4-x2")
    manager = start_manager(short_tmp)
    try:
        kubelet.next_request()
        gpus = manager.devices.gpus
        channel, stub = dial(str(short_tmp / "gpukit-gpu.sock"))
        stream = stub.ListAndWatch(pb.Empty(), timeout=30)
        assert set(health(next(stream)).values()) == {"Healthy"}
        ctl.inject_xid(gpu=0, xid=13)  # application error: ignored
        t0 = time.monotonic()
        ctl.inject_xid(gpu=1, xid=79)
        update = health(next(stream))
        assert time.monotonic() - t0 < 1.0
        assert update == {gpus[0].uuid: "Healthy", gpus[1].uuid: "Unhealthy"}
        # recovery window (1 s) passes, the GPU probes fine -> Healthy again
        assert set(health(next(stream)).values()) == {"Healthy"}
        ctl.lose(0)
        assert health(next(stream))[gpus[0].uuid] == "Unhealthy"
        ctl.restore(0)
        assert set(health(next(stream)).values()) == {"Healthy"}
        stream.cancel()
        channel.close()
        xids = {(s.labels["xid"], s.labels["critical"]) for m in
                manager.metrics.xids.collect() for s in m.samples if s.name.endswith("_total")}
        assert xids == {("13", "false"), ("79", "true")}
    finally:
        manager.stop()


def test_mig_xid_marks_only_that_instance_and_rescan(
        mock_node: Callable[[str], Any], kubelet: FakeKubelet, short_tmp: Path) -> None:
    ctl = mock_node("a100-sxm4-40gb-x8")
    make_mig(ctl, 0, [3, 3])
    manager = start_manager(short_tmp, Override("flags.migStrategy", "mixed", "test"),
                            Override("gpukit.health.recoverySeconds", None, "test"))
    try:
        names = {kubelet.next_request().resource_name for _ in range(2)}
        assert names == {"nvidia.com/gpu", "nvidia.com/mig-3g.20gb"}
        migs = manager.devices.gpus[0].mig_devices
        channel, stub = dial(str(short_tmp / "gpukit-mig-3g.20gb.sock"))
        stream = stub.ListAndWatch(pb.Empty(), timeout=30)
        next(stream)
        ctl.inject_xid(gpu=0, xid=94, gi=migs[1].gi, ci=migs[1].ci)
        assert health(next(stream)) == {migs[0].uuid: "Healthy", migs[1].uuid: "Unhealthy"}
        stream.cancel()
        channel.close()
        # a MIG change on GPU 3 shows up after a rescan, without restarting the plugin
        make_mig(ctl, 3, [1, 1, 1])
        manager.request_rescan()
        assert kubelet.next_request().resource_name == "nvidia.com/mig-1g.5gb"
        assert len(manager.resources.resources["nvidia.com/gpu"].devices) == 6
    finally:
        manager.stop()
