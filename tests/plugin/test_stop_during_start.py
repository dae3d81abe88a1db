"""A stop signal that arrives while the manager's loop thread is being started (SIGTERM at
startup raises StopRequested inside Thread.start()) must not make stop() fail: CI saw
`RuntimeError: cannot join thread before it is started` from the agent's shutdown."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from plugin_testlib import T4, FakeBackend, make_gpu, make_inventory

from gpukit.plugin.config_source import ConfigSource, Override
from gpukit.plugin.manager import ManagerOptions, PluginManager


class Interrupted(Exception):
    pass


def test_stop_after_a_start_interrupted_in_thread_start(short_tmp: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    manager = PluginManager(
        ConfigSource(overrides=[Override("gpukit.kubeletDir", str(short_tmp), "test"),
                                Override("gpukit.rescanIntervalSeconds", 0, "test")]),
        FakeBackend(make_inventory([make_gpu(0, T4)])),
        options=ManagerOptions(tick=0.05, health=False))

    def interrupted_start(self: threading.Thread) -> None:
        if self.name == "gpukit-manager":  # as the signal handler's raise leaves it: not started
            raise Interrupted
        real_start(self)

    real_start = threading.Thread.start
    monkeypatch.setattr(threading.Thread, "start", interrupted_start)
    with pytest.raises(Interrupted):
        manager.start()
    monkeypatch.setattr(threading.Thread, "start", real_start)
    manager.stop()  # raised RuntimeError before
    assert not manager.servers
