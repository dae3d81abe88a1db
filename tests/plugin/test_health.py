"""Health state machine and XID routing (no NVML: the monitor gets fake probes)."""

from __future__ import annotations

import threading

from plugin_testlib import cfg, gpu_uuid, make_gpu, make_inventory, mig_uuid

from gpukit.contracts.plugin_config import HealthSettings
from gpukit.plugin.health import (
    HealthMonitor,
    HealthTracker,
    effective_ignored_xids,
    event_target,
)
from gpukit.plugin.nvml import MIG_ID_UNSET
from gpukit.plugin.resources import build_resources


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_critical_xid_marks_unhealthy_and_recovers_after_window() -> None:
    clock = Clock()
    t = HealthTracker((13, 31), recovery_seconds=60, clock=clock)
    assert t.on_xid("GPU-a", 79) is True
    assert not t.healthy("GPU-a") and t.reason("GPU-a") == "XID 79"
    clock.now += 59
    assert not t.healthy("GPU-a")
    clock.now += 1
    assert t.healthy("GPU-a")


def test_problems_name_the_active_xid_and_the_lost_reason_while_they_last() -> None:
    """What the DRA plugin's taints are made of: the critical XID within the window, the lost
    GPU's reason; nothing once recovered, and an ignored XID never."""
    clock = Clock()
    t = HealthTracker((13,), recovery_seconds=60, clock=clock)
    assert t.problems("GPU-a") == (None, "")
    t.on_xid("GPU-a", 13)
    assert t.problems("GPU-a") == (None, "")
    t.on_xid("GPU-a", 79)
    t.on_probe("GPU-a", "GPU is lost")
    assert t.problems("GPU-a") == (79, "GPU is lost")
    clock.now += 60
    t.on_probe("GPU-a", "")
    assert t.problems("GPU-a") == (None, "") and t.healthy("GPU-a")


def test_ignored_xid_changes_nothing() -> None:
    t = HealthTracker((13, 31, 43, 45, 68, 109), recovery_seconds=60)
    assert t.on_xid("GPU-a", 13) is False
    assert t.healthy("GPU-a")


def test_sticky_without_recovery() -> None:
    clock = Clock()
    t = HealthTracker((), recovery_seconds=None, clock=clock)
    t.on_xid("GPU-a", 48)
    clock.now += 10**6
    assert not t.healthy("GPU-a")


def test_lost_gpu_until_probe_passes() -> None:
    t = HealthTracker((), recovery_seconds=None)
    t.on_probe("GPU-a", "GPU lost: GPU is lost (NVML error 15)")
    assert not t.healthy("GPU-a") and "lost" in t.reason("GPU-a")
    t.on_probe("GPU-a", "")
    assert t.healthy("GPU-a")


def test_mig_device_follows_parent() -> None:
    inv = make_inventory([make_gpu(0, migs=("3g.20gb", "3g.20gb"))])
    units = build_resources(inv, cfg({"flags": {"migStrategy": "mixed"}})).units()
    t = HealthTracker((), recovery_seconds=60)
    t.on_xid(gpu_uuid(0), 79)
    assert not any(t.unit_healthy(u) for u in units.values())


def test_event_routing() -> None:
    inv = make_inventory([make_gpu(0, migs=("3g.20gb", "3g.20gb")), make_gpu(1)])
    units = list(build_resources(inv, cfg({"flags": {"migStrategy": "mixed"}})).units().values())
    assert event_target(units, gpu_uuid(0), 2, 0) == mig_uuid(0, 1)  # gi = j + 1 in testlib
    assert event_target(units, gpu_uuid(0), MIG_ID_UNSET, MIG_ID_UNSET) == gpu_uuid(0)
    assert event_target(units, gpu_uuid(0), 9, 0) is None
    assert event_target(units, gpu_uuid(1), 0, 0) == gpu_uuid(1)


def test_nvidia_env_knobs() -> None:
    s = HealthSettings()
    assert effective_ignored_xids(s, {"DP_DISABLE_HEALTHCHECKS": "all"})[0] is False
    on, ignored = effective_ignored_xids(s, {"DP_DISABLE_HEALTHCHECKS": "48",
                                             "DP_ENABLE_HEALTHCHECKS": "13"})
    assert on and 48 in ignored and 13 not in ignored


def test_monitor_loop_probes_and_notifies() -> None:
    """The loop without NVML events: probes mark a GPU lost and then healthy again."""
    inv = make_inventory([make_gpu(0), make_gpu(1)])
    units = build_resources(inv, cfg()).units()
    t = HealthTracker((), recovery_seconds=60)
    lost = {gpu_uuid(1)}
    changes: list[bool] = []
    changed = threading.Event()

    def on_change() -> None:
        changes.append(t.healthy(gpu_uuid(1)))
        changed.set()

    m = HealthMonitor(t, lambda: units, on_change, probe_interval=0.05,
                      probe=lambda u: "GPU lost" if u in lost else "")
    m._register = lambda gpus: setattr(m, "_registered", gpus)  # type: ignore[method-assign]
    m.start()
    try:
        assert changed.wait(5)
        assert changes[-1] is False
        changed.clear()
        lost.clear()
        assert changed.wait(5)
        assert changes[-1] is True
    finally:
        m.stop()


def test_handle_xid_counts_and_notifies() -> None:
    inv = make_inventory([make_gpu(0)])
    units = build_resources(inv, cfg()).units()
    t = HealthTracker((13,), recovery_seconds=60)
    seen: list[tuple[str, int, bool]] = []
    notified: list[int] = []
    m = HealthMonitor(t, lambda: units, lambda: notified.append(1),
                      on_xid=lambda u, x, c: seen.append((u, x, c)))
    m.handle_xid(units, gpu_uuid(0), 13, MIG_ID_UNSET, MIG_ID_UNSET)
    m.handle_xid(units, gpu_uuid(0), 79, MIG_ID_UNSET, MIG_ID_UNSET)
    assert seen == [(gpu_uuid(0), 13, False), (gpu_uuid(0), 79, True)]
    assert notified == [1] and not t.healthy(gpu_uuid(0))
