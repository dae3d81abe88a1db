"""The agent stops promptly on SIGTERM: while starting, and whichever thread takes the signal.

At node shutdown systemd-shutdown sends every remaining process SIGSTOP, SIGTERM, SIGCONT. The
SIGTERM of a stopped process goes to whichever thread resumes first, not necessarily the main
thread where CPython runs signal handlers; and the agent is its container's PID 1, for which the
kernel drops a signal it has no handler for (one that comes while it is still starting). Either
way the agent missed the stop and held every lab node reboot for 90 s until SIGKILL.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

# Exit within this much of the signal (the agent's own stop takes well under a second here).
PROMPT_SECONDS = 5.0
SERVING = "running: SIGHUP reloads the config"
SYS_TGKILL = {"x86_64": 234, "aarch64": 131}.get(platform.machine())
AGENT = [sys.executable, "-m", "gpukit.plugin", "--nvml-library", "/nonexistent/libnvidia-ml.so.1",
         "--metrics-address", "", "--pause-file", ""]  # fmt: skip
ENV = {**os.environ, "FAIL_ON_INIT_ERROR": "false"}  # runs without GPUs


class Agent:
    """The agent as a process; its output collected as it comes."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=ENV)  # fmt: skip
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_output(self, text: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output:
            assert self.proc.poll() is None, f"agent exited early:\n{self.output}"
            assert time.monotonic() < deadline, f"no {text!r} in:\n{self.output}"
            time.sleep(0.05)

    def assert_exits_promptly(self, pid: int | None = None) -> None:
        """`pid`: the agent's own process when `proc` is a wrapper around it."""
        deadline = time.monotonic() + PROMPT_SECONDS
        while self.proc.poll() is None and (pid is None or Path(f"/proc/{pid}").exists()):
            if time.monotonic() > deadline:
                pytest.fail(f"agent still running {PROMPT_SECONDS:.0f}s after SIGTERM:\n"
                            f"{self.output}")  # fmt: skip
            time.sleep(0.05)
        self.proc.wait(timeout=10)
        self._reader.join(timeout=10)
        assert self.proc.returncode == 0, self.output

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


@pytest.fixture
def serving(short_tmp: Path) -> Iterator[Agent]:
    """The agent serving (no GPUs; its manager loop is a second thread)."""
    a = Agent([*AGENT, "--kubelet-dir", str(short_tmp)])
    try:
        a.wait_output(SERVING)
        yield a
    finally:
        a.close()


@pytest.mark.skipif(SYS_TGKILL is None, reason=f"tgkill number unknown on {platform.machine()}")
def test_sigterm_taken_by_another_thread_stops_the_agent(serving: Agent) -> None:
    pid = serving.proc.pid
    threads = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid)
    assert threads, "expected the manager loop thread beside the main thread"
    libc = ctypes.CDLL(None, use_errno=True)
    # Thread-directed: exactly the case where the main thread does not see the signal.
    assert libc.syscall(SYS_TGKILL, pid, threads[0], signal.SIGTERM) == 0, ctypes.get_errno()
    serving.assert_exits_promptly()
    assert "received SIGTERM" in serving.output and "stopping" in serving.output


def test_systemd_shutdown_sequence_stops_the_agent(serving: Agent) -> None:
    """What systemd-shutdown does to the processes left at the end of a node shutdown."""
    for sig in (signal.SIGSTOP, signal.SIGTERM, signal.SIGCONT):
        os.kill(serving.proc.pid, sig)
    serving.assert_exits_promptly()
    assert "received SIGTERM" in serving.output


def test_sighup_and_sigusr1_keep_it_running(serving: Agent) -> None:
    for sig in (signal.SIGHUP, signal.SIGUSR1):
        os.kill(serving.proc.pid, sig)
    time.sleep(1.0)
    assert serving.proc.poll() is None, "reload/rescan signals must not stop the agent"
    os.kill(serving.proc.pid, signal.SIGTERM)
    serving.assert_exits_promptly()


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="a PID namespace needs root and unshare")  # fmt: skip
def test_sigterm_while_starting_stops_the_agent_as_pid_1(short_tmp: Path) -> None:
    """As PID 1 of a PID namespace, like in its container: the kernel drops a SIGTERM it has no
    handler for, so the handler must be there before the agent starts its slow work."""
    fifo = short_tmp / "config.yaml"
    os.mkfifo(fifo)  # reading the config blocks: the agent is starting until it gets a writer
    a = Agent(["unshare", "--pid", "--fork", "--kill-child", "--", *AGENT,
               "--kubelet-dir", str(short_tmp), "--config-file", str(fifo)])  # fmt: skip
    writer = -1
    try:
        deadline = time.monotonic() + 30
        while writer < 0:  # a non-blocking writer opens once the agent is reading the config
            try:
                writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as exc:
                assert exc.errno == errno.ENXIO, exc
                assert a.proc.poll() is None, a.output
                assert time.monotonic() < deadline, f"agent never read its config:\n{a.output}"
                time.sleep(0.05)
        children = Path(f"/proc/{a.proc.pid}/task/{a.proc.pid}/children").read_text().split()
        assert len(children) == 1, children
        agent = int(children[0])
        nspid = next(line for line in Path(f"/proc/{agent}/status").read_text().splitlines()
                     if line.startswith("NSpid:"))  # fmt: skip
        assert nspid.split()[-1] == "1", f"not PID 1 of its namespace: {nspid}"
        os.kill(agent, signal.SIGTERM)
        a.assert_exits_promptly(agent)
    finally:
        if writer >= 0:
            os.close(writer)
        a.close()
