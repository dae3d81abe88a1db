"""The agent's side of a killed MIG apply (issue #14): the devices a dead owner's pause file
held Unhealthy are served again at the agent's next check, not when the file expires."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from plugin_testlib import T4, FakeBackend, FakeKubelet, dial, gpu_uuid, make_gpu, make_inventory

from gpukit.plugin.api import deviceplugin_pb2 as pb
from gpukit.plugin.config_source import ConfigSource, Override
from gpukit.plugin.manager import ManagerOptions, PluginManager

APPLY = """
import sys, time
from gpukit.plugin.mig.hooks import PauseFile
PauseFile(sys.argv[1]).pause([(1, sys.argv[2])], "mixed")
print("paused", flush=True)
time.sleep(600)
"""


def health(resp: Any) -> dict[str, str]:
    return {d.ID: d.health for d in resp.devices}


def test_devices_come_back_at_the_next_tick_after_the_apply_is_killed(
        kubelet: FakeKubelet, short_tmp: Path) -> None:
    pause = short_tmp / "plugin.pause"
    source = ConfigSource(overrides=[Override("gpukit.kubeletDir", str(short_tmp), "test"),
                                     Override("gpukit.rescanIntervalSeconds", 0, "test")])
    manager = PluginManager(
        source, FakeBackend(make_inventory([make_gpu(0, T4), make_gpu(1, T4)])),
        options=ManagerOptions(tick=0.05, health=False, pause_file=str(pause)))
    manager.start()
    apply = None
    try:
        kubelet.next_request()
        channel, stub = dial(str(short_tmp / "gpukit-gpu.sock"))
        stream = stub.ListAndWatch(pb.Empty(), timeout=30)
        assert set(health(next(stream)).values()) == {"Healthy"}
        apply = subprocess.Popen([sys.executable, "-c", APPLY, str(pause), gpu_uuid(1)],
                                 stdout=subprocess.PIPE, text=True)
        assert apply.stdout is not None and apply.stdout.readline().strip() == "paused"
        assert health(next(stream)) == {gpu_uuid(0): "Healthy", gpu_uuid(1): "Unhealthy"}
        os.kill(apply.pid, signal.SIGKILL)  # mid-change: no resume, no file removal
        killed = time.monotonic()
        assert set(health(next(stream)).values()) == {"Healthy"}
        assert time.monotonic() - killed < 2.0  # a tick is 0.05 s; the file expires in 900 s
        assert not pause.exists()
        stream.cancel()
        channel.close()
    finally:
        if apply is not None:
            apply.kill()
            apply.wait(timeout=10)
            if apply.stdout is not None:
                apply.stdout.close()
        manager.stop()
