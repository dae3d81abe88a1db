"""The device plugin's side of the pause protocol (see :mod:`gpukit.plugin.mig.hooks`).

The plugin's manager loop calls :meth:`PauseWatcher.poll` every tick (an ``os.stat``; the file
is read only when it changed). While paused, the plugin does not re-enumerate (discovery in the
middle of a MIG change sees half a layout) and reports the devices of the listed GPUs Unhealthy,
so the kubelet assigns none of them; on resume it re-enumerates at once.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PauseRequest:
    token: str
    gpus: frozenset[str]  # UUIDs of the GPUs being changed (empty: all)
    config: str
    expires: float


def read_pause(path: str | Path, now: float | None = None) -> PauseRequest | None:
    """The active pause request at ``path``: None when there is none, it is malformed, or it has
    expired."""
    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        log.warning("ignoring unreadable pause file %s: %s", path, e)
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("token"), str):
        log.warning("ignoring malformed pause file %s", path)
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
                        expires=float(expires))


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
        if stamp != self._stamp:
            self._stamp = stamp
            request = read_pause(self.path, self.clock()) if stamp is not None else None
        elif request is not None and self.clock() > request.expires:
            log.warning("pause %s expired: resuming", request.token)
            request = None
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
