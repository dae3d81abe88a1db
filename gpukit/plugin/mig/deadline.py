"""A bound on a MIG apply. A change that hangs (an NVML call that never returns, a GPU reset
that never finishes) must not leave the node's plugin paused and its mig.config.state pending
until someone notices: after the bound a watchdog thread reports `failed`, voids the plugin's
pause (the plugin re-enumerates at once and serves what still works), says so in one line and
ends the process. Python cannot interrupt a C call, but ctypes releases the GIL while in one,
so the watchdog runs while the main thread is stuck."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from types import TracebackType

EXIT_TIMED_OUT = 1  # as any other failed apply: rerun to converge


class Deadline:
    """`with Deadline(seconds, on_expiry):` runs `on_expiry` then exits the process when the
    block outlives `seconds` (<= 0: no bound)."""

    def __init__(self, seconds: float, on_expiry: Callable[[], None],
                 exit_process: Callable[[int], None] = os._exit) -> None:
        self.seconds = seconds
        self.on_expiry = on_expiry
        self.exit_process = exit_process
        self._timer: threading.Timer | None = None

    def __enter__(self) -> Deadline:
        if self.seconds > 0:
            self._timer = threading.Timer(self.seconds, self._expire)
            self._timer.daemon = True
            self._timer.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def _expire(self) -> None:
        try:
            self.on_expiry()
        finally:
            # os._exit: the main thread may be inside a C call that never returns, so a normal
            # exit (which joins it) would hang as well.
            self.exit_process(EXIT_TIMED_OUT)
