"""Loading NVML, init/shutdown, and turning NVML's failures into `NvmlError`.

Every NVML failure becomes an `NvmlError` naming the call, the device and NVML's own message;
`optional` turns "this GPU does not have that" (NOT_SUPPORTED and kin) into a default.
"""

from __future__ import annotations

import ctypes
import logging
import re
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import pynvml

log = logging.getLogger(__name__)
T = TypeVar("T")

_BUS_ID = re.compile(r"^(?:([0-9a-fA-F]+):)?([0-9a-fA-F]+):([0-9a-fA-F]+)\.([0-9a-fA-F]+)$")
# Codes meaning "this GPU is gone or broken", as opposed to "this call is not available".
LOST_CODES = frozenset(
    {
        pynvml.NVML_ERROR_GPU_IS_LOST,
        pynvml.NVML_ERROR_RESET_REQUIRED,
        pynvml.NVML_ERROR_UNKNOWN,
        pynvml.NVML_ERROR_IRQ_ISSUE,
        pynvml.NVML_ERROR_CORRUPTED_INFOROM,
    }
)
MIG_ID_UNSET = 0xFFFFFFFF


class NvmlError(RuntimeError):
    """An NVML call failed; `code` is the NVML_ERROR_* value (0 when NVML never answered)."""

    def __init__(self, call: str, code: int, detail: str, subject: str = "") -> None:
        self.call, self.code, self.subject = call, code, subject
        where = f" for {subject}" if subject else ""
        super().__init__(f"{call}{where} failed: {detail} (NVML error {code})")

    @property
    def gpu_lost(self) -> bool:
        return self.code in LOST_CODES


_load_lock = threading.Lock()


def load_library(path: str) -> None:
    """Make pynvml use the library at `path` (e.g. the lab mock) instead of its search path.

    Must run before the first nvmlInit in this process; later calls with another path fail
    because pynvml caches function pointers.
    """
    with _load_lock:
        current = pynvml.nvmlLib
        if current is not None:
            if getattr(current, "_name", None) != path:
                raise NvmlError("load_library", 0, f"NVML already loaded from {current._name}")
            return
        try:
            pynvml.nvmlLib = ctypes.CDLL(path)
        except OSError as exc:
            raise NvmlError("load_library", pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, str(exc)) from exc


def call(name: str, fn: Callable[..., T], *args: Any, subject: str = "") -> T:
    try:
        return fn(*args)
    except pynvml.NVMLError as exc:
        raise NvmlError(name, int(exc.value), str(exc), subject) from exc


def optional(name: str, fn: Callable[..., T], *args: Any, default: T, subject: str = "") -> T:
    """Like call(), but NOT_SUPPORTED / FUNCTION_NOT_FOUND / NOT_FOUND give `default`."""
    try:
        return fn(*args)
    except pynvml.NVMLError as exc:
        if exc.value in (
            pynvml.NVML_ERROR_NOT_SUPPORTED,
            pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
            pynvml.NVML_ERROR_NOT_FOUND,
            pynvml.NVML_ERROR_INVALID_ARGUMENT,
        ):
            return default
        raise NvmlError(name, int(exc.value), str(exc), subject) from exc
    except pynvml.NVMLLibraryMismatchError:
        return default


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def normalize_bus_id(bus_id: str) -> str:
    """NVML mixes 8- and 4-digit PCI domains; compare as `dddd:bb:dd.f`, lower case."""
    m = _BUS_ID.match(bus_id.strip())
    if not m:
        return bus_id.strip().lower()
    domain, bus, dev, fn = m.groups()
    return f"{int(domain or '0', 16):04x}:{int(bus, 16):02x}:{int(dev, 16):02x}.{int(fn, 16):x}"


def init() -> None:
    """nvmlInit; raises NvmlError with a message that says what to check."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        hint = ""
        if exc.value == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND:
            hint = " (is libnvidia-ml.so.1 on the library path, or GPUKIT_NVML_LIB set?)"
        elif exc.value == pynvml.NVML_ERROR_DRIVER_NOT_LOADED:
            hint = " (is the NVIDIA kernel driver loaded?)"
        raise NvmlError("nvmlInit", int(exc.value), f"{exc}{hint}") from exc


def shutdown() -> None:
    try:
        pynvml.nvmlShutdown()
    except pynvml.NVMLError as exc:
        log.warning("nvmlShutdown failed: %s", exc)


def is_lab_mock() -> bool:
    """The loaded library is the lab's mock NVML (it has entry points the driver's has not)."""
    return pynvml.nvmlLib is not None and hasattr(pynvml.nvmlLib, "gpukitMockResetGpu")


def lab_mock_reset(index: int) -> None:
    """`nvidia-smi -r -i <index>` for the lab's mock NVML, through the library this process
    has loaded: a pending MIG mode takes effect, MIG instances go, as a reset does. The node
    wheel and the agent image carry no lab, so the mock's own entry point is the way in."""
    fn = getattr(pynvml.nvmlLib, "gpukitMockResetGpu", None)
    if fn is None:
        raise NvmlError("gpukitMockResetGpu", pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
                        "the loaded NVML is not the lab's mock", f"GPU {index}")
    rc = int(fn(ctypes.c_uint(index)))
    if rc:
        raise NvmlError("gpukitMockResetGpu", rc, _error_string(rc), f"GPU {index}")


def _error_string(rc: int) -> str:
    try:
        return _text(pynvml.nvmlErrorString(rc))
    except pynvml.NVMLError:
        return f"error {rc}"
