"""What the MIG manager needs of a node's GPUs: read them, change one thing at a time.

The pynvml implementation is gpukit.plugin.nvml.mig.PynvmlBackend; tests give fakes.
"""

from __future__ import annotations

from typing import Protocol

from gpukit.mig.state import GpuState


class MigBackend(Protocol):
    """Read the node's GPUs; make one change at a time. Implementations raise
    ``gpukit.plugin.nvml.NvmlError`` (or any exception) on failure."""

    def gpus(self) -> tuple[GpuState, ...]: ...

    def gpu(self, index: int) -> GpuState: ...

    def set_mig_mode(self, index: int, enabled: bool) -> None: ...

    def create_gpu_instance(self, index: int, profile_id: int, start: int, size: int) -> int:
        """Create at exactly this placement; returns the GPU instance id."""
        ...

    def create_compute_instance(self, index: int, gi_id: int, profile_id: int) -> int:
        """Create a compute instance in a GPU instance; returns its id."""
        ...

    def destroy_compute_instance(self, index: int, gi_id: int, ci_id: int) -> None: ...

    def destroy_gpu_instance(self, index: int, gi_id: int) -> None: ...
