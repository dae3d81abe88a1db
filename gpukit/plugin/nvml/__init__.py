"""NVML access for gpukit's programs on a node, the one place they call pynvml.

* ``calls``      loading the library, init/shutdown, NVML's failures as `NvmlError`
* ``compute_mode`` a GPU's compute mode (EXCLUSIVE_PROCESS while MPS serves it)
* ``discovery``  the node's GPUs, MIG devices and links (the types of gpukit/plugin/devices.py)
* ``events``     XID event sets and the GPU probe the health monitor uses
* ``mig``        GPU and compute instances for the MIG manager
* ``telemetry``  what a GPU or MIG device is doing now (the agent's GPU metrics)

The node agent, the MIG manager and the facts module reach NVML only through these
(tests/unit/test_nvml_access.py holds that); the conformance suite has its own ctypes probe on
purpose, an independent witness of what the driver says.
"""

from .calls import (
    LOST_CODES,
    MIG_ID_UNSET,
    NvmlError,
    call,
    init,
    is_lab_mock,
    lab_mock_reset,
    load_library,
    normalize_bus_id,
    optional,
    shutdown,
)
from .discovery import discover, mig_mode

__all__ = [
    "LOST_CODES", "MIG_ID_UNSET", "NvmlError", "call", "discover", "init", "is_lab_mock",
    "lab_mock_reset", "load_library", "mig_mode", "normalize_bus_id", "optional", "shutdown",
]
