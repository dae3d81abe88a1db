"""Device health: an NVML event loop feeding a small state machine.

The rule (documented for users in the config reference):
- A device becomes Unhealthy on a critical XID event for it (XIDs in `ignoredXids`, by default
  the application errors 13, 31, 43, 45, 68, 109, are counted but change nothing), or when a
  probe of its GPU fails with a "GPU is gone" NVML error (GPU_IS_LOST, RESET_REQUIRED, UNKNOWN,
  ...) or the GPU can no longer be found.
- An XID on a MIG device (event with GPU/compute instance ids) marks only that MIG device; an
  XID without instance ids marks the GPU, and with it all of its MIG devices.
- A device is Healthy again once its GPU probes fine AND no critical XID has hit it for
  `recoverySeconds` (default 60). With `recoverySeconds: null` an XID is sticky until restart
  (NVIDIA's behaviour); a lost GPU still recovers when NVML sees it again.
- Probes run every `probeIntervalSeconds` for every GPU; NVML failures never stop the plugin.

XIDs are logged through `XidLog`: a (device, XID) pair's first event at once, then at most one
summary line per pair and `XID_LOG_INTERVAL` with the count since the last line. A storm of
1000 XID/s once wrote a line per event (~10 MB/min); the metric still counts every event.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from gpukit.contracts.plugin_config import HealthSettings

from .nvml import MIG_ID_UNSET, NvmlError
from .nvml.events import XidEvents, probe_gpu
from .resources import Unit

log = logging.getLogger(__name__)
Clock = Callable[[], float]
XID_LOG_INTERVAL = 30.0  # seconds between summary lines of one (device, XID) pair


@dataclass
class _State:
    lost: str = ""  # why the last probe failed, "" when fine
    last_xid: int | None = None
    last_xid_at: float | None = None

    def healthy(self, now: float, recovery: float | None) -> bool:
        if self.lost:
            return False
        if self.last_xid_at is None:
            return True
        return recovery is not None and now - self.last_xid_at >= recovery


def effective_ignored_xids(
    settings: HealthSettings, environ: Mapping[str, str] | None = None
) -> tuple[bool, frozenset[int]]:
    """(health checks enabled, ignored XIDs), honouring NVIDIA's DP_DISABLE_HEALTHCHECKS
    ("all", or extra XIDs to ignore) and DP_ENABLE_HEALTHCHECKS (XIDs to check anyway)."""
    env = os.environ if environ is None else environ
    ignored = set(settings.ignored_xids)
    disable = [x.strip().lower() for x in env.get("DP_DISABLE_HEALTHCHECKS", "").split(",")]
    if settings.disabled or "all" in disable or "xids" in disable:
        return False, frozenset(ignored)
    ignored.update(int(x) for x in disable if x.isdigit())
    enable = [x.strip() for x in env.get("DP_ENABLE_HEALTHCHECKS", "").split(",")]
    ignored.difference_update(int(x) for x in enable if x.isdigit())
    return True, frozenset(ignored)


class HealthTracker:
    """Thread-safe health per UUID (GPU or MIG device); knows nothing about NVML."""

    def __init__(
        self,
        ignored_xids: Iterable[int],
        recovery_seconds: float | None,
        clock: Clock = time.monotonic,
    ) -> None:
        self.ignored = frozenset(ignored_xids)
        self.recovery = recovery_seconds
        self.clock = clock
        self._states: dict[str, _State] = {}
        self._lock = threading.Lock()

    def _state(self, uuid: str) -> _State:
        return self._states.setdefault(uuid, _State())

    def is_ignored(self, xid: int) -> bool:
        return xid in self.ignored

    def on_xid(self, uuid: str, xid: int) -> bool:
        """Record a critical XID for a GPU or MIG UUID; True if it was not ignored."""
        if xid in self.ignored:
            return False
        with self._lock:
            st = self._state(uuid)
            st.last_xid, st.last_xid_at = xid, self.clock()
        return True

    def on_probe(self, uuid: str, problem: str) -> None:
        """Result of probing a GPU: problem is "" when NVML answered normally."""
        with self._lock:
            self._state(uuid).lost = problem

    def healthy(self, uuid: str) -> bool:
        with self._lock:
            st = self._states.get(uuid)
            return st is None or st.healthy(self.clock(), self.recovery)

    def unit_healthy(self, unit: Unit) -> bool:
        """A MIG device is healthy only while its parent GPU is too."""
        if unit.mig is not None and not self.healthy(unit.gpu.uuid):
            return False
        return self.healthy(unit.uuid)

    def reason(self, uuid: str) -> str:
        with self._lock:
            st = self._states.get(uuid)
            if st is None:
                return ""
            if st.lost:
                return st.lost
            return f"XID {st.last_xid}" if st.last_xid_at is not None else ""

    def problems(self, uuid: str) -> tuple[int | None, str]:
        """(the critical XID that keeps it unhealthy, or None; why its GPU is lost, or "")."""
        with self._lock:
            st = self._states.get(uuid)
            if st is None:
                return None, ""
            active = st.last_xid_at is not None and not (
                self.recovery is not None and self.clock() - st.last_xid_at >= self.recovery)
            return (st.last_xid if active else None), st.lost

    def clear(self) -> None:
        """Forget every XID and probe result (health checks switched off: all Healthy)."""
        with self._lock:
            self._states.clear()

    def expire(self) -> None:
        """Forget XIDs older than the recovery window so they stop counting."""
        if self.recovery is None:
            return
        now = self.clock()
        with self._lock:
            for st in self._states.values():
                if st.last_xid_at is not None and now - st.last_xid_at >= self.recovery:
                    st.last_xid = st.last_xid_at = None


def event_target(units: Iterable[Unit], gpu_uuid: str, gi: int, ci: int) -> str | None:
    """UUID an XID event is about: the MIG device matching gi/ci, else the GPU itself.
    None when the instance ids match no MIG device we serve (NVIDIA ignores those too)."""
    if gi == MIG_ID_UNSET or ci == MIG_ID_UNSET:
        return gpu_uuid
    migs = [u for u in units if u.mig is not None and u.gpu.uuid == gpu_uuid]
    if not migs:
        return gpu_uuid
    for unit in migs:
        assert unit.mig is not None
        if unit.mig.gi == gi and unit.mig.ci == ci:
            return unit.uuid
    return None


XidCallback = Callable[[str, int, bool], None]  # (target uuid, xid, counted as critical)


@dataclass
class _XidKey:
    level: int
    what: str  # "XID 79 on GPU-...: marking it unhealthy"
    last_line: float  # clock time of the last line written for this pair
    pending: int = 0  # events since that line, not yet written


class XidLog:
    """Rate-limited XID log lines: a pair's first event at once, then one summary per
    `interval` counting what came in between. Pairs quiet for an interval are forgotten, so
    their next event is logged at once again. Thread-safe."""

    def __init__(self, interval: float = XID_LOG_INTERVAL, clock: Clock = time.monotonic,
                 logger: logging.Logger = log) -> None:
        self.interval = interval
        self.clock = clock
        self.logger = logger
        self._keys: dict[tuple[str, int], _XidKey] = {}
        self._lock = threading.Lock()

    def event(self, device: str, xid: int, level: int, what: str) -> None:
        """One XID event; `what` is the line to write when this one is written."""
        now = self.clock()
        with self._lock:
            key = self._keys.get((device, xid))
            due = key is None or now - key.last_line >= self.interval
            if key is None or (due and not key.pending):
                self._keys[(device, xid)] = _XidKey(level, what, now)
                line: str | None = f"{what} (repeats summarised every {self.interval:.0f}s)"
            else:
                key.level, key.what = level, what  # a reload may have changed its meaning
                key.pending += 1
                line = self._summary(key, now) if due else None
        if line is not None:
            self.logger.log(level, "%s", line)

    def flush(self) -> None:
        """Write the summaries that are due; forget pairs quiet for an interval. Called
        from the health loop, so a storm that stops still gets its last count written."""
        now = self.clock()
        lines: list[tuple[int, str]] = []
        with self._lock:
            for pair, key in list(self._keys.items()):
                if now - key.last_line < self.interval:
                    continue
                if key.pending:
                    lines.append((key.level, self._summary(key, now)))
                else:
                    del self._keys[pair]
        for level, line in lines:
            self.logger.log(level, "%s", line)

    @staticmethod
    def _summary(key: _XidKey, now: float) -> str:
        count, since = key.pending, now - key.last_line
        key.pending, key.last_line = 0, now
        return f"{key.what} ({count} more in the last {since:.0f}s)"


class HealthMonitor:
    """Background thread: waits for NVML XID events and probes GPUs; calls on_change after any
    transition so the server can tell the kubelet."""

    def __init__(
        self,
        tracker: HealthTracker,
        units: Callable[[], Mapping[str, Unit]],
        on_change: Callable[[], None],
        probe_interval: float = 5.0,
        on_xid: XidCallback | None = None,
        probe: Callable[[str], str] = probe_gpu,
        xid_log: XidLog | None = None,
    ) -> None:
        self.tracker = tracker
        self.units = units
        self.on_change = on_change
        self.probe_interval = probe_interval
        self.on_xid = on_xid
        self.probe = probe
        self.xid_log = xid_log or XidLog()
        self._stop = threading.Event()
        self._probe_now = threading.Event()
        self._thread: threading.Thread | None = None
        self._events = XidEvents()
        self._registered: frozenset[str] = frozenset()
        self._last_view: dict[str, bool] = {}

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gpukit-health", daemon=True)
        self._thread.start()

    def retune(self, probe_interval: float) -> None:
        """New probe interval (a config reload), applied from the next loop turn."""
        if probe_interval != self.probe_interval:
            self.probe_interval = probe_interval
            self._probe_now.set()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._free_event_set()

    # -- event set ----------------------------------------------------------------------------

    def _free_event_set(self) -> None:
        self._events.free()
        self._registered = frozenset()

    def _register(self, gpus: frozenset[str]) -> None:
        """(Re)create the event set for this set of GPUs. Event sets cannot unregister a GPU,
        so a changed GPU set gets a fresh one."""
        self._free_event_set()

        def unwatchable(uuid: str, why: str) -> None:
            log.warning("cannot watch GPU %s for XIDs: %s; marking it unhealthy", uuid, why)
            self.tracker.on_probe(uuid, why)

        try:
            self._events.watch(gpus, unwatchable)
        except NvmlError as exc:
            log.warning("NVML events unavailable (%s); health relies on probes only", exc)
        self._registered = gpus

    # -- loop ---------------------------------------------------------------------------------

    def _run(self) -> None:
        next_probe = 0.0
        while not self._stop.is_set():
            try:
                units = self.units()
                gpus = frozenset(u.gpu.uuid for u in units.values())
                if gpus != self._registered:
                    self._register(gpus)
                if self._probe_now.is_set() or time.monotonic() >= next_probe:
                    self._probe_now.clear()
                    for uuid in sorted(gpus):
                        self.tracker.on_probe(uuid, self.probe(uuid))
                    self.tracker.expire()
                    next_probe = time.monotonic() + self.probe_interval
                    self._notify_if_changed(units)
                self.xid_log.flush()
                self._wait_for_event(units, timeout=min(0.5, self.probe_interval))
            except Exception:  # never let health checking take the plugin down
                log.exception("health loop error; continuing")
                self._stop.wait(1.0)

    def _wait_for_event(self, units: Mapping[str, Unit], timeout: float) -> None:
        if not self._events.active:
            self._stop.wait(timeout)
            return
        started = time.monotonic()
        try:
            ev = self._events.wait(timeout)
        except NvmlError as exc:
            log.warning("waiting for NVML events failed: %s", exc)
            self._stop.wait(timeout)
            return
        if ev.kind != "xid":
            self._pace(started, timeout)
            return
        if not ev.gpu_uuid:
            self.xid_log.event("?", ev.xid, logging.WARNING,
                               f"XID {ev.xid} from a GPU NVML cannot name ({ev.unnamed})")
            return
        self.handle_xid(units, ev.gpu_uuid, ev.xid, ev.gi, ev.ci)

    def _pace(self, started: float, timeout: float) -> None:
        """A wait that came back early with nothing to act on (a driver returning TIMEOUT
        at once, or a stream of other event types) must not turn the loop into a spin. Whatever
        is left of the timeout is slept, however little: at the smallest probe interval the
        timeout itself is 0.05 s, so skipping "short" remainders would spin again."""
        left = timeout - (time.monotonic() - started)
        if left > 0:
            self._stop.wait(left)

    def handle_xid(self, units: Mapping[str, Unit], gpu_uuid: str, xid: int, gi: int, ci: int
                   ) -> None:
        target = event_target(units.values(), gpu_uuid, gi, ci)
        if target is None:
            self.xid_log.event(f"{gpu_uuid}/{gi}/{ci}", xid, logging.INFO,
                               f"XID {xid} on GPU {gpu_uuid} instance {gi}/{ci} matches no "
                               "served device")
            return
        critical = self.tracker.on_xid(target, xid)
        if self.on_xid is not None:
            self.on_xid(target, xid, critical)
        if critical:
            self.xid_log.event(target, xid, logging.WARNING,
                               f"XID {xid} on {target}: marking it unhealthy")
            self._notify_if_changed(units)
        else:
            self.xid_log.event(target, xid, logging.INFO,
                               f"XID {xid} on {target} ignored (application error)")

    def _notify_if_changed(self, units: Mapping[str, Unit]) -> None:
        view = {uuid: self.tracker.unit_healthy(u) for uuid, u in units.items()}
        if view != self._last_view:
            for uuid, ok in view.items():
                if self._last_view.get(uuid, True) != ok:
                    log.warning("%s is now %s %s", uuid, "Healthy" if ok else "Unhealthy",
                                self.tracker.reason(uuid) if not ok else "")
            self._last_view = view
            self.on_change()
