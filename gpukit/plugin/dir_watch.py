"""Wakes the manager loop the moment something is created or removed in the kubelet's
device-plugins directory.

A restarting kubelet deletes every socket there and then creates kubelet.sock; the manager's
tick would notice both only up to a tick later (and a registration retry later still), with the
node at 0 GPUs meanwhile. Linux inotify (through libc: the standard library has no binding)
reports both at once; `on_change` is then called from the watch thread. Where inotify is not
available, or the directory does not exist yet, nothing is watched and the tick still notices.
"""

from __future__ import annotations

import ctypes
import logging
import os
import select
import struct
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

# <sys/inotify.h>
IN_MOVED_FROM = 0x040
IN_MOVED_TO = 0x080
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_IGNORED = 0x8000
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
_MASK = (IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF
         | IN_MOVE_SELF)
_EVENT_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len (name follows)


def _libc() -> ctypes.CDLL | None:
    # The C library the interpreter already links (dlopen(NULL)), not ctypes.util.find_library,
    # which runs `ldconfig -p` in a subprocess: ~20 ms on the agent's way to registering.
    try:
        lib = ctypes.CDLL(None, use_errno=True)
        lib.inotify_init1  # noqa: B018 -- absent outside Linux
    except (OSError, AttributeError):
        return None
    return lib


class DirWatch:
    """One inotify watch on one directory, re-targeted by `ensure(path)` (the kubelet dir can
    change with a config reload, or be created after the agent started)."""

    def __init__(self, on_change: Callable[[], None], what: str = "kubelet restarts",
                 thread_name: str = "gpukit-kubelet-dir") -> None:
        self.on_change = on_change
        self.what = what  # for the log lines: what the watch notices
        self.thread_name = thread_name
        self.path: str | None = None
        self._libc = _libc()
        self._fd = -1
        self._wd = -1
        self._lock = threading.Lock()
        self._stop_r, self._stop_w = -1, -1
        self._thread: threading.Thread | None = None

    @property
    def watching(self) -> bool:
        return self._wd >= 0

    def ensure(self, path: str) -> bool:
        """Watch `path` (from now on, instead of any other); True when it is watched. Cheap when
        nothing changed: called at every manager tick."""
        if self._libc is None:
            return False
        with self._lock:
            if self._wd >= 0 and path == self.path:
                return True
            if self._fd < 0:
                self._fd = self._libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
                if self._fd < 0:
                    self._libc = None
                    log.warning("inotify unavailable (%s): noticing %s by polling",
                                os.strerror(ctypes.get_errno()), self.what)
                    return False
                self._stop_r, self._stop_w = os.pipe()
                self._thread = threading.Thread(target=self._run, name=self.thread_name,
                                                daemon=True)
                self._thread.start()
            if self._wd >= 0:
                self._libc.inotify_rm_watch(self._fd, self._wd)
                self._wd = -1
            self.path = path
            wd = self._libc.inotify_add_watch(self._fd, os.fsencode(path), _MASK)
            if wd < 0:
                return False  # no directory yet: retried at the next tick
            self._wd = wd
            log.debug("watching %s for %s", path, self.what)
            return True

    def stop(self) -> None:
        with self._lock:
            if self._fd < 0:
                return
            os.write(self._stop_w, b"x")
            thread = self._thread
        if thread is not None and thread.is_alive():
            thread.join(timeout=5)
        with self._lock:
            for fd in (self._fd, self._stop_r, self._stop_w):
                os.close(fd)
            self._fd = self._stop_r = self._stop_w = self._wd = -1
            self._thread = None

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        poller.register(self._stop_r, select.POLLIN)
        while True:
            ready = {fd for fd, _ in poller.poll()}
            if self._stop_r in ready:
                return
            try:
                data = os.read(self._fd, 64 * 1024)
            except BlockingIOError:
                continue
            gone = False
            offset = 0
            while offset + _EVENT_HEADER.size <= len(data):
                wd, mask, _, length = _EVENT_HEADER.unpack_from(data, offset)
                offset += _EVENT_HEADER.size + length
                if mask & IN_IGNORED and wd == self._wd:
                    gone = True  # the directory itself went: watched again by ensure()
            if gone:
                with self._lock:
                    self._wd = -1
            try:
                self.on_change()
            except Exception:  # the watch must outlive a failing callback
                log.exception("kubelet dir change handler failed")
