"""The kubelet's DRA health stream (dra-health v1 `DRAResourceHealth.NodeWatchResources`): the
health of every device of the current layout, so the kubelet shows it in the status of the pods
holding it (`allocatedResourcesStatus`, feature gate ResourceHealthStatus, on by default since
Kubernetes 1.36).

The kubelet opens one stream per registration and keeps it open. Each report lists every device
(healthy or not: a tainted device is still held by the claims prepared before), sent at once
when a health changes and again every `period` seconds; each report holds for `timeout`
seconds, after which the kubelet calls the device's health Unknown (a plugin gone quiet).
A stream takes one of the DRA server's worker threads for its life, so at most `max_streams`
run at once (the kubelet's reconnects: an old stream ends within a period of its
cancellation); prepare and unprepare keep the rest.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from ..api import dra_health_grpc, dra_health_pb2

log = logging.getLogger(__name__)
SERVICE = "v1.DRAResourceHealth"  # what the registration lists in supported_versions
PERIOD_SECONDS = 10.0
TIMEOUT_SECONDS = 45  # several periods: a late report does not flap a device to Unknown
MAX_STREAMS = 2


@dataclass(frozen=True)
class DeviceState:
    name: str  # as published in the node's pool
    healthy: bool
    message: str = ""


class HealthBoard:
    """The devices' latest health; streams wait on it for a change."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._version = 0
        self._states: tuple[DeviceState, ...] = ()
        self.closed = False

    def update(self, states: Sequence[DeviceState]) -> None:
        with self._cond:
            if tuple(states) != self._states:
                self._states = tuple(states)
                self._version += 1
                self._cond.notify_all()

    def wait(self, seen: int, timeout: float, stop: Callable[[], bool]
             ) -> tuple[int, tuple[DeviceState, ...]]:
        """(version, states) once the version differs from `seen`, `stop()` holds or
        `timeout` passed."""
        with self._cond:
            self._cond.wait_for(lambda: self._version != seen or self.closed or stop(), timeout)
            return self._version, self._states

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self.closed = True
            self._cond.notify_all()


def report(pool: str, states: Sequence[DeviceState], now: float, timeout: int) -> Any:
    out = dra_health_pb2.NodeWatchResourcesResponse()
    for s in states:
        out.devices.add(
            device=dra_health_pb2.DeviceIdentifier(pool_name=pool, device_name=s.name),
            health=dra_health_pb2.HEALTHY if s.healthy else dra_health_pb2.UNHEALTHY,
            last_updated_time=int(now), health_check_timeout_seconds=timeout,
            message=s.message)
    return out


class HealthService(dra_health_grpc.DRAResourceHealthServicer):  # type: ignore[misc]
    def __init__(self, board: HealthBoard, pool: str, period: float = PERIOD_SECONDS,
                 timeout: int = TIMEOUT_SECONDS, max_streams: int = MAX_STREAMS,
                 clock: Callable[[], float] = time.time) -> None:
        self.board, self.pool, self.period, self.timeout = board, pool, period, timeout
        self.clock, self.max_streams = clock, max_streams
        self._slots = threading.BoundedSemaphore(max_streams)

    def NodeWatchResources(self, request: Any, context: Any) -> Iterator[Any]:
        if not self._slots.acquire(blocking=False):
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          "too many health streams open; retry later")
        try:
            ended = threading.Event()

            def on_end() -> None:
                ended.set()
                self.board.wake()

            context.add_callback(on_end)
            log.info("the kubelet watches device health (pool %s)", self.pool)
            version = -1
            while not ended.is_set() and not self.board.closed:
                version, states = self.board.wait(version, self.period, ended.is_set)
                if ended.is_set() or self.board.closed:
                    break
                yield report(self.pool, states, self.clock(), self.timeout)
        finally:
            self._slots.release()
