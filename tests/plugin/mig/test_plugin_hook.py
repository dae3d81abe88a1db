"""The device plugin honours the MIG manager's pause (needs the small hook in
gpukit/plugin/manager.py described in gpukit/plugin/mig/README.md; skipped until it is there): devices of the
GPUs being changed turn Unhealthy while paused, and the new layout is served right after."""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from migtest import MockNode

from gpukit.contracts import mig_parted as schema
from gpukit.plugin.api import deviceplugin_grpc
from gpukit.plugin.api import deviceplugin_pb2 as pb
from gpukit.plugin.config_source import ConfigSource, Override
from gpukit.plugin.manager import ManagerOptions, PluginManager, PynvmlBackend
from gpukit.plugin.mig.applier import apply
from gpukit.plugin.mig.hooks import PauseFile

pytestmark = [
    pytest.mark.nvml,
    pytest.mark.skipif(
        "pause_file" not in {f.name for f in dataclasses.fields(ManagerOptions)},
        reason="device plugin pause hook not installed (gpukit/plugin/mig/README.md, 'Plugin hook')"),
]


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gk-mig-", dir="/tmp"))  # unix socket paths are short
    yield path
    shutil.rmtree(path, ignore_errors=True)


def health(resp: Any) -> list[str]:
    return sorted(d.health for d in resp.devices)


def test_plugin_paused_during_apply_then_serves_the_new_layout(
    a100: MockNode, sock_dir: Path
) -> None:
    a100.make(0, [("3g.20gb", 0), ("3g.20gb", 4)])
    pause_path = sock_dir / "plugin.pause"
    source = ConfigSource(overrides=[
        Override("gpukit.kubeletDir", str(sock_dir), "test"),
        Override("gpukit.rescanIntervalSeconds", 0, "test"),
        Override("gpukit.metricsAddress", "", "test"),
        Override("flags.migStrategy", "mixed", "test"),
    ])
    hook: dict[str, Any] = {"pause_file": str(pause_path)}  # the field the hook adds
    manager = PluginManager(source, PynvmlBackend(), options=dataclasses.replace(
        ManagerOptions(tick=0.05, health=False), **hook))
    manager.start()
    channel = grpc.insecure_channel(f"unix://{sock_dir / 'gpukit-mig-3g.20gb.sock'}")
    try:
        stream = deviceplugin_grpc.DevicePluginStub(channel).ListAndWatch(pb.Empty(), timeout=30)
        assert health(next(stream)) == ["Healthy", "Healthy"]
        uuid0 = a100.gpus()[0].uuid
        pauser = PauseFile(pause_path, ack_timeout=5)
        pauser.pause([(0, uuid0)], "seven")
        assert (sock_dir / "plugin.pause.ack").exists()  # the plugin acknowledged
        assert health(next(stream)) == ["Unhealthy", "Unhealthy"]
        c = schema.parse({"seven": [{"devices": [0], "mig-enabled": True,
                                     "mig-devices": {"7g.40gb": 1}}]})
        assert apply(c, "seven", a100.backend, a100.reset, pauser=pauser).changed
        assert next(stream).devices == []  # the 3g resource is gone after the rescan
        assert "nvidia.com/mig-7g.40gb" in manager.resources.resources
        stream.cancel()
    finally:
        channel.close()
        manager.stop()
