"""The agent re-registers when the kubelet restarts without waiting for a poll period: the
manager's tick here is an hour, so only the kubelet dir watch can bring it back."""

from __future__ import annotations

import threading
from pathlib import Path

from plugin_testlib import T4, FakeBackend, FakeKubelet, dial, make_gpu, make_inventory

from gpukit.plugin.api import deviceplugin_pb2 as pb
from gpukit.plugin.config_source import ConfigSource, Override
from gpukit.plugin.dir_watch import DirWatch
from gpukit.plugin.manager import ManagerOptions, PluginManager

HOUR = 3600.0


def test_reregisters_on_kubelet_restart_without_a_tick(kubelet: FakeKubelet,
                                                       short_tmp: Path) -> None:
    backend = FakeBackend(make_inventory([make_gpu(0, T4)]))
    manager = PluginManager(
        ConfigSource(overrides=[Override("gpukit.kubeletDir", str(short_tmp), "test"),
                                Override("gpukit.rescanIntervalSeconds", 0, "test")]),
        backend, options=ManagerOptions(tick=HOUR, health=False, register_retry_seconds=HOUR))
    manager.start()
    try:
        first = kubelet.next_request()
        sock = short_tmp / first.endpoint
        # The kubelet restarts: it deletes the plugin sockets, then creates kubelet.sock.
        kubelet.stop()
        sock.unlink()
        kubelet.start()
        again = kubelet.next_request(timeout=10)
        assert (again.resource_name, again.endpoint) == (first.resource_name, first.endpoint)
        channel, stub = dial(str(sock))  # served again on a fresh socket
        assert len(next(stub.ListAndWatch(pb.Empty(), timeout=5)).devices) == 1
        channel.close()
    finally:
        manager.stop()
    assert not manager.kubelet_dir_watch.watching


def test_watch_waits_for_the_directory_and_follows_a_new_one(tmp_path: Path) -> None:
    changed = threading.Event()
    watch = DirWatch(changed.set)
    later = tmp_path / "later"
    try:
        assert not watch.ensure(str(later))  # not there yet: the tick asks again
        later.mkdir()
        assert watch.ensure(str(later))
        (later / "kubelet.sock").touch()
        assert changed.wait(5)
        other = tmp_path / "other"
        other.mkdir()
        changed.clear()
        assert watch.ensure(str(other))
        changed.wait(0.3)  # dropping the old watch may itself wake the loop once
        changed.clear()
        (later / "ignored").touch()  # the old directory is no longer watched
        assert not changed.wait(0.3)
        (other / "kubelet.sock").touch()
        assert changed.wait(5)
    finally:
        watch.stop()
