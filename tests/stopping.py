"""Stopping a process a test started: SIGTERM, its output, and never a process left behind."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def killed_at_exit(proc: subprocess.Popen[str]) -> Iterator[subprocess.Popen[str]]:
    """`proc` killed (and reaped) when the block ends with it still running."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def terminate(proc: subprocess.Popen[str], timeout: float) -> str:
    """SIGTERM `proc` and return its output once it has ended (a TimeoutExpired when it has
    not within `timeout`)."""
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=timeout)
    return out
