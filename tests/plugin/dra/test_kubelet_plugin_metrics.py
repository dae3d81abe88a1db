"""The DRA plugin serves the node agent's GPU metrics and /readyz (a DRA node runs no agent):
every published GPU and MIG device has its series, a claim's device carries its pod, a stuck
scrape holds up no prepare, and /readyz says what is missing."""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from dra_testlib import FakeResourceApi
from plugin_testlib import gpu_uuid, make_gpu, make_inventory, mig_uuid
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpukit.contracts.plugin_config import HealthSettings
from gpukit.plugin import nvml
from gpukit.plugin.dra import kubelet_plugin as plugin_mod
from gpukit.plugin.dra.kubelet_plugin import DraKubeletPlugin, KubeletPluginOptions
from gpukit.plugin.dra.slice_devices import Placement
from gpukit.plugin.dra.slices import SlicePublisher
from gpukit.plugin.nvml.telemetry import Reading
from gpukit.plugin.podresources import Holder

Sample = tuple[str, dict[str, str], float]


def read(uuid: str) -> Reading:
    if uuid.startswith("MIG-"):
        return Reading({"fb_used_mib": 10.0, "fb_free_mib": 20000.0})
    return Reading({"gpu_temp_c": 31.0, "fb_used_mib": 0.0, "fb_free_mib": 40536.0})


@pytest.fixture
def dra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> DraKubeletPlugin:
    gpu0 = make_gpu(0, migs=("3g.20gb", "3g.20gb"))
    node = make_inventory([gpu0, make_gpu(1)])
    monkeypatch.setattr(nvml, "discover", lambda with_topology: node)
    monkeypatch.setattr(plugin_mod, "placements", lambda devices, reader: {
        (gpu0.uuid, 1): Placement(0, 4), (gpu0.uuid, 2): Placement(4, 4)})
    options = KubeletPluginOptions(node="gpu-a100", plugin_dir=str(tmp_path / "plugin"),
                           registry_dir=str(tmp_path / "reg"), cdi_dir=str(tmp_path / "cdi"),
                           health=HealthSettings(recovery_seconds=None), pod_resources_ttl=0)
    a = DraKubeletPlugin(options, api_client=None)
    a.publisher = SlicePublisher(None, "gpu-a100", api=FakeResourceApi())
    a.gpu_metrics.sources.read_gpu = a.gpu_metrics.sources.read_mig = read
    a._nvml_ready = True  # start() sets it once NVML is up
    return a


def scrape(a: DraKubeletPlugin) -> list[Sample]:
    text = generate_latest(a.metrics.registry).decode()
    return [(s.name, dict(s.labels), s.value) for f in text_string_to_metric_families(text)
            for s in f.samples]


def test_every_published_device_has_series_and_a_claims_mig_device_its_pod(
        dra: DraKubeletPlugin) -> None:
    dra.rescan()
    assert sorted(dra.devices()) == ["gpu-0-mig-3g20gb-9-0", "gpu-0-mig-3g20gb-9-4", "gpu-1"]
    dra.pod_resources.lister = lambda: [
        Holder("train", "team-c", "c", "gpu.nvidia.com", "gpu-0-mig-3g20gb-9-4"),
        Holder("infer", "team-a", "main", "gpu.nvidia.com", "gpu-1")]
    got = scrape(dra)
    fb = [s for s in got if s[0] == "DCGM_FI_DEV_FB_USED"]
    by_device = {(s[1]["UUID"], s[1].get("GPU_I_ID")): s[1].get("pod") for s in fb}
    assert by_device == {(gpu_uuid(0), None): None, (gpu_uuid(0), "1"): None,
                         (gpu_uuid(0), "2"): "train", (gpu_uuid(1), None): "infer"}
    assert {s[1]["hostname"] for s in fb} == {"gpu-a100"}
    health = {s[1]["device"]: s[2] for s in got if s[0] == "gpukit_plugin_device_healthy"}
    assert health == {mig_uuid(0, 0): 1.0, mig_uuid(0, 1): 1.0, gpu_uuid(1): 1.0}


def test_an_xid_counts_as_the_agent_counts_it(dra: DraKubeletPlugin) -> None:
    dra.rescan()
    assert dra.health.on_xid is not None  # what the health monitor calls on an XID
    dra.health.on_xid(gpu_uuid(1), 79, True)
    got = scrape(dra)
    (xid,) = [s for s in got if s[0] == "DCGM_FI_DEV_XID_ERRORS" and s[1]["gpu"] == "1"]
    assert xid[2] == 79.0


def test_a_stuck_scrape_holds_up_no_prepare_or_rescan(dra: DraKubeletPlugin) -> None:
    dra.rescan()
    reading, release = threading.Event(), threading.Event()

    def stuck(uuid: str) -> Reading:
        reading.set()
        release.wait(10)
        return read(uuid)

    dra.gpu_metrics.sources.read_gpu = stuck
    scraper = threading.Thread(target=scrape, args=(dra,))
    scraper.start()
    try:
        assert reading.wait(5)
        started = time.monotonic()
        dra.rescan()  # takes the agent's lock, publishes
        assert "gpu-1" in dra.devices()  # what the preparer asks
        assert time.monotonic() - started < 1.0
    finally:
        release.set()
        scraper.join(10)


def test_readyz_says_what_is_missing_until_registered_and_published(dra: DraKubeletPlugin) -> None:
    dra.server.start()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    dra.metrics.serve(f"127.0.0.1:{port}")
    url = f"http://127.0.0.1:{port}"

    def get(path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(url + path, timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    try:
        assert get("/readyz") == (503, "not ready: not registered with the kubelet; "
                                        "ResourceSlices not published yet\n")
        dra.rescan()
        dra.server.registration.registered.set()  # the kubelet's NotifyRegistrationStatus
        assert get("/readyz") == (200, "ok: registered, 3 device(s) published\n")
        status, body = get("/metrics")
        assert status == 200 and 'DCGM_FI_DEV_FB_USED{' in body
        dra.server.plugin_socket.unlink()
        assert get("/readyz")[0] == 503
    finally:
        dra.stop()
