"""XID log rate limiting (issue #14): a storm is logged as one line per (device, XID) pair and
then periodic counts, while the XID metric still counts every event. A fake clock drives the
monitor's XID path (handle_xid, and XidLog.flush as the health loop calls it)."""

from __future__ import annotations

import io
import logging
import re
from collections.abc import Iterator

import pytest
from plugin_testlib import cfg, gpu_uuid, make_gpu, make_inventory

from gpukit.plugin.health import XID_LOG_INTERVAL, HealthMonitor, HealthTracker, XidLog
from gpukit.plugin.metrics import PluginMetrics
from gpukit.plugin.nvml import MIG_ID_UNSET
from gpukit.plugin.resources import Unit, build_resources

# What the agent writes per line (gpukit/plugin/cli.py's logging format).
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class Clock:
    def __init__(self) -> None:
        self.now = 5000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def health_log() -> Iterator[io.StringIO]:
    """Everything the health module logs, formatted as the agent formats it."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    logger = logging.getLogger("gpukit.plugin.health")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield out
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


def eight_gpus() -> dict[str, Unit]:
    return build_resources(make_inventory([make_gpu(i) for i in range(8)]), cfg()).units()


def eight_gpu_monitor() -> tuple[Clock, dict[str, Unit], PluginMetrics, HealthMonitor]:
    """A health monitor over eight GPUs on a test clock, counting XIDs into fresh metrics."""
    clock = Clock()
    units = eight_gpus()
    metrics = PluginMetrics()
    tracker = HealthTracker((13,), recovery_seconds=60, clock=clock)
    monitor = HealthMonitor(tracker, lambda: units, lambda: None, on_xid=metrics.count_xid,
                            xid_log=XidLog(clock=clock))
    return clock, units, metrics, monitor


def xid_counts(metrics: PluginMetrics) -> dict[tuple[str, str, str], float]:
    return {(s.labels["device"], s.labels["xid"], s.labels["critical"]): s.value
            for m in metrics.xids.collect() for s in m.samples if s.name.endswith("_total")}


def test_a_storm_of_1000_xid_per_second_for_60s_logs_under_100kb(
        health_log: io.StringIO) -> None:
    clock, units, metrics, monitor = eight_gpu_monitor()
    for tick in range(120):  # 60 s in the health loop's 0.5 s turns, 500 events each
        for n in range(tick * 500, tick * 500 + 500):  # round robin over the 8 GPUs
            monitor.handle_xid(units, gpu_uuid(n % 8), 79, MIG_ID_UNSET, MIG_ID_UNSET)
            clock.now += 0.001
        monitor.xid_log.flush()
    clock.now += XID_LOG_INTERVAL  # the storm is over: its last counts come out
    monitor.xid_log.flush()

    text = health_log.getvalue()
    lines = text.splitlines()
    assert len(text.encode()) < 100_000, f"{len(text.encode())} bytes logged"
    # Per pair: the first event, then one summary per interval (60 s / 30 s), plus the last.
    assert len(lines) <= 8 * (1 + 60 / XID_LOG_INTERVAL + 1) + 8  # + the Unhealthy transitions
    # The metric counts every event, exactly.
    assert xid_counts(metrics) == {(gpu_uuid(i), "79", "true"): 7500 for i in range(8)}
    # And the lines account for every event too: 1 per first line plus each summary's count.
    for i in range(8):
        mine = [ln for ln in lines if f"XID 79 on {gpu_uuid(i)}" in ln]
        firsts = sum("repeats summarised" in ln for ln in mine)
        counted = sum(int(m.group(1)) for ln in mine
                      if (m := re.search(r"\((\d+) more in the last", ln)))
        assert (firsts, firsts + counted) == (1, 7500), mine


def test_a_new_pair_is_logged_at_once_repeats_are_counted(health_log: io.StringIO) -> None:
    clock, units, metrics, monitor = eight_gpu_monitor()

    def xid(gpu: int, number: int) -> None:
        monitor.handle_xid(units, gpu_uuid(gpu), number, MIG_ID_UNSET, MIG_ID_UNSET)

    def lines() -> list[str]:
        return health_log.getvalue().splitlines()

    xid(0, 79)
    assert any(f"XID 79 on {gpu_uuid(0)}: marking it unhealthy" in ln for ln in lines())
    before = len(lines())
    for _ in range(50):
        xid(0, 79)
    assert len(lines()) == before  # repeats within the interval: counted, not logged
    xid(0, 48)  # another XID on the same GPU: a new pair
    assert f"XID 48 on {gpu_uuid(0)}" in lines()[-1]
    xid(3, 13)  # an ignored XID on another GPU: a new pair too, at its own level
    assert f"XID 13 on {gpu_uuid(3)} ignored" in lines()[-1] and " INFO " in lines()[-1]
    monitor.xid_log.flush()
    assert not any("more in the last" in ln for ln in lines())  # nothing due yet
    clock.now += XID_LOG_INTERVAL
    monitor.xid_log.flush()
    assert any(f"XID 79 on {gpu_uuid(0)}" in ln and "(50 more in the last 30s)" in ln
               for ln in lines()), lines()
    # A pair quiet for a whole interval is forgotten: its next event is logged at once again.
    clock.now += XID_LOG_INTERVAL
    monitor.xid_log.flush()
    before = len(lines())
    xid(3, 13)
    assert len(lines()) == before + 1 and "repeats summarised" in lines()[-1]
    assert xid_counts(metrics) == {(gpu_uuid(0), "79", "true"): 51,
                                   (gpu_uuid(0), "48", "true"): 1,
                                   (gpu_uuid(3), "13", "false"): 2}
