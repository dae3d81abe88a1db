"""Start lab processes detached, remember them by PID, stop exactly those."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks (field 22 of /proc/PID/stat)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


@dataclass(frozen=True)
class Proc:
    """A process the lab started; the start time guards against PID reuse."""

    name: str
    pid: int
    start: int

    def alive(self) -> bool:
        # The VM's PID 1 reaps slowly: a zombie counts as stopped.
        return _start_time(self.pid) == self.start and _state(self.pid) not in (None, "Z", "X")


class ProcTable:
    """PID records under `dir/<name>.pid` (JSON: pid and start time)."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        directory.mkdir(parents=True, exist_ok=True)

    def get(self, name: str) -> Proc | None:
        path = self.dir / f"{name}.pid"
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return Proc(name=name, pid=int(data["pid"]), start=int(data["start"]))

    def names(self) -> list[str]:
        return sorted(p.stem for p in self.dir.glob("*.pid"))

    def start(
        self,
        name: str,
        argv: list[str],
        log: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> Proc:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            p = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=cwd,
                start_new_session=True,
            )
        start = _start_time(p.pid)
        assert start is not None, f"{name} exited at once; see {log}"
        proc = Proc(name=name, pid=p.pid, start=start)
        (self.dir / f"{name}.pid").write_text(json.dumps({"pid": p.pid, "start": start}))
        return proc

    def stop(self, name: str, timeout: float = 15.0) -> None:
        proc = self.get(name)
        if proc is not None and proc.alive():
            _signal(proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while proc.alive() and time.monotonic() < deadline:
                time.sleep(0.1)
            if proc.alive():
                _signal(proc.pid, signal.SIGKILL)
                deadline = time.monotonic() + 5
                while proc.alive() and time.monotonic() < deadline:
                    time.sleep(0.1)
        (self.dir / f"{name}.pid").unlink(missing_ok=True)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
