"""The agent registers before it imports what registration does not need, and an idle agent
sleeps: what it must act on at once wakes it (requests, the MIG manager's pause file, a closed
ListAndWatch stream) instead of a poll. The manager's tick here is an hour where that is the
point: only the wake-ups can move it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

from plugin_testlib import T4, FakeBackend, FakeKubelet, dial, gpu_uuid, make_gpu, make_inventory

from gpukit.plugin.api import deviceplugin_pb2 as pb
from gpukit.plugin.config_source import ConfigSource, Override
from gpukit.plugin.devices import NodeDevices
from gpukit.plugin.manager import ManagerOptions, PluginManager
from gpukit.plugin.metrics import PluginMetrics
from gpukit.plugin.mig.hooks import PauseFile
from gpukit.plugin.server import ResourceState

HOUR = 3600.0
REPO = Path(__file__).resolve().parents[2]


def source(kubelet_dir: Path) -> ConfigSource:
    return ConfigSource(overrides=[Override("gpukit.kubeletDir", str(kubelet_dir), "test"),
                                   Override("gpukit.rescanIntervalSeconds", 0, "test")])


def health(resp: Any) -> dict[str, str]:
    return {d.ID: d.health for d in resp.devices}


def test_requests_wake_the_loop(kubelet: FakeKubelet, short_tmp: Path) -> None:
    backend = FakeBackend(make_inventory([make_gpu(0, T4)]))
    manager = PluginManager(source(short_tmp), backend,
                            options=ManagerOptions(tick=HOUR, health=False))
    manager.start()
    try:
        kubelet.next_request()
        channel, stub = dial(str(short_tmp / "gpukit-gpu.sock"))
        stream = stub.ListAndWatch(pb.Empty(), timeout=30)
        assert len(next(stream).devices) == 1
        backend.inv = make_inventory([make_gpu(0, T4), make_gpu(1, T4)])
        manager.request_rescan()  # SIGUSR1: served within the stream's timeout, not an hour
        assert len(next(stream).devices) == 2
        stream.cancel()
        channel.close()
    finally:
        manager.stop()


def test_pause_file_wakes_the_loop(kubelet: FakeKubelet, short_tmp: Path) -> None:
    pause = short_tmp / "plugin.pause"
    manager = PluginManager(
        source(short_tmp), FakeBackend(make_inventory([make_gpu(0, T4), make_gpu(1, T4)])),
        options=ManagerOptions(tick=HOUR, health=False, pause_file=str(pause)))
    manager.start()
    mig = PauseFile(pause)
    try:
        kubelet.next_request()
        assert manager.pause_watch is not None and manager.pause_watch.watching
        channel, stub = dial(str(short_tmp / "gpukit-gpu.sock"))
        stream = stub.ListAndWatch(pb.Empty(), timeout=30)
        assert set(health(next(stream)).values()) == {"Healthy"}
        mig.pause([(1, gpu_uuid(1))], "mixed")
        assert health(next(stream)) == {gpu_uuid(0): "Healthy", gpu_uuid(1): "Unhealthy"}
        mig.resume()
        assert set(health(next(stream)).values()) == {"Healthy"}
        stream.cancel()
        channel.close()
    finally:
        mig.resume()
        manager.stop()
    assert not manager.pause_watch.watching


def test_idle_loop_sleeps_longer_only_while_nothing_needs_a_poll(short_tmp: Path) -> None:
    kubelet = FakeKubelet(short_tmp)  # not serving yet: the registration is pending
    manager = PluginManager(source(short_tmp), FakeBackend(make_inventory([make_gpu(0, T4)])),
                            options=ManagerOptions(tick=0.05, health=False, idle_ticks=4))
    manager.start()
    try:
        assert manager.kubelet_dir_watch.watching
        assert manager.registration.pending
        assert manager._next_wait() == 0.05  # a registration to retry
        kubelet.start()
        kubelet.next_request()
        deadline = time.monotonic() + 10
        while manager.registration.pending and time.monotonic() < deadline:
            time.sleep(0.02)
        assert manager._next_wait() == 0.2
    finally:
        manager.stop()
        kubelet.stop()


def test_list_and_watch_returns_when_its_stream_closes() -> None:
    state = ResourceState(make_resource(), None, NodeDevices(), [], "distributed")  # type: ignore[arg-type]
    ended = threading.Event()
    returned = threading.Event()
    state.stream_opened()

    def wait() -> None:
        state.wait_change(0, 30.0, ended.is_set)
        returned.set()

    threading.Thread(target=wait, daemon=True).start()
    time.sleep(0.1)
    assert not returned.is_set()
    ended.set()
    state.stream_closed()  # the RPC's done callback: notifies the waiting stream
    assert returned.wait(2), "the stream kept waiting for its 30 s guard"


def make_resource() -> Any:
    from gpukit.plugin.resources import Resource

    return Resource(name="nvidia.com/gpu", devices=())


def test_metrics_set_before_first_use_are_kept() -> None:
    metrics = PluginMetrics()
    metrics.set_devices({"nvidia.com/gpu": {"Healthy": 3, "Unhealthy": 1}})
    metrics.set_unit_health([("GPU-a", True), ("GPU-b", False)])
    metrics.set_config_failed(True)
    r = metrics.registry  # first use: the metrics are made now
    assert r.get_sample_value("gpukit_plugin_devices",
                              {"resource": "nvidia.com/gpu", "health": "Healthy"}) == 3
    assert r.get_sample_value("gpukit_plugin_devices",
                              {"resource": "nvidia.com/gpu", "health": "Unhealthy"}) == 1
    assert r.get_sample_value("gpukit_plugin_device_healthy", {"device": "GPU-b"}) == 0
    assert r.get_sample_value("gpukit_plugin_config_failed") == 1
    metrics.set_config_failed(False)
    assert r.get_sample_value("gpukit_plugin_config_failed") == 0


AGENT = textwrap.dedent("""
    import sys, threading
    from concurrent import futures
    import grpc
    from gpukit.plugin.api import deviceplugin_grpc, deviceplugin_pb2 as pb
    seen, done = [], threading.Event()
    HEAVY = ("prometheus_client", "yaml", "kubernetes", "gpukit.plugin.gpu_metrics",
             "gpukit.plugin.podresources", "gpukit.mig.planner", "wsgiref.simple_server")

    class Kubelet:
        def Register(self, request, context):
            seen.extend(m for m in HEAVY if m in sys.modules)
            done.set()
            return pb.Empty()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    deviceplugin_grpc.add_RegistrationServicer_to_server(Kubelet(), server)
    server.add_insecure_port("unix://" + sys.argv[1] + "/kubelet.sock")
    server.start()
    from gpukit.plugin.manager import ManagerOptions, PluginManager, PynvmlBackend
    from gpukit.plugin.config_source import ConfigSource, Override
    from gpukit.plugin.metrics import PluginMetrics
    manager = PluginManager(
        ConfigSource(overrides=[Override("gpukit.kubeletDir", sys.argv[1], "test")]),
        PynvmlBackend(sys.argv[2]), PluginMetrics(), ManagerOptions(health=False))
    manager.start()
    assert done.wait(10)
    manager.stop()
    print(",".join(seen) or "none")
""")


def test_registers_before_importing_what_registration_does_not_need(
        mock_node: Any, short_tmp: Path) -> None:
    from gpukit.lab.nvml import ENV_LIB

    mock_node("a100-sxm4-40gb-x8")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), *sys.path]))
    out = subprocess.run([sys.executable, "-c", AGENT, str(short_tmp), os.environ[ENV_LIB]],
                         env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "none"  # imported before the kubelet saw Register


def test_nvml_started_early_is_taken_by_init(mock_node: Any) -> None:
    from gpukit.lab.nvml import ENV_LIB
    from gpukit.plugin.manager import PynvmlBackend

    mock_node("a100-sxm4-40gb-x8")
    backend = PynvmlBackend(os.environ[ENV_LIB])
    backend.init_early()
    backend.init()  # joins the early nvmlInit: one init, as without init_early
    try:
        assert len(backend.discover(with_topology=False).gpus) == 8
    finally:
        backend.shutdown()


def test_nvml_failure_started_early_is_raised_by_init(tmp_path: Path) -> None:
    import pytest

    from gpukit.plugin.manager import PynvmlBackend
    from gpukit.plugin.nvml import NvmlError

    backend = PynvmlBackend(str(tmp_path / "libnvidia-ml.so.1"))  # no such library
    backend.init_early()
    with pytest.raises(NvmlError):
        backend.init()
