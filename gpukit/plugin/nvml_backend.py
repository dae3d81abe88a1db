"""Where the agent gets NVML from: the real library through pynvml (or the lab's mock), or a
test's stand-in with the same three calls; and the startup error the agent stops with."""

from __future__ import annotations

import threading
from typing import Protocol

from . import nvml
from .devices import NodeDevices
from .nvml import compute_mode, telemetry


class InitError(RuntimeError):
    """Startup failed and failOnInitError asks to stop; the message says what to fix."""


class NvmlBackend(Protocol):
    def init(self) -> None: ...
    def discover(self, with_topology: bool) -> NodeDevices: ...
    def shutdown(self) -> None: ...


class PynvmlBackend:
    """The real thing: pynvml against libnvidia-ml.so.1 (or the lab mock)."""

    def __init__(self, library: str | None = None) -> None:
        self.library = library
        self._early: threading.Thread | None = None
        self._early_error: Exception | None = None

    def init_early(self) -> None:
        """Start nvmlInit now, in a thread, for the next `init()` to take its outcome. ctypes
        lets go of the GIL during the call, so the driver's initialisation (long on a node
        without persistence mode) overlaps the agent's imports and config load."""

        def run() -> None:
            try:
                self._init()
            except Exception as exc:  # handed to init(), which raises it
                self._early_error = exc

        self._early = threading.Thread(target=run, name="gpukit-nvml-init", daemon=True)
        self._early.start()

    def init(self) -> None:
        early, self._early = self._early, None
        if early is None:
            self._init()
            return
        early.join()
        error, self._early_error = self._early_error, None
        if error is not None:
            raise error

    def _init(self) -> None:
        if self.library:
            nvml.load_library(self.library)
        nvml.init()

    def discover(self, with_topology: bool) -> NodeDevices:
        return nvml.discover(with_topology=with_topology)

    def shutdown(self) -> None:
        nvml.shutdown()

    def set_compute_mode(self, uuid: str, exclusive: bool) -> None:
        compute_mode.set_exclusive(uuid, exclusive)

    def read_gpu(self, uuid: str) -> telemetry.Reading:
        return telemetry.read_gpu(uuid)

    def read_mig(self, uuid: str) -> telemetry.Reading:
        return telemetry.read_mig(uuid)


def no_compute_mode(uuid: str, exclusive: bool) -> None:
    raise NotImplementedError("this NVML backend cannot set a GPU's compute mode")


def no_reading(uuid: str) -> telemetry.Reading:
    return telemetry.Reading()  # a backend without telemetry (tests' stand-ins)
