"""Regression test for b8c7d46: the health loop must not spin when NVML's event wait returns at
once with nothing to act on.

On the lab the health thread ran at ~140% CPU after a lost GPU came back: nvmlEventSetWait kept
returning straight away and the loop called it again at once. The mock NVML plays such a driver
on demand (``MockControl.set_event_fault``: every wait of a set watching the GPU returns
NVML_ERROR_TIMEOUT, or an event nobody registered for, immediately). The real HealthMonitor runs
against it through real pynvml, and the test counts its waits and the CPU the process burns.
Paced, the loop waits about 1/timeout times a second (2/s with the 0.5 s wait, 20/s at the
smallest probe interval, 0.05 s); without pacing it made 75,000-100,000 waits/s at ~100% CPU
here. The bounds sit far from both, and load only slows the loop, so a busy machine cannot fail it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest

from gpukit.contracts.plugin_config import parse_config
from gpukit.lab import nvml as mock
from gpukit.lab.nvml.control import MockControl
from gpukit.plugin import nvml
from gpukit.plugin.health import HealthMonitor, HealthTracker
from gpukit.plugin.resources import Unit, build_resources

pytestmark = pytest.mark.nvml

MEASURE_S = 1.0  # per case; the spin shows within milliseconds
MAX_WAITS_PER_S = 60.0  # paced: <= 20/s; spinning: thousands
MAX_CPU_FRACTION = 0.3  # of one core over the window; paced: ~1%; spinning: ~100%


@pytest.fixture(scope="module")
def mock_lib() -> Path:
    """The repository's build of the mock (make: a no-op when up to date), unless
    GPUKIT_NVML_LIB names another; one without the event-fault knob is skipped, not failed."""
    explicit = os.environ.get(mock.ENV_LIB)
    lib = Path(explicit) if explicit else mock.build()
    if not hasattr(mock.load_mock(lib), "gpukitMockSetEventFault"):
        pytest.skip(f"{lib} has no gpukitMockSetEventFault (rebuild: make nvml)")
    return lib


@pytest.fixture
def gpus(mock_lib: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
         ) -> Iterator[tuple[MockControl, dict[str, Unit]]]:
    """A T4 x2 node on the mock, NVML initialised in this process; its units (whole GPUs)."""
    monkeypatch.setenv(mock.ENV_PROFILE, str(mock.profile_path("t4-x2")))
    monkeypatch.setenv(mock.ENV_STATE_DIR, str(tmp_path / "nvml-state"))
    monkeypatch.setenv(mock.ENV_LIB, str(mock_lib))
    monkeypatch.delenv(mock.ENV_SEED, raising=False)
    mock.load_mock(mock_lib)
    ctl = MockControl(mock_lib)
    nvml.init()
    try:
        units = build_resources(nvml.discover(), parse_config({})).units()
        yield ctl, units
    finally:
        nvml.shutdown()


class WaitCounter:
    """Wraps pynvml.nvmlEventSetWait_v2 (the call the health loop makes) to count calls."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        self.outcomes: dict[str, int] = {}
        self._lock = threading.Lock()
        real: Callable[..., Any] = pynvml.nvmlEventSetWait_v2

        def counting(event_set: Any, timeout_ms: int) -> Any:
            outcome = "event"
            try:
                return real(event_set, timeout_ms)
            except pynvml.NVMLError as exc:
                outcome = str(exc)
                raise
            finally:
                with self._lock:
                    self.calls += 1
                    self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1

        monkeypatch.setattr(pynvml, "nvmlEventSetWait_v2", counting)

    def snapshot(self) -> int:
        with self._lock:
            return self.calls


def run_monitor(units: dict[str, Unit], counter: WaitCounter, probe_interval: float,
                during: Callable[[HealthTracker], None] | None = None
                ) -> tuple[float, float, HealthTracker]:
    """Run the real health loop; (waits per second, CPU fraction of one core) over MEASURE_S."""
    tracker = HealthTracker((), recovery_seconds=60)
    monitor = HealthMonitor(tracker, lambda: units, lambda: None, probe_interval=probe_interval)
    monitor.start()
    try:
        time.sleep(0.2)  # event set registered, first probe done
        calls0, cpu0, t0 = counter.snapshot(), time.process_time(), time.monotonic()
        time.sleep(MEASURE_S)
        calls1, cpu1, t1 = counter.snapshot(), time.process_time(), time.monotonic()
        if during is not None:
            during(tracker)
    finally:
        monitor.stop()
    wall = t1 - t0
    return (calls1 - calls0) / wall, (cpu1 - cpu0) / wall, tracker


@pytest.mark.parametrize(("fault", "probe_interval"), [
    ("timeout", 5.0),     # NVML_ERROR_TIMEOUT at once, default probe interval (0.5 s waits)
    ("spurious", 5.0),    # at once with a PState event the loop has nothing to do with
    ("timeout", 0.05),    # the smallest probe interval the config accepts (0.05 s waits)
])
def test_health_loop_paces_waits_that_return_at_once(
    gpus: tuple[MockControl, dict[str, Unit]], monkeypatch: pytest.MonkeyPatch, fault: str,
    probe_interval: float,
) -> None:
    ctl, units = gpus
    counter = WaitCounter(monkeypatch)
    ctl.set_event_fault(1, fault)  # waits on GPU 1 (and so on the set) stop blocking

    def xid_still_reaches_the_loop(tracker: HealthTracker) -> None:
        gpu0 = next(u.gpu.uuid for u in units.values() if u.gpu.index == 0)
        ctl.inject_xid(gpu=0, xid=79)
        deadline = time.monotonic() + 5
        while tracker.healthy(gpu0) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not tracker.healthy(gpu0), "an XID was lost while the wait misbehaved"

    rate, cpu, _ = run_monitor(units, counter, probe_interval, xid_still_reaches_the_loop)
    detail = f"{rate:.0f} waits/s, CPU {cpu:.0%} of one core, outcomes {counter.outcomes}"
    print(f"{fault}, probe interval {probe_interval}: {detail}")
    # the fault is really in effect: the waits came back early, not after blocking
    expected = "Timeout" if fault == "timeout" else "event"
    assert counter.outcomes.get(expected, 0) > 0, detail
    assert rate < MAX_WAITS_PER_S, f"health loop spins on early NVML waits: {detail}"
    assert cpu < MAX_CPU_FRACTION, f"health loop burns CPU on early NVML waits: {detail}"


def test_mock_event_fault_returns_at_once(gpus: tuple[MockControl, dict[str, Unit]]) -> None:
    """The knob itself: a wait on a faulty GPU's set returns in well under its timeout; real
    events still come first; `normal` makes it block again; status shows the mode."""
    ctl, _ = gpus
    event_set = pynvml.nvmlEventSetCreate()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(1)
        pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, event_set)
        ctl.set_event_fault(1, "timeout")
        assert ctl.status()["gpus"][1]["events"] == "timeout"
        t0 = time.monotonic()
        with pytest.raises(pynvml.NVMLError) as e:
            pynvml.nvmlEventSetWait_v2(event_set, 2000)
        assert e.value.value == pynvml.NVML_ERROR_TIMEOUT and time.monotonic() - t0 < 0.5
        ctl.inject_xid(gpu=1, xid=48)
        data = pynvml.nvmlEventSetWait_v2(event_set, 2000)
        assert (data.eventType, data.eventData) == (pynvml.nvmlEventTypeXidCriticalError, 48)
        ctl.set_event_fault(1, "spurious")
        data = pynvml.nvmlEventSetWait_v2(event_set, 2000)
        assert data.eventType == pynvml.nvmlEventTypePState
        ctl.set_event_fault(1, "normal")
        t0 = time.monotonic()
        with pytest.raises(pynvml.NVMLError):
            pynvml.nvmlEventSetWait_v2(event_set, 200)
        assert time.monotonic() - t0 >= 0.19
        ctl.set_event_fault(1, "timeout")
        ctl.boot()  # a boot clears it, like lost GPUs
        assert ctl.status()["gpus"][1]["events"] == "normal"
    finally:
        pynvml.nvmlEventSetFree(event_set)
