"""XID events and the GPU probe: what the health monitor asks of NVML.

An NVML event set cannot unregister a GPU, so a changed set of GPUs gets a fresh set
(`XidEvents.watch`). Waiting returns one `Event`; what it means for a device's health is the
monitor's business (gpukit/plugin/health.py), not this layer's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

import pynvml

from .calls import LOST_CODES, NvmlError, _text

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Event:
    """What one wait brought: nothing (timeout), an event of another type, or a critical XID
    (with its GPU's UUID, or why NVML could not name the GPU) and its MIG instance ids."""

    kind: Literal["timeout", "other", "xid"]
    xid: int = 0
    gpu_uuid: str = ""
    unnamed: str = ""  # why the GPU could not be named
    gi: int = 0
    ci: int = 0


class XidEvents:
    """One event set for critical XIDs of a set of GPUs."""

    def __init__(self) -> None:
        self._set: Any = None

    @property
    def active(self) -> bool:
        return self._set is not None

    def free(self) -> None:
        if self._set is not None:
            try:
                pynvml.nvmlEventSetFree(self._set)
            except pynvml.NVMLError as exc:
                log.debug("nvmlEventSetFree: %s", exc)
            self._set = None

    def watch(self, gpus: Iterable[str], unwatchable: Callable[[str, str], None]) -> None:
        """A fresh set for `gpus`. A GPU that cannot report XIDs is logged and left to probes;
        one whose registration fails is passed to `unwatchable(uuid, why)`. Raises NvmlError
        when NVML has no events at all."""
        self.free()
        try:
            self._set = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError as exc:
            raise NvmlError("nvmlEventSetCreate", int(exc.value), str(exc)) from exc
        for uuid in sorted(gpus):
            try:
                handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
                supported = pynvml.nvmlDeviceGetSupportedEventTypes(handle)
                mask = pynvml.nvmlEventTypeXidCriticalError & supported
                if mask:
                    pynvml.nvmlDeviceRegisterEvents(handle, mask, self._set)
                else:
                    log.warning("GPU %s does not report XID events; probing only", uuid)
            except pynvml.NVMLError as exc:
                if exc.value == pynvml.NVML_ERROR_NOT_SUPPORTED:
                    log.warning("GPU %s is too old for XID events; probing only", uuid)
                    continue
                unwatchable(uuid, f"event registration failed: {exc}")

    def wait(self, timeout: float) -> Event:
        """Wait up to `timeout` seconds for one event; raises NvmlError when waiting failed."""
        try:
            data = pynvml.nvmlEventSetWait_v2(self._set, int(timeout * 1000))
        except pynvml.NVMLError as exc:
            if exc.value == pynvml.NVML_ERROR_TIMEOUT:
                return Event("timeout")
            raise NvmlError("nvmlEventSetWait", int(exc.value), str(exc)) from exc
        if not data.eventType & pynvml.nvmlEventTypeXidCriticalError:
            return Event("other")
        xid, gi, ci = int(data.eventData), int(data.gpuInstanceId), int(data.computeInstanceId)
        try:
            uuid = _text(pynvml.nvmlDeviceGetUUID(data.device))
        except pynvml.NVMLError as exc:
            return Event("xid", xid, unnamed=str(exc), gi=gi, ci=ci)
        return Event("xid", xid, uuid, gi=gi, ci=ci)


def probe_gpu(uuid: str) -> str:
    """"" if NVML answers for this GPU, else why not."""
    try:
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
        pynvml.nvmlDeviceGetMemoryInfo(handle)
    except pynvml.NVMLError as exc:
        if exc.value == pynvml.NVML_ERROR_NOT_SUPPORTED:
            return ""
        kind = "lost" if exc.value in LOST_CODES else "unreachable"
        return f"GPU {kind}: {exc} (NVML error {exc.value})"
    return ""
