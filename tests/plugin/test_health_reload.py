"""A config reload applies `gpukit.health` (issue #14): the health monitor is stopped when
health checks are disabled (and what it had marked Unhealthy is Healthy again), started when
they are enabled, and retuned when the probe interval changes. Against the lab's mock NVML,
in-process, with a stand-in kubelet."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from plugin_testlib import FakeKubelet, dial

from gpukit.lab import nvml as mock
from gpukit.lab.nvml.control import MockControl
from gpukit.plugin.api import deviceplugin_pb2 as pb
from gpukit.plugin.config_source import ConfigSource, Override
from gpukit.plugin.manager import ManagerOptions, PluginManager, PynvmlBackend

pytestmark = pytest.mark.nvml


@pytest.fixture
def ctl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> MockControl:
    """A T4 x2 node on the repository's build of the mock (or GPUKIT_NVML_LIB's)."""
    explicit = os.environ.get(mock.ENV_LIB)
    lib = Path(explicit) if explicit else mock.build()
    monkeypatch.setenv(mock.ENV_PROFILE, str(mock.profile_path("t4-x2")))
    monkeypatch.setenv(mock.ENV_STATE_DIR, str(tmp_path / "nvml-state"))
    monkeypatch.setenv(mock.ENV_LIB, str(lib))
    monkeypatch.delenv(mock.ENV_SEED, raising=False)
    for var in ("DP_DISABLE_HEALTHCHECKS", "DP_ENABLE_HEALTHCHECKS"):
        monkeypatch.delenv(var, raising=False)
    mock.load_mock(lib)
    return MockControl(lib)


def write_health(path: Path, **health: Any) -> None:
    lines = "".join(f"    {k}: {str(v).lower() if isinstance(v, bool) else v}\n"
                    for k, v in health.items())
    path.write_text(f"version: v1\ngpukit:\n  health:\n    recoverySeconds: null\n{lines}")


def wait_until(what: str, check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_reload_stops_starts_and_retunes_the_health_monitor(
        ctl: MockControl, kubelet: FakeKubelet, short_tmp: Path) -> None:
    config = short_tmp / "plugin.yaml"
    write_health(config, probeIntervalSeconds=0.1)
    source = ConfigSource(config_file=config, overrides=[
        Override("gpukit.kubeletDir", str(short_tmp), "test"),
        Override("gpukit.rescanIntervalSeconds", 0, "test"),
    ])
    manager = PluginManager(source, PynvmlBackend(), options=ManagerOptions(tick=0.05))
    manager.start()
    channel = None
    try:
        kubelet.next_request()
        gpus = [g.uuid for g in manager.devices.gpus]
        channel, stub = dial(str(short_tmp / "gpukit-gpu.sock"))
        stream = stub.ListAndWatch(pb.Empty(), timeout=30)

        def health() -> dict[str, str]:
            return {d.ID: d.health for d in next(stream).devices}

        assert set(health().values()) == {"Healthy"}
        first = manager.monitor
        assert first is not None
        ctl.inject_xid(gpu=1, xid=79)
        assert health()[gpus[1]] == "Unhealthy"  # sticky: recoverySeconds null

        # disabled: the monitor stops, and the XID it saw no longer counts
        write_health(config, probeIntervalSeconds=0.1, disabled=True)
        assert manager.reload()
        assert manager.monitor is None
        assert first._thread is not None and not first._thread.is_alive()
        assert set(health().values()) == {"Healthy"}
        ctl.inject_xid(gpu=0, xid=79)
        time.sleep(0.5)  # the monitor took < 0.1 s to report an XID above
        assert all(v.healthy for v in manager.servers["nvidia.com/gpu"].state.snapshot()[1])

        # enabled again: a new monitor, which sees new XIDs
        write_health(config, probeIntervalSeconds=5)
        assert manager.reload()
        second = manager.monitor
        assert second is not None and second is not first and second.probe_interval == 5
        # An XID before its event set exists is not delivered to it (as with real NVML).
        wait_until("the new monitor to watch the GPUs",
                   lambda: second._registered == frozenset(gpus))
        ctl.inject_xid(gpu=0, xid=79)
        assert health()[gpus[0]] == "Unhealthy"

        # a new probe interval: the same monitor, retuned (probes counted per GPU)
        probes: list[str] = []
        real_probe = second.probe

        def counting_probe(uuid: str) -> str:
            probes.append(uuid)
            return real_probe(uuid)

        second.probe = counting_probe
        time.sleep(1.0)
        assert len(probes) <= len(gpus)  # at most one round in a second at 5 s
        write_health(config, probeIntervalSeconds=0.1)
        assert manager.reload()
        assert manager.monitor is second and second.probe_interval == 0.1
        probes.clear()
        time.sleep(1.0)
        assert len(probes) >= 4 * len(gpus), probes  # ~10 rounds a second now
        stream.cancel()
    finally:
        if channel is not None:
            channel.close()
        manager.stop()
