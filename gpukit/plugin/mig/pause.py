"""The device plugin's side of the pause protocol (see :mod:`gpukit.plugin.mig.hooks`).

The plugin's manager loop calls :meth:`PauseWatcher.poll` every tick (an ``os.stat``; the file
is read when it changed, and every tick while paused). While paused, the plugin does not
re-enumerate (discovery in the middle of a MIG change sees half a layout) and reports the
devices of the listed GPUs Unhealthy, so the kubelet assigns none of them; on resume it
re-enumerates at once.

A pause is void once its owner is gone (a MIG apply killed mid-change would otherwise zero the
node's resources until the file expires): the writer records its PID with the start time from
``/proc/<pid>/stat`` (a reused PID is another process) and its PID namespace, and holds an
``flock`` on the file while it lives. A reader in the same PID namespace asks ``/proc``; one in
another (the agent's pod, the MIG manager on the host) tries the lock, which the kernel frees
when the owner dies. A void pause is removed by whoever finds it; ``expires`` stays the last
resort for a file neither check can judge (e.g. from an older writer).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
PROC = Path("/proc")


@dataclass(frozen=True)
class PauseOwner:
    """Who wrote a pause file (``owner_record``); fields an older writer left out are None."""

    pid: int | None = None
    start: int | None = None  # /proc/<pid>/stat field 22: start time, clock ticks since boot
    pid_ns: str | None = None  # readlink /proc/self/ns/pid of the writer, "pid:[4026531836]"
    locked: bool = False  # the writer holds an flock on the file for as long as it lives


@dataclass(frozen=True)
class PauseRequest:
    token: str
    gpus: frozenset[str]  # UUIDs of the GPUs being changed (empty: all)
    config: str
    expires: float
    owner: PauseOwner = PauseOwner()


def process_start(pid: int, proc: Path = PROC) -> int | None:
    """Start time of a live process (field 22 of /proc/<pid>/stat); None when there is no such
    process or only its zombie (a killed owner its parent has not reaped yet is gone too)."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()  # comm, field 2, may hold spaces and ')'
    if len(fields) < 20 or fields[0] in ("Z", "X"):  # fields[0] is field 3, the state
        return None
    return int(fields[19])


def pid_namespace(proc: Path = PROC) -> str | None:
    try:
        return os.readlink(proc / "self" / "ns" / "pid")
    except OSError:
        return None


def owner_record(proc: Path = PROC) -> dict[str, Any]:
    """This process as a pause file's owner (fields of the JSON document)."""
    pid = os.getpid()
    return {"pid": pid, "pid_start": process_start(pid, proc), "pid_ns": pid_namespace(proc),
            "lock": True}


def write_pause(path: Path, doc: dict[str, Any]) -> int:
    """Write the pause file atomically and return a descriptor holding an exclusive flock on
    it: keep it open until the pause is lifted (closing it, or dying, frees the lock)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # before the rename: no reader ever sees it unlocked
        os.write(fd, json.dumps(doc, indent=1).encode())
        os.fsync(fd)
        os.replace(tmp, path)
    except BaseException:
        os.close(fd)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return fd


def owner_gone(owner: PauseOwner, fd: int | None = None, proc: Path = PROC) -> str:
    """Why the owner of a pause is known to be gone; "" while it lives or nobody can tell.

    Same PID namespace: /proc answers (no process, a zombie, or a different start time: the
    PID was reused). Another namespace (its PIDs mean nothing here): the owner's flock on the
    open file ``fd``, which is free only once the owner closed it or died."""
    if owner.pid is not None and owner.pid_ns is not None and owner.pid_ns == pid_namespace(proc):
        start = process_start(owner.pid, proc)
        if start is None:
            return f"its process {owner.pid} is gone"
        if owner.start is not None and start != owner.start:
            return (f"PID {owner.pid} is another process now (started at tick {start}, the "
                    f"owner at {owner.start})")
        return ""
    if owner.locked and fd is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return ""
        except OSError:
            return ""  # no flock here (some network filesystems): leave it to `expires`
        fcntl.flock(fd, fcntl.LOCK_UN)
        return f"its lock is free (owner PID {owner.pid} in {owner.pid_ns} is gone)"
    return ""


def _remove_void(path: Path, ino: int) -> None:
    """Remove the void pause file, unless a new pause replaced it meanwhile: claim whatever is
    at ``path`` by renaming it, and put it back if it is not the inode judged void."""
    claimed = path.with_name(f".{path.name}.void-{os.getpid()}")
    try:
        os.rename(path, claimed)
    except FileNotFoundError:
        return
    except OSError as e:
        log.warning("cannot remove the void pause file %s: %s", path, e)
        return
    try:
        if os.stat(claimed).st_ino != ino:
            try:
                os.link(claimed, path)  # a newer pause: back where it was (same inode, lock)
            except FileExistsError:
                pass  # an even newer one is there
    finally:
        os.unlink(claimed)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def read_pause(path: str | Path, now: float | None = None, proc: Path = PROC
               ) -> PauseRequest | None:
    """The active pause request at ``path``: None when there is none, it is malformed, it has
    expired, or its owner is gone (then the file is removed)."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    except OSError as e:
        log.warning("ignoring unreadable pause file %s: %s", path, e)
        return None
    try:
        ino = os.fstat(fd).st_ino
        with open(fd, closefd=False) as f:
            doc = json.loads(f.read())
        if not isinstance(doc, dict) or not isinstance(doc.get("token"), str):
            log.warning("ignoring malformed pause file %s", path)
            return None
        owner = PauseOwner(pid=_int(doc.get("pid")), start=_int(doc.get("pid_start")),
                           pid_ns=doc.get("pid_ns") if isinstance(doc.get("pid_ns"), str)
                           else None, locked=doc.get("lock") is True)
        gone = owner_gone(owner, fd, proc)
    except (OSError, ValueError) as e:
        log.warning("ignoring unreadable pause file %s: %s", path, e)
        return None
    finally:
        os.close(fd)
    if gone:
        log.warning("pause %s (config %s) is void, %s: removing %s", doc["token"],
                    doc.get("config"), gone, path)
        _remove_void(path, ino)
        return None
    expires = doc.get("expires")
    if not isinstance(expires, int | float):
        expires = float("inf")
    if (time.time() if now is None else now) > expires:
        log.warning("ignoring expired pause file %s (written by pid %s)", path, doc.get("pid"))
        return None
    gpus = doc.get("gpus")
    uuids = frozenset(str(u) for u in gpus) if isinstance(gpus, list) else frozenset()
    return PauseRequest(token=doc["token"], gpus=uuids, config=str(doc.get("config", "")),
                        expires=float(expires), owner=owner)


class PauseWatcher:
    """Polls the pause file; ``on_change(paused)`` is called on every transition."""

    def __init__(self, path: str | Path, on_change: Callable[[bool], None] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.path = Path(path)
        self.ack_path = Path(str(self.path) + ".ack")
        self.on_change = on_change
        self.clock = clock
        self.request: PauseRequest | None = None
        self._stamp: tuple[int, int, int] | None = None

    @property
    def paused(self) -> bool:
        return self.request is not None

    def covers(self, gpu_uuid: str) -> bool:
        """Whether devices of this GPU must be reported Unhealthy now."""
        r = self.request
        return r is not None and (not r.gpus or gpu_uuid in r.gpus)

    def poll(self) -> bool:
        """Re-check the file; returns True when the paused state changed."""
        try:
            st = os.stat(self.path)
            stamp: tuple[int, int, int] | None = (st.st_ino, st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            stamp = None
        request = self.request
        if stamp != self._stamp or request is not None:
            # While paused the file is read every tick: its owner may die without touching it.
            self._stamp = stamp
            request = read_pause(self.path, self.clock()) if stamp is not None else None
        if request == self.request:
            return False
        was = self.paused
        self.request = request
        if request is not None:
            log.info("paused by the MIG manager (config %s, %d GPU(s))", request.config,
                     len(request.gpus))
            self._ack(request.token)
        else:
            log.info("MIG manager pause lifted")
            try:
                self.ack_path.unlink()
            except OSError:
                pass
        if self.on_change is not None and was != self.paused:
            self.on_change(self.paused)
        return was != self.paused

    def _ack(self, token: str) -> None:
        tmp = self.ack_path.with_name(self.ack_path.name + ".tmp")
        try:
            tmp.write_text(token + "\n")
            os.replace(tmp, self.ack_path)
        except OSError as e:
            log.warning("cannot acknowledge the pause in %s: %s", self.ack_path, e)
