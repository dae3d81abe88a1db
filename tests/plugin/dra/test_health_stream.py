"""The kubelet's DRA health stream over the plugin's real socket: the registration lists it,
a report names every device of the pool (a tainted one Unhealthy, with why) at once after a
change, streams are bounded, and open streams leave prepare/unprepare their workers."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from dra_testlib import FakeResourceApi
from plugin_testlib import make_gpu, make_inventory

from gpukit.contracts.plugin_config import HealthSettings
from gpukit.plugin import nvml
from gpukit.plugin.api import (
    dra_grpc,
    dra_health_grpc,
    dra_health_pb2,
    dra_pb2,
    registration_grpc,
    registration_pb2,
)
from gpukit.plugin.dra import kubelet_plugin as plugin_mod
from gpukit.plugin.dra.health_stream import DeviceState, HealthBoard, HealthService
from gpukit.plugin.dra.kubelet_plugin import DraKubeletPlugin, KubeletPluginOptions
from gpukit.plugin.dra.slices import SlicePublisher


@pytest.fixture
def dra(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[DraKubeletPlugin]:
    node = make_inventory([make_gpu(0), make_gpu(1)])
    monkeypatch.setattr(nvml, "discover", lambda with_topology: node)
    monkeypatch.setattr(plugin_mod, "placements", lambda devices, reader: {})
    options = KubeletPluginOptions(node="n1", plugin_dir=str(short_tmp / "p"),
                           registry_dir=str(short_tmp / "r"), cdi_dir=str(short_tmp / "c"),
                           health=HealthSettings(recovery_seconds=None))
    a = DraKubeletPlugin(options, api_client=None)
    a.publisher = SlicePublisher(None, "n1", api=FakeResourceApi())
    a.rescan()
    a.server.start()
    yield a
    a.health_board.close()
    a.server.stop(0)


def channel(a: DraKubeletPlugin) -> grpc.Channel:
    return grpc.insecure_channel(f"unix://{a.server.plugin_socket}")


def health(report: Any) -> dict[str, tuple[int, str, str]]:
    return {d.device.device_name: (d.health, d.device.pool_name, d.message)
            for d in report.devices}


def test_the_registration_lists_the_health_service(dra: DraKubeletPlugin) -> None:
    with grpc.insecure_channel(f"unix://{dra.server.registration_socket}") as ch:
        info = registration_grpc.RegistrationStub(ch).GetInfo(registration_pb2.InfoRequest(),
                                                              timeout=5)
    assert list(info.supported_versions) == ["v1.DRAPlugin", "v1.DRAResourceHealth"]


def test_a_report_at_once_and_after_an_xid_the_device_unhealthy_with_why(
        dra: DraKubeletPlugin) -> None:
    with channel(dra) as ch:
        stream = dra_health_grpc.DRAResourceHealthStub(ch).NodeWatchResources(
            dra_health_pb2.NodeWatchResourcesRequest(), timeout=10)
        first = next(stream)
        assert health(first) == {"gpu-0": (dra_health_pb2.HEALTHY, "n1", ""),
                                 "gpu-1": (dra_health_pb2.HEALTHY, "n1", "")}
        assert first.devices[0].health_check_timeout_seconds == 45
        dra.tracker.on_xid(dra.devices()["gpu-1"].unit.uuid, 79)
        dra.publish()  # what the health monitor's change request leads to
        second = next(stream)  # at once, not after the period
        assert health(second)["gpu-1"] == (dra_health_pb2.UNHEALTHY, "n1", "XID 79")
        assert health(second)["gpu-0"][0] == dra_health_pb2.HEALTHY
        stream.cancel()


def test_streams_are_bounded_and_prepare_keeps_its_workers(dra: DraKubeletPlugin) -> None:
    with channel(dra) as ch:
        stub = dra_health_grpc.DRAResourceHealthStub(ch)
        open_streams = [stub.NodeWatchResources(dra_health_pb2.NodeWatchResourcesRequest(),
                                                timeout=10) for _ in range(2)]
        for s in open_streams:
            next(s)
        third = stub.NodeWatchResources(dra_health_pb2.NodeWatchResourcesRequest(), timeout=10)
        with pytest.raises(grpc.RpcError) as refused:
            next(third)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # Eight unprepares at once (nothing prepared: each answers without error).
        answers: list[Any] = []

        def unprepare(i: int) -> None:
            answers.append(dra_grpc.DRAPluginStub(ch).NodeUnprepareResources(
                dra_pb2.NodeUnprepareResourcesRequest(claims=[dra_pb2.Claim(
                    namespace="ns", name=f"c{i}", uid=f"uid-{i}")]), timeout=5))

        threads = [threading.Thread(target=unprepare, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert len(answers) == 8 and not any(a.claims[k].error for a in answers
                                             for k in a.claims)
        for s in open_streams:
            s.cancel()


def test_a_cancelled_stream_ends_and_frees_its_slot() -> None:
    board = HealthBoard()
    service = HealthService(board, "n1", period=60, max_streams=1)

    class Context:
        def __init__(self) -> None:
            self.callbacks: list[Any] = []

        def add_callback(self, fn: Any) -> None:
            self.callbacks.append(fn)

        def abort(self, code: Any, details: str) -> None:
            raise AssertionError(f"aborted: {code} {details}")

    ctx = Context()
    board.update([DeviceState("gpu-0", True)])
    gen = service.NodeWatchResources(None, ctx)
    assert health(next(gen)) == {"gpu-0": (dra_health_pb2.HEALTHY, "n1", "")}
    done = threading.Event()

    def drain() -> None:
        for _ in gen:
            pass
        done.set()

    t = threading.Thread(target=drain)
    t.start()
    for fn in ctx.callbacks:  # the kubelet went away
        fn()
    assert done.wait(5), "the stream did not end within 5 s of its cancellation"
    again = service.NodeWatchResources(None, Context())
    assert health(next(again))["gpu-0"][0] == dra_health_pb2.HEALTHY  # the slot is free
