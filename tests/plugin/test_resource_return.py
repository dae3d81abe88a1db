"""A resource that goes and comes back before its socket closed is served on by the same
server: no second server on the same socket path, no second registration. Kubelets from 1.36
track plugins by socket path and refuse a registration while the old connection is open,
then keep a stale endpoint that refuses the resource for good (seen on the lab: a MIG layout
change that briefly left no whole GPU under migStrategy mixed)."""

from __future__ import annotations

import os
import queue
import time
from pathlib import Path

import pytest
from plugin_testlib import FakeBackend, FakeKubelet, dial, gpu_uuid, make_gpu, make_inventory

from gpukit.plugin.api import deviceplugin_pb2 as pb
from gpukit.plugin.config_source import ConfigSource, Override
from gpukit.plugin.manager import ManagerOptions, PluginManager


def test_a_resource_back_before_its_socket_closed_keeps_its_server(
    kubelet: FakeKubelet, short_tmp: Path
) -> None:
    whole = make_inventory([make_gpu(0), make_gpu(1)])
    all_mig = make_inventory([make_gpu(0, migs=("3g.20gb",)), make_gpu(1, migs=("3g.20gb",))])
    backend = FakeBackend(whole)
    manager = PluginManager(
        ConfigSource(overrides=[Override("gpukit.kubeletDir", str(short_tmp), "test"),
                                Override("gpukit.rescanIntervalSeconds", 0, "test"),
                                Override("flags.migStrategy", "mixed", "test")]),
        backend, options=ManagerOptions(tick=0.05, health=False, register_retry_seconds=0.2))
    manager.start()
    try:
        assert kubelet.next_request().resource_name == "nvidia.com/gpu"
        sock = short_tmp / "gpukit-gpu.sock"
        first_inode = os.stat(sock).st_ino
        channel, stub = dial(str(sock))
        stream = stub.ListAndWatch(pb.Empty(), timeout=30)
        assert [d.ID for d in next(stream).devices] == [gpu_uuid(0), gpu_uuid(1)]
        # Every GPU in MIG mode: no whole GPU, nvidia.com/gpu reports zero devices...
        backend.inv = all_mig
        manager.request_rescan()
        assert [d.ID for d in next(stream).devices] == []
        assert kubelet.next_request().resource_name == "nvidia.com/mig-3g.20gb"
        # ...and is back well within the second before its socket would close.
        backend.inv = whole
        manager.request_rescan()
        assert [d.ID for d in next(stream).devices] == [gpu_uuid(0), gpu_uuid(1)]
        time.sleep(1.5)  # past the retired socket's close
        assert os.stat(sock).st_ino == first_inode
        with pytest.raises(queue.Empty):
            extra = kubelet.next_request(timeout=1)
            assert extra.resource_name != "nvidia.com/gpu", "registered nvidia.com/gpu again"
        stream.cancel()
        channel.close()
    finally:
        manager.stop()
    assert not (short_tmp / "gpukit-gpu.sock").exists()
