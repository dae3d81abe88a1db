"""A GPU's compute mode, which MPS needs EXCLUSIVE_PROCESS for while it serves the GPU."""

from __future__ import annotations

import pynvml

from .calls import call


def set_exclusive(uuid: str, exclusive: bool) -> None:
    """EXCLUSIVE_PROCESS (only the MPS server holds a context) or back to DEFAULT."""
    handle = call("nvmlDeviceGetHandleByUUID", pynvml.nvmlDeviceGetHandleByUUID, uuid,
                  subject=uuid)
    mode = (pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS if exclusive
            else pynvml.NVML_COMPUTEMODE_DEFAULT)
    call("nvmlDeviceSetComputeMode", pynvml.nvmlDeviceSetComputeMode, handle, mode, subject=uuid)


def is_exclusive(uuid: str) -> bool:
    handle = call("nvmlDeviceGetHandleByUUID", pynvml.nvmlDeviceGetHandleByUUID, uuid,
                  subject=uuid)
    mode = call("nvmlDeviceGetComputeMode", pynvml.nvmlDeviceGetComputeMode, handle, subject=uuid)
    return bool(mode == pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS)
