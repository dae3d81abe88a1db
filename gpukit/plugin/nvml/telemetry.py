"""What a GPU or MIG device is doing now, as NVML answers: the readings behind the agent's GPU
metrics (gpukit/plugin/gpu_metrics.py).

Each query is asked on its own: one the GPU does not answer (NOT_SUPPORTED: utilisation with
MIG enabled, remapped rows before Ampere; or any other failure) leaves its field out, and the
rest still count. A GPU that is gone (GPU_IS_LOST and kin) says so in `lost` and answers
nothing. Values are in NVML's units: MiB for memory (as DCGM reports framebuffer), W for power,
mJ for energy, MHz, C, %, KB/s.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import pynvml

from .calls import LOST_CODES

log = logging.getLogger(__name__)
MIB = 1024 * 1024


@dataclass
class Reading:
    """One device's answers: field name -> value (only what NVML answered)."""

    values: dict[str, float] = field(default_factory=dict)
    lost: str = ""  # why NVML says the GPU is gone; "" when it answered
    failed: int = 0  # queries that failed for another reason than "not supported"


def _ask(reading: Reading, name: str, fn: Callable[[], Any]) -> None:
    _ask_many(reading, (name,), lambda: (fn(),))


def _ask_many(reading: Reading, names: tuple[str, ...], fn: Callable[[], tuple[Any, ...]]
              ) -> None:
    """One query answering several fields (utilisation, memory, remapped rows)."""
    if reading.lost:
        return
    try:
        values = fn()
        for name, value in zip(names, values, strict=True):
            reading.values[name] = float(value)
    except pynvml.NVMLError as exc:
        if exc.value in LOST_CODES:
            reading.lost = f"{exc} (NVML error {exc.value})"
        elif exc.value not in (pynvml.NVML_ERROR_NOT_SUPPORTED,
                               pynvml.NVML_ERROR_FUNCTION_NOT_FOUND):
            reading.failed += 1
            log.debug("%s: %s", name, exc)


def _memory(handle: Any, reading: Reading) -> None:
    def used_free() -> tuple[float, float]:
        m = pynvml.nvmlDeviceGetMemoryInfo(handle)
        return m.used / MIB, m.free / MIB

    _ask_many(reading, ("fb_used_mib", "fb_free_mib"), used_free)


def read_gpu(uuid: str) -> Reading:
    """A whole GPU's telemetry (also of a MIG-enabled GPU: what is not per instance)."""
    reading = Reading()
    try:
        h = pynvml.nvmlDeviceGetHandleByUUID(uuid)
    except pynvml.NVMLError as exc:
        if exc.value in LOST_CODES or exc.value == pynvml.NVML_ERROR_NOT_FOUND:
            reading.lost = f"{exc} (NVML error {exc.value})"
        else:
            reading.failed += 1
        return reading
    n = pynvml
    def utilization() -> tuple[int, int]:
        u = n.nvmlDeviceGetUtilizationRates(h)
        return u.gpu, u.memory

    _ask_many(reading, ("gpu_util", "mem_copy_util"), utilization)
    _memory(h, reading)
    _ask(reading, "power_w", lambda: n.nvmlDeviceGetPowerUsage(h) / 1000.0)
    _ask(reading, "energy_mj", lambda: n.nvmlDeviceGetTotalEnergyConsumption(h))
    _ask(reading, "gpu_temp_c", lambda: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU))
    _ask(reading, "sm_clock_mhz", lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM))
    _ask(reading, "mem_clock_mhz", lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM))
    _ask(reading, "pcie_tx_kb", lambda: n.nvmlDeviceGetPcieThroughput(
        h, n.NVML_PCIE_UTIL_TX_BYTES))
    _ask(reading, "pcie_rx_kb", lambda: n.nvmlDeviceGetPcieThroughput(
        h, n.NVML_PCIE_UTIL_RX_BYTES))
    _ask(reading, "pcie_replays", lambda: n.nvmlDeviceGetPcieReplayCounter(h))
    for kind, error in (("sbe", n.NVML_MEMORY_ERROR_TYPE_CORRECTED),
                        ("dbe", n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)):
        for scope, counter in (("vol", n.NVML_VOLATILE_ECC), ("agg", n.NVML_AGGREGATE_ECC)):
            _ask(reading, f"ecc_{kind}_{scope}", partial(n.nvmlDeviceGetTotalEccErrors, h,
                                                         error, counter))
    _ask_many(reading, ("remapped_rows_correctable", "remapped_rows_uncorrectable",
                        "row_remap_pending", "row_remap_failure"),
              lambda: tuple(n.nvmlDeviceGetRemappedRows(h)))
    return reading


def read_mig(uuid: str) -> Reading:
    """A MIG device's own telemetry: its instance's memory (the rest is its GPU's)."""
    reading = Reading()
    try:
        h = pynvml.nvmlDeviceGetHandleByUUID(uuid)
    except pynvml.NVMLError as exc:
        if exc.value in LOST_CODES:
            reading.lost = f"{exc} (NVML error {exc.value})"
        else:
            reading.failed += 1
        return reading
    _memory(h, reading)
    return reading
