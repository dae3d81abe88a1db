"""NVIDIA's opaque claim parameters (API group resource.nvidia.com/v1beta1), validated.

A claim (or its DeviceClass) may carry, for driver gpu.nvidia.com:

    apiVersion: resource.nvidia.com/v1beta1
    kind: GpuConfig            # MigDeviceConfig for MIG devices
    sharing:
      strategy: TimeSlicing    # or MPS
      timeSlicingConfig: {interval: Default|Short|Medium|Long}      # GpuConfig only
      mpsConfig: {defaultActiveThreadPercentage: 0-100, defaultPinnedDeviceMemoryLimit: 10Gi,
                  defaultPerDevicePinnedMemoryLimit: {<device index or uuid>: 5Gi}}

Fields are checked as NVIDIA's driver decodes them (strictly: an unknown field is an error);
every error names the config entry and the field. Which config applies to a request follows
the API's order: the DeviceClass's configs, then the claim's, the last one naming the request
(or naming none) winning.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpukit.contracts.dra import CONFIG_API_VERSION, DRIVER

GPU_CONFIG = "GpuConfig"
MIG_CONFIG = "MigDeviceConfig"
TIME_SLICING = "TimeSlicing"
MPS = "MPS"
# nvidia-smi compute-policy --set-timeslice values of NVIDIA's interval names.
INTERVALS = {"Default": 0, "Short": 1, "Medium": 2, "Long": 3}
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?([KMGTPE]i?|[numkMGTPE]|[eE][+-]?[0-9]+)?$")


class ConfigError(ValueError):
    """An opaque parameter NVIDIA's driver would refuse; the message names the field."""


@dataclass(frozen=True)
class Sharing:
    strategy: str  # TIME_SLICING or MPS
    interval: str = ""  # time-slicing interval name
    active_thread_percentage: int | None = None
    pinned_memory_limit: str = ""
    per_device_pinned_memory_limit: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class DeviceConfig:
    kind: str  # GPU_CONFIG or MIG_CONFIG
    sharing: Sharing | None = None


def _fields(where: str, value: Any, allowed: Iterable[str]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: must be an object, got {value!r}")
    unknown = sorted(set(value) - set(allowed))
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {', '.join(unknown)}")
    return value


def _quantity(where: str, value: Any) -> str:
    if not isinstance(value, (str, int)) or isinstance(value, bool) \
            or not _QUANTITY.match(str(value)):  # fmt: skip
        raise ConfigError(f"{where}: {value!r} is not a quantity (e.g. 10Gi)")
    return str(value)


def _mps(where: str, value: Any) -> dict[str, Any]:
    doc = _fields(where, value, ("defaultActiveThreadPercentage",
                                 "defaultPinnedDeviceMemoryLimit",
                                 "defaultPerDevicePinnedMemoryLimit"))
    out: dict[str, Any] = {}
    pct = doc.get("defaultActiveThreadPercentage")
    if pct is not None:
        if not isinstance(pct, int) or isinstance(pct, bool) or not 0 <= pct <= 100:
            raise ConfigError(f"{where}.defaultActiveThreadPercentage: {pct!r} is not an "
                              "integer from 0 to 100")
        out["active_thread_percentage"] = pct
    if doc.get("defaultPinnedDeviceMemoryLimit") is not None:
        out["pinned_memory_limit"] = _quantity(f"{where}.defaultPinnedDeviceMemoryLimit",
                                               doc["defaultPinnedDeviceMemoryLimit"])
    per = doc.get("defaultPerDevicePinnedMemoryLimit")
    if per is not None:
        per_where = f"{where}.defaultPerDevicePinnedMemoryLimit"
        if not isinstance(per, Mapping):
            raise ConfigError(f"{per_where}: must be an object, got {per!r}")
        out["per_device_pinned_memory_limit"] = tuple(
            (str(k), _quantity(f"{per_where}[{k}]", v)) for k, v in sorted(per.items()))
    return out


def _sharing(where: str, value: Any, kind: str) -> Sharing:
    allowed = ("strategy", "mpsConfig") if kind == MIG_CONFIG else \
        ("strategy", "timeSlicingConfig", "mpsConfig")  # fmt: skip
    doc = _fields(where, value, allowed)
    strategy = doc.get("strategy")
    choices = (TIME_SLICING, MPS)
    if strategy not in choices:
        raise ConfigError(f"{where}.strategy: {strategy!r} is not one of {', '.join(choices)}")
    ts, mps = doc.get("timeSlicingConfig"), doc.get("mpsConfig")
    if strategy == TIME_SLICING:
        if mps is not None:
            raise ConfigError(f"{where}.mpsConfig: not allowed with strategy {TIME_SLICING}")
        interval = "Default"
        if ts is not None:
            tsd = _fields(f"{where}.timeSlicingConfig", ts, ("interval",))
            interval = tsd.get("interval", "Default")
            if interval not in INTERVALS:
                raise ConfigError(f"{where}.timeSlicingConfig.interval: {interval!r} is not one "
                                  f"of {', '.join(INTERVALS)}")
        return Sharing(TIME_SLICING, interval=interval if kind == GPU_CONFIG else "")
    if ts is not None:
        raise ConfigError(f"{where}.timeSlicingConfig: not allowed with strategy {MPS}")
    return Sharing(MPS, **(_mps(f"{where}.mpsConfig", mps) if mps is not None else {}))


def parse(where: str, parameters: Any) -> DeviceConfig:
    """One config object (the `parameters` of an opaque config for gpu.nvidia.com)."""
    doc = _fields(where, parameters, ("apiVersion", "kind", "sharing"))
    api, kind = doc.get("apiVersion"), doc.get("kind")
    if api != CONFIG_API_VERSION:
        raise ConfigError(f"{where}.apiVersion: {api!r} is not {CONFIG_API_VERSION}")
    if kind not in (GPU_CONFIG, MIG_CONFIG):
        raise ConfigError(f"{where}.kind: {kind!r} is not one of {GPU_CONFIG}, {MIG_CONFIG}")
    sharing = doc.get("sharing")
    return DeviceConfig(kind, _sharing(f"{where}.sharing", sharing, kind)
                        if sharing is not None else None)


def configs_by_request(entries: Sequence[Mapping[str, Any]], requests: Iterable[str]
                       ) -> dict[str, DeviceConfig]:
    """The config that applies to each request, from a claim's
    status.allocation.devices.config (entries of other drivers are not ours)."""
    parsed: list[tuple[int, tuple[str, ...], DeviceConfig]] = []
    for i, entry in enumerate(entries):
        opaque = entry.get("opaque") or {}
        if opaque.get("driver") != DRIVER:
            continue
        where = f"config[{i}] ({entry.get('source', '?')}).opaque.parameters"
        rank = 0 if entry.get("source") == "FromClass" else 1
        parsed.append((rank, tuple(entry.get("requests") or ()),
                       parse(where, opaque.get("parameters"))))
    out: dict[str, DeviceConfig] = {}
    for request in requests:
        # Stable sort: class configs first, each source's entries in their order.
        for _rank, names, cfg in sorted(parsed, key=lambda p: p[0]):
            if not names or request in names or request.split("/")[0] in names:
                out[request] = cfg
    return out


def check_kind(where: str, cfg: DeviceConfig, is_mig: bool) -> None:
    """GpuConfig configures whole GPUs, MigDeviceConfig MIG devices (as NVIDIA's driver)."""
    wanted = MIG_CONFIG if is_mig else GPU_CONFIG
    if cfg.kind != wanted:
        raise ConfigError(f"{where}: a {cfg.kind} cannot configure a "
                          f"{'MIG device' if is_mig else 'whole GPU'} (use {wanted})")


_SUFFIX = {"": 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
           "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15,
           "E": 10**18, "m": 1, "n": 1, "u": 1}


def quantity_mib(where: str, quantity: str) -> str:
    """A memory quantity as MPS takes a limit (`<MiB>M`, rounded down, as NVIDIA's driver);
    below 1 MiB is refused, as there."""
    m = _QUANTITY.match(quantity)
    assert m is not None  # validated when parsed
    number = float(quantity[: m.start(2)] if m.group(2) else quantity)
    suffix = m.group(2) or ""
    if suffix[:1] in ("e", "E") and suffix[1:].lstrip("+-").isdigit():
        value = float(quantity)  # an exponent: 1e9
    elif suffix in ("m", "n", "u"):
        value = 0.0  # milli-, nano-, micro-bytes: below a byte
    else:
        value = number * _SUFFIX[suffix]
    mib = int(value) // 2**20
    if mib <= 0:
        raise ConfigError(f"{where}: {quantity!r} is below 1Mi, too low for an MPS limit")
    return f"{mib}M"


def sharing_env(sharing: Sharing | None) -> list[str]:
    """What a sharing setting puts into the container's environment: the setting as
    recorded (GPUKIT_DRA_SHARING_*), and MPS's limits as the CUDA MPS client reads them. The
    MPS daemon itself and its pipe directory come with the claim (gpukit/plugin/dra/
    claim_mps.py); a time-slice interval is recorded only (NVIDIA's driver runs `nvidia-smi
    compute-policy --set-timeslice=<0-3>`, which the lab's GPUs do not have)."""
    if sharing is None:
        return []
    env = [f"GPUKIT_DRA_SHARING_STRATEGY={sharing.strategy}"]
    if sharing.interval:
        env.append(f"GPUKIT_DRA_TIMESLICE_INTERVAL={sharing.interval}")
    if sharing.active_thread_percentage is not None:
        env.append(f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={sharing.active_thread_percentage}")
    if sharing.pinned_memory_limit:
        env.append(f"GPUKIT_DRA_MPS_PINNED_DEVICE_MEMORY_LIMIT={sharing.pinned_memory_limit}")
    return env
