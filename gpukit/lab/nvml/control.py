"""Lab control of the mock NVML: what a real GPU would do on its own, done on command.

The C library owns the state format; this module only calls its ``gpukitMock*`` entry points
through ctypes, so the CLI and the library can never disagree about the state directory.

    ctl = MockControl()                  # the library from GPUKIT_NVML_LIB / the build / the system
    ctl.inject_xid(gpu=3, xid=79)        # a waiting nvmlEventSetWait_v2 returns it at once
    ctl.set_process(gpu=0, pid=1234, mem_mb=100)
    ctl.reset(gpu=0)                     # nvidia-smi -r: applies a pending MIG mode
"""

from __future__ import annotations

import ctypes
import json
import os
from pathlib import Path
from typing import Any

from gpukit.lab.nvml import LIB_NAME, library_path

NO_ID = 0xFFFFFFFF

# nvml.h values (API 12/13), used to build requests and to read return codes.
NVML_SUCCESS = 0
NVML_ERROR_INSUFFICIENT_SIZE = 7
EVENT_TYPES = {
    "xid": 0x8,  # nvmlEventTypeXidCriticalError
    "double-bit-ecc": 0x2,  # nvmlEventTypeDoubleBitEccError
    "single-bit-ecc": 0x1,  # nvmlEventTypeSingleBitEccError
    "pstate": 0x4,  # nvmlEventTypePState
    "clock": 0x10,  # nvmlEventTypeClock
}
# How nvmlEventSetWait behaves for sets watching a GPU (MOCK_EVENTS_* in src/mock.h).
EVENT_FAULTS = {"normal": 0, "timeout": 1, "spurious": 2}


class NotTheMockError(RuntimeError):
    """The loaded libnvidia-ml.so.1 is not the gpukit mock (for example, the real driver's)."""


class MockNvmlError(RuntimeError):
    """A control operation failed; ``code`` is the NVML return code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def _opt(value: int | None) -> int:
    return NO_ID if value is None else value


class MockControl:
    """Control operations on the mock GPUs of one profile and state directory.

    ``profile`` and ``state_dir`` override ``GPUKIT_NVML_PROFILE`` / ``GPUKIT_NVML_STATE_DIR``
    for this process (not possible while NVML is initialised in it).
    """

    def __init__(
        self,
        lib: str | os.PathLike[str] | None = None,
        *,
        profile: str | os.PathLike[str] | None = None,
        state_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        if lib is None:
            found = library_path()
            path = str(found) if found is not None else LIB_NAME
        else:
            path = str(lib)
        try:
            self._lib = ctypes.CDLL(path)
        except OSError as e:
            raise NotTheMockError(f"cannot load {path}: {e} (build it with `make nvml`)") from e
        if not hasattr(self._lib, "gpukitMockStatusJson"):
            raise NotTheMockError(
                f"{path} is not the gpukit mock NVML (no gpukitMock* entry points); refusing to "
                "control a real GPU"
            )
        self.path = path
        L = self._lib
        u, ull, c_str = ctypes.c_uint, ctypes.c_ulonglong, ctypes.c_char_p
        L.nvmlErrorString.restype = c_str
        L.nvmlErrorString.argtypes = [ctypes.c_int]
        L.gpukitMockLastError.restype = c_str
        L.gpukitMockLastError.argtypes = []
        L.gpukitMockConfigure.argtypes = [c_str, c_str]
        L.gpukitMockInjectEvent.argtypes = [u, ull, ull, u, u]
        L.gpukitMockSetLost.argtypes = [u, ctypes.c_int]
        L.gpukitMockSetProcess.argtypes = [u, u, ull, u, u, c_str]
        L.gpukitMockClearProcesses.argtypes = [u, u]
        L.gpukitMockResetGpu.argtypes = [u]
        L.gpukitMockBoot.argtypes = []
        L.gpukitMockStatusJson.argtypes = [ctypes.c_char_p, ctypes.POINTER(u)]
        for fn in (
            L.gpukitMockConfigure,
            L.gpukitMockInjectEvent,
            L.gpukitMockSetLost,
            L.gpukitMockSetProcess,
            L.gpukitMockClearProcesses,
            L.gpukitMockResetGpu,
            L.gpukitMockBoot,
            L.gpukitMockStatusJson,
        ):
            fn.restype = ctypes.c_int
        if hasattr(L, "gpukitMockSetProcessWork"):  # newer than some built libraries
            L.gpukitMockSetProcessWork.argtypes = [u, u, ull, u, u, c_str, u]
            L.gpukitMockSetProcessWork.restype = ctypes.c_int
        if hasattr(L, "gpukitMockSetEventFault"):  # newer than some built libraries
            L.gpukitMockSetEventFault.argtypes = [u, u]
            L.gpukitMockSetEventFault.restype = ctypes.c_int
        if profile is not None or state_dir is not None:
            self._check(
                L.gpukitMockConfigure(
                    os.fsencode(profile) if profile is not None else None,
                    os.fsencode(state_dir) if state_dir is not None else None,
                ),
                "configure",
            )

    def _check(self, rc: int, what: str) -> None:
        if rc == NVML_SUCCESS:
            return
        text = self._lib.nvmlErrorString(rc)
        msg = f"{what}: {text.decode() if text else rc}"
        detail = self._lib.gpukitMockLastError()
        if detail and rc in (4, 9, 14, 20, 999):  # profile/state trouble: the library says more
            msg += f" ({detail.decode(errors='replace')})"
        raise MockNvmlError(rc, msg)

    def inject_event(
        self,
        gpu: int,
        event_type: str | int = "xid",
        data: int = 0,
        gi: int | None = None,
        ci: int | None = None,
    ) -> None:
        """Deliver an event to every event set registered for it on ``gpu``."""
        etype = EVENT_TYPES[event_type] if isinstance(event_type, str) else event_type
        rc = self._lib.gpukitMockInjectEvent(gpu, etype, data, _opt(gi), _opt(ci))
        self._check(rc, f"inject event on GPU {gpu}")

    def inject_xid(
        self,
        gpu: int,
        xid: int,
        gi: int | None = None,
        ci: int | None = None,
        event_type: str = "xid",
    ) -> None:
        """An XID error (eventData = XID), optionally attributed to a MIG GPU/compute instance."""
        self.inject_event(gpu, event_type, xid, gi, ci)

    def lose(self, gpu: int) -> None:
        """The GPU falls off the bus: queries return NVML_ERROR_GPU_IS_LOST."""
        self._check(self._lib.gpukitMockSetLost(gpu, 1), f"lose GPU {gpu}")

    def restore(self, gpu: int) -> None:
        self._check(self._lib.gpukitMockSetLost(gpu, 0), f"restore GPU {gpu}")

    def set_event_fault(self, gpu: int, mode: str = "timeout") -> None:
        """A misbehaving driver: event sets watching ``gpu`` stop blocking in nvmlEventSetWait.
        ``timeout``: NVML_ERROR_TIMEOUT at once; ``spurious``: at once with a PState event;
        ``normal``: block again. Real events still come first; a boot clears the fault."""
        if mode not in EVENT_FAULTS:
            raise ValueError(f"event fault {mode!r} is not one of {', '.join(EVENT_FAULTS)}")
        if not hasattr(self._lib, "gpukitMockSetEventFault"):
            raise NotTheMockError(f"{self.path} predates event faults: rebuild it (make nvml)")
        rc = self._lib.gpukitMockSetEventFault(gpu, EVENT_FAULTS[mode])
        self._check(rc, f"set event fault {mode} on GPU {gpu}")

    def set_process(
        self,
        gpu: int,
        pid: int,
        mem_mb: int = 0,
        gi: int | None = None,
        ci: int | None = None,
        name: str | None = None,
        util: int = 100,
    ) -> None:
        """Add (or update) a compute process using ``mem_mb`` MiB on the GPU (or MIG instance)
        and keeping ``util`` % of it busy (utilisation, power, temperature, clocks and energy
        follow; see src/telemetry.c)."""
        if not 0 <= util <= 100:
            raise ValueError(f"util {util}: a process keeps 0 to 100 % of its GPU busy")
        encoded = name.encode() if name else None
        if hasattr(self._lib, "gpukitMockSetProcessWork"):
            rc = self._lib.gpukitMockSetProcessWork(
                gpu, pid, mem_mb << 20, _opt(gi), _opt(ci), encoded, util)
        elif util == 100:  # an older library: every process works flat out
            rc = self._lib.gpukitMockSetProcess(gpu, pid, mem_mb << 20, _opt(gi), _opt(ci),
                                                encoded)
        else:
            raise NotTheMockError(f"{self.path} predates process utilisation: rebuild it")
        self._check(rc, f"set process {pid} on GPU {gpu}")

    def clear_processes(self, gpu: int | None = None, pid: int | None = None) -> None:
        """Remove processes: all, those of one GPU, or one pid."""
        rc = self._lib.gpukitMockClearProcesses(_opt(gpu), pid or 0)
        self._check(rc, "clear processes")

    def reset(self, gpu: int) -> None:
        """``nvidia-smi -r``: refused while processes use the GPU; applies a pending MIG mode and
        destroys MIG instances (they do not survive a reset)."""
        self._check(self._lib.gpukitMockResetGpu(gpu), f"reset GPU {gpu}")

    def boot(self) -> None:
        """A host boot: every GPU reset, processes gone, lost GPUs back. Lab nodes call this at
        boot, as a driver load would."""
        self._check(self._lib.gpukitMockBoot(), "boot")

    def status(self) -> dict[str, Any]:
        """The profile and the device state, as JSON-compatible data."""
        size = ctypes.c_uint(0)
        rc = self._lib.gpukitMockStatusJson(None, ctypes.byref(size))
        if rc not in (NVML_SUCCESS, NVML_ERROR_INSUFFICIENT_SIZE):
            self._check(rc, "status")
        for _ in range(3):
            buf = ctypes.create_string_buffer(size.value + 256)
            size = ctypes.c_uint(len(buf))
            rc = self._lib.gpukitMockStatusJson(buf, ctypes.byref(size))
            if rc == NVML_SUCCESS:
                data: dict[str, Any] = json.loads(buf.value.decode())
                return data
            if rc != NVML_ERROR_INSUFFICIENT_SIZE:
                self._check(rc, "status")
        raise MockNvmlError(rc, "status: state keeps growing")


def state_files(state_dir: str | os.PathLike[str]) -> dict[str, Path]:
    """Where the library keeps things in a state directory (for tests and troubleshooting)."""
    d = Path(state_dir)
    return {"state": d / "state", "events": d / "events", "lock": d / "lock"}
