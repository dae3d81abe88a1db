"""The node agent's signals: SIGTERM/SIGINT stop it, SIGHUP reloads, SIGUSR1 rescans.

Standard library only, so that `python -m gpukit.plugin` installs the handlers before its
heavy imports. Two kernel rules make this necessary, both seen holding a lab node's reboot
for systemd-shutdown's 90 s until SIGKILL:

- The agent is PID 1 of its container's PID namespace, and the kernel drops a signal sent to
  such a process when it has no handler for it. A SIGTERM that came before the handler was
  installed (the agent was still importing or starting up) was lost for good.
- CPython runs Python handlers only in the main thread, but the kernel hands a
  process-directed signal to any thread that does not block it; the C-level handler on that
  thread only records it, and a main thread parked in an untimed wait never looks.
  systemd-shutdown sends every process left at the end of a shutdown (containerd's unit
  leaves containers running) SIGSTOP, SIGTERM, SIGCONT: the SIGTERM of a stopped process
  goes to whichever thread resumes first, usually not the main one.

So: `INBOX.install()` runs first thing; while starting, SIGTERM/SIGINT raise StopRequested in
the main thread (startup is abandoned, the caller cleans up); once serving, `serve()` sleeps in
select() on the wakeup fd, which the C-level handler writes from whatever thread took the
signal, and acts on what the handler recorded, with a bounded poll as a second guard.
"""

from __future__ import annotations

import logging
import os
import select
import signal
from collections.abc import Callable
from types import FrameType
from typing import Protocol

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGHUP, signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# How long the main thread sleeps between looks when no signal wakes it (a second guard).
POLL_SECONDS = 1.0


class StopRequested(BaseException):
    """SIGTERM/SIGINT while starting. A BaseException, like KeyboardInterrupt, so that the
    `except Exception` of best-effort startup steps does not swallow it."""


class Controlled(Protocol):
    def request_reload(self) -> None: ...
    def request_rescan(self) -> None: ...
    def request_stop(self) -> None: ...
    def wait(self, timeout: float | None = None) -> bool: ...


class SignalInbox:
    def __init__(self) -> None:
        self.received: list[int] = []
        self.starting = True

    def install(self) -> None:
        """Main thread only (Python's rule for signal.signal)."""
        for sig in SIGNALS:
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # Runs in the main thread at any bytecode, possibly while it holds a lock of the
        # agent's (an Event's): record only, never take a lock here.
        self.received.append(signum)
        if self.starting and signum in STOP_SIGNALS:
            raise StopRequested(signal.Signals(signum).name)

    def serve(self, target: Controlled, poll: float = POLL_SECONDS) -> None:
        """Act on signals until a stop is requested (by a signal or otherwise)."""
        rfd, wfd = os.pipe()
        os.set_blocking(rfd, False)
        os.set_blocking(wfd, False)
        previous = signal.set_wakeup_fd(wfd, warn_on_full_buffer=False)
        self.starting = False
        log.info("running: SIGHUP reloads the config, SIGUSR1 rescans, SIGTERM stops")
        try:
            while True:
                while self.received:
                    signum = self.received.pop(0)
                    if signum == signal.SIGHUP:
                        target.request_reload()
                    elif signum == signal.SIGUSR1:
                        target.request_rescan()
                    else:
                        log.info("received %s", signal.Signals(signum).name)
                        target.request_stop()
                        return
                if target.wait(0):
                    return
                if select.select([rfd], [], [], poll)[0]:
                    try:
                        os.read(rfd, 512)
                    except BlockingIOError:
                        pass
        finally:
            signal.set_wakeup_fd(previous)
            os.close(rfd)
            os.close(wfd)


# One per process: `python -m gpukit.plugin` installs it before importing the rest.
INBOX = SignalInbox()


def run_main(start: Callable[[list[str] | None, str], int], argv: list[str] | None,
             prog: str) -> int:
    """An agent's entry point: the handlers first (a SIGTERM before there is one is lost), then
    `start(argv, prog)`; a stop requested while starting ends it cleanly with 0."""
    INBOX.install()
    try:
        return start(argv, prog)
    except StopRequested as stop:
        log.info("stopped by %s while starting", stop)
        return 0
