"""Full in-process gRPC round trip: a stand-in kubelet Registration server on a temp socket,
the plugin manager with a fake NVML backend, and a client dialing the plugin's socket."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from plugin_testlib import (
    T4,
    FakeBackend,
    FakeKubelet,
    FakeNode,
    dial,
    gpu_uuid,
    make_gpu,
    make_inventory,
    mig_uuid,
)

from gpukit.plugin.api import deviceplugin_pb2 as pb
from gpukit.plugin.config_source import ConfigSource, Override
from gpukit.plugin.devices import NodeDevices
from gpukit.plugin.manager import ManagerOptions, PluginManager


def make_manager(directory: Path, backend: FakeBackend, *extra: Override) -> PluginManager:
    overrides = [
        Override("gpukit.kubeletDir", str(directory), "test"),
        Override("gpukit.rescanIntervalSeconds", 0, "test"),
        *extra,
    ]
    return PluginManager(ConfigSource(overrides=overrides), backend,
                         options=ManagerOptions(tick=0.05, health=False,
                                                register_retry_seconds=0.2))


def test_round_trip(kubelet: FakeKubelet, short_tmp: Path) -> None:
    backend = FakeBackend(make_inventory([make_gpu(0, T4), make_gpu(1, T4)]))
    manager = make_manager(short_tmp, backend)
    manager.start()
    try:
        req = kubelet.next_request()
        assert (req.version, req.resource_name, req.endpoint) == (
            "v1beta1", "nvidia.com/gpu", "gpukit-gpu.sock")
        assert req.options.get_preferred_allocation_available is True
        sock = short_tmp / req.endpoint
        assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600

        channel, stub = dial(str(sock))
        opts = stub.GetDevicePluginOptions(pb.Empty(), timeout=5)
        assert opts.get_preferred_allocation_available and not opts.pre_start_required

        stream = stub.ListAndWatch(pb.Empty(), timeout=30)
        first = next(stream)
        assert [(d.ID, d.health) for d in first.devices] == [
            (gpu_uuid(0), "Healthy"), (gpu_uuid(1), "Healthy")]
        assert first.devices[0].topology.nodes[0].ID == 0

        resp = stub.Allocate(pb.AllocateRequest(container_requests=[
            pb.ContainerAllocateRequest(devices_ids=[gpu_uuid(1)])]), timeout=5)
        assert resp.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == gpu_uuid(1)

        with pytest.raises(grpc.RpcError) as err:
            stub.Allocate(pb.AllocateRequest(container_requests=[
                pb.ContainerAllocateRequest(devices_ids=["GPU-nope"])]), timeout=5)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "unknown device: GPU-nope" in err.value.details()

        pref = stub.GetPreferredAllocation(pb.PreferredAllocationRequest(container_requests=[
            pb.ContainerPreferredAllocationRequest(
                available_deviceIDs=[gpu_uuid(0), gpu_uuid(1)],
                must_include_deviceIDs=[gpu_uuid(1)], allocation_size=1)]), timeout=5)
        assert list(pref.container_responses[0].deviceIDs) == [gpu_uuid(1)]
        assert stub.PreStartContainer(pb.PreStartContainerRequest(), timeout=5) is not None

        # health change -> the open stream gets the new list
        manager.tracker.on_probe(gpu_uuid(0), "GPU lost")
        manager.refresh_health()
        update = next(stream)
        assert [(d.ID, d.health) for d in update.devices] == [
            (gpu_uuid(0), "Unhealthy"), (gpu_uuid(1), "Healthy")]
        manager.tracker.on_probe(gpu_uuid(0), "")
        manager.refresh_health()
        assert all(d.health == "Healthy" for d in next(stream).devices)
        stream.cancel()
        channel.close()

        # kubelet restart: it wipes the directory and re-creates kubelet.sock
        kubelet.stop()
        sock.unlink()
        time.sleep(0.3)
        kubelet.start()
        again = kubelet.next_request()
        assert again.resource_name == "nvidia.com/gpu"
        deadline = time.monotonic() + 5
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        channel, stub = dial(str(sock))
        assert len(next(stub.ListAndWatch(pb.Empty(), timeout=5)).devices) == 2
        channel.close()
    finally:
        manager.stop()
    assert not (short_tmp / "gpukit-gpu.sock").exists()


def test_reenumeration_after_mig_change(kubelet: FakeKubelet, short_tmp: Path) -> None:
    backend = FakeBackend(make_inventory([make_gpu(0), make_gpu(1)]))
    manager = make_manager(short_tmp, backend,
                           Override("flags.migStrategy", "mixed", "test"))
    manager.start()
    try:
        assert kubelet.next_request().resource_name == "nvidia.com/gpu"
        channel, stub = dial(str(short_tmp / "gpukit-gpu.sock"))
        stream = stub.ListAndWatch(pb.Empty(), timeout=30)
        assert len(next(stream).devices) == 2
        # GPU 1 now in MIG mode with two 3g.20gb instances
        backend.inv = make_inventory([make_gpu(0), make_gpu(1, migs=("3g.20gb", "3g.20gb"))])
        manager.request_rescan()
        assert kubelet.next_request().resource_name == "nvidia.com/mig-3g.20gb"
        assert [d.ID for d in next(stream).devices] == [gpu_uuid(0)]
        mig_channel, mig_stub = dial(str(short_tmp / "gpukit-mig-3g.20gb.sock"))
        assert [d.ID for d in next(mig_stub.ListAndWatch(pb.Empty(), timeout=5)).devices] == [
            mig_uuid(1, 0), mig_uuid(1, 1)]
        mig_channel.close()
        # and back: the MIG resource reports zero devices, then its socket goes
        backend.inv = make_inventory([make_gpu(0), make_gpu(1)])
        manager.request_rescan()
        assert len(next(stream).devices) == 2
        deadline = time.monotonic() + 5
        while (short_tmp / "gpukit-mig-3g.20gb.sock").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not (short_tmp / "gpukit-mig-3g.20gb.sock").exists()
        stream.cancel()
        channel.close()
    finally:
        manager.stop()


def test_fail_on_init_error(short_tmp: Path) -> None:
    from gpukit.plugin.manager import InitError
    from gpukit.plugin.nvml import NvmlError

    class Broken(FakeBackend):
        def init(self) -> None:
            raise NvmlError("nvmlInit", 12, "NVML Shared Library Not Found")

    manager = make_manager(short_tmp, Broken(NodeDevices()))
    with pytest.raises(InitError, match="failOnInitError=false"):
        manager.start()
    manager.stop()
    manager = make_manager(short_tmp, Broken(NodeDevices()),
                           Override("flags.failOnInitError", False, "test"))
    manager.start()  # keeps running, serving nothing
    try:
        assert manager.servers == {} and not manager.nvml_ready
    finally:
        manager.stop()


def test_invalid_config_reload_keeps_running(kubelet: FakeKubelet, short_tmp: Path) -> None:
    cfg_file = short_tmp / "config.yaml"
    cfg_file.write_text("flags:\n  migStrategy: none\n")
    backend = FakeBackend(make_inventory([make_gpu(0, T4)]))
    manager = PluginManager(
        ConfigSource(config_file=cfg_file, overrides=[
            Override("gpukit.kubeletDir", str(short_tmp), "test"),
            Override("gpukit.rescanIntervalSeconds", 0, "test")]),
        backend, options=ManagerOptions(tick=0.05, health=False))
    manager.start()
    try:
        kubelet.next_request()
        cfg_file.write_text("sharing:\n  timeSlicing:\n    resources:\n"
                            "    - {name: gpu, replicas: 1}\n")
        assert manager.reload() is False
        assert manager.config.flags.mig_strategy == "none"
        cfg_file.write_text("sharing:\n  timeSlicing:\n    renameByDefault: true\n"
                            "    resources:\n    - {name: gpu, replicas: 3}\n")
        assert manager.reload() is True
        assert kubelet.next_request().resource_name == "nvidia.com/gpu.shared"
        assert sorted(manager.servers) == ["nvidia.com/gpu.shared"]
    finally:
        manager.stop()


def test_cdi_spec_and_labels_file_written(kubelet: FakeKubelet, short_tmp: Path) -> None:
    import json

    backend = FakeBackend(make_inventory([make_gpu(0, T4), make_gpu(1, T4)]))
    (short_tmp / "dev").mkdir()
    (short_tmp / "dev" / "nvidiactl").touch()
    manager = PluginManager(
        ConfigSource(overrides=[
            Override("gpukit.kubeletDir", str(short_tmp), "test"),
            Override("gpukit.rescanIntervalSeconds", 0, "test"),
            Override("gpukit.cdiSpecDir", str(short_tmp / "cdi"), "test"),
            Override("gpukit.deviceRoot", str(short_tmp), "test"),
            Override("flags.plugin.deviceListStrategy", "cdi-cri", "test"),
        ]),
        backend, options=ManagerOptions(tick=0.05, health=False,
                                        labels_file=str(short_tmp / "labels")))
    manager.start()
    try:
        kubelet.next_request()
        spec = json.loads((short_tmp / "cdi" / "gpukit-nvidia-gpu.json").read_text())
        assert [d["name"] for d in spec["devices"]] == [gpu_uuid(0), "0", gpu_uuid(1), "1"]
        assert spec["containerEdits"]["deviceNodes"] == [
            {"path": "/dev/nvidiactl", "hostPath": f"{short_tmp}/dev/nvidiactl"}]
        channel, stub = dial(str(short_tmp / "gpukit-gpu.sock"))
        resp = stub.Allocate(pb.AllocateRequest(container_requests=[
            pb.ContainerAllocateRequest(devices_ids=[gpu_uuid(0)])]), timeout=5)
        assert [c.name for c in resp.container_responses[0].cdi_devices] == [
            f"nvidia.com/gpu={gpu_uuid(0)}"]
        channel.close()
        assert "nvidia.com/gpu.count=2\n" in (short_tmp / "labels").read_text()
    finally:
        manager.stop()


def labelled_manager(short_tmp: Path, configs: Path, node: FakeNode, gpus: list[Any]
                     ) -> PluginManager:
    """A manager choosing among the named configs in `configs` by node n1's label, and
    labelling n1 (through `node`)."""
    source = ConfigSource(config_dir=configs, default_config="default", node_name="n1",
                          label_reader=node.labels, overrides=[
                              Override("gpukit.kubeletDir", str(short_tmp), "test"),
                              Override("gpukit.rescanIntervalSeconds", 0, "test")])
    return PluginManager(
        source, FakeBackend(make_inventory(gpus)),
        options=ManagerOptions(tick=0.05, health=False, config_poll_seconds=0.1,
                               node_labels=True),
        node_client=node,  # type: ignore[arg-type]
    )


def test_node_label_switches_config_live(kubelet: FakeKubelet, short_tmp: Path) -> None:
    configs = short_tmp / "configs"
    configs.mkdir()
    (configs / "default").write_text("version: v1\n")
    (configs / "shared").write_text(
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
        "    - {name: nvidia.com/gpu, replicas: 4}\n")
    node = FakeNode({"kubernetes.io/hostname": "n1"})
    manager = labelled_manager(short_tmp, configs, node, [make_gpu(0, T4)])
    manager.start()
    try:
        kubelet.next_request()
        assert node.labels_now["nvidia.com/gpu.product"] == "Tesla-T4"
        assert node.labels_now["nvidia.com/gpu.sharing-strategy"] == "none"
        channel, stub = dial(str(short_tmp / "gpukit-gpu.sock"))
        stream = stub.ListAndWatch(pb.Empty(), timeout=30)
        assert len(next(stream).devices) == 1
        node.labels_now["nvidia.com/device-plugin.config"] = "shared"
        assert len(next(stream).devices) == 4  # same resource, now 4 replicas
        deadline = time.monotonic() + 5
        while node.labels_now.get("nvidia.com/gpu.replicas") != "4":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert node.labels_now["nvidia.com/gpu.product"] == "Tesla-T4-SHARED"
        assert node.labels_now["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
        stream.cancel()
        channel.close()
    finally:
        manager.stop()


def test_a_stream_the_kubelet_drops_is_registered_again(
    kubelet: FakeKubelet, short_tmp: Path
) -> None:
    """The kubelet can close a plugin's ListAndWatch stream for good (an older instance of
    the same resource disconnecting after the new one registered, kubernetes#121994): the
    plugin registers again, and only then."""
    import queue

    backend = FakeBackend(make_inventory([make_gpu(0, T4)]))
    manager = PluginManager(
        ConfigSource(overrides=[Override("gpukit.kubeletDir", str(short_tmp), "test"),
                                Override("gpukit.rescanIntervalSeconds", 0, "test")]),
        backend, options=ManagerOptions(tick=0.05, health=False, register_retry_seconds=0.2,
                                        stream_grace_seconds=0.5))  # fmt: skip
    manager.start()
    try:
        req = kubelet.next_request()
        channel, stub = dial(str(short_tmp / req.endpoint))
        stream = stub.ListAndWatch(pb.Empty(), timeout=30)
        assert len(next(stream).devices) == 1
        # While the stream is open: no registration, however long.
        with pytest.raises(queue.Empty):
            kubelet.next_request(timeout=1.5)
        stream.cancel()
        again = kubelet.next_request(timeout=5)
        assert again.resource_name == "nvidia.com/gpu"
        # The new registration's stream opens: quiet again.
        stream = stub.ListAndWatch(pb.Empty(), timeout=30)
        assert len(next(stream).devices) == 1
        with pytest.raises(queue.Empty):
            kubelet.next_request(timeout=1.5)
        stream.cancel()
        channel.close()
    finally:
        manager.stop()



def test_switching_to_a_config_of_identical_content_disrupts_nothing(
    kubelet: FakeKubelet, short_tmp: Path
) -> None:
    """A rolling upgrade moves a node from a versioned config name back to the plain one once
    that carries the same content: the agent reloads, but keeps its servers (no restart, no
    new registration), its devices (no ListAndWatch update) and its labels."""
    import queue

    configs = short_tmp / "configs"
    configs.mkdir()
    shared = ("version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
              "    - {name: nvidia.com/gpu, replicas: 4}\n")
    (configs / "default").write_text("version: v1\n")
    (configs / "shared").write_text(shared)
    # The same content, written otherwise (as a YAML dump with other formatting would be).
    (configs / "shared-0123abcd").write_text(
        "sharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n"
        "      replicas: 4\nversion: v1\n")
    node = FakeNode({"nvidia.com/device-plugin.config": "shared-0123abcd"})
    manager = labelled_manager(short_tmp, configs, node, [make_gpu(0, T4), make_gpu(1, T4)])
    manager.start()
    try:
        kubelet.next_request()
        assert manager.loaded is not None and manager.loaded.name == "shared-0123abcd"
        server = manager.servers["nvidia.com/gpu"]
        version, views = server.state.snapshot()
        assert len(views) == 8
        deadline = time.monotonic() + 5
        while node.labels_now.get("nvidia.com/gpu.replicas") != "4":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        patches = len(node.patches)
        node.labels_now["nvidia.com/device-plugin.config"] = "shared"
        deadline = time.monotonic() + 5
        while manager.loaded.name != "shared":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.3)  # a few more ticks
        assert manager.servers["nvidia.com/gpu"] is server
        assert server.state.snapshot() == (version, views)
        assert len(node.patches) == patches
        with pytest.raises(queue.Empty):
            kubelet.next_request(timeout=0.5)
    finally:
        manager.stop()
