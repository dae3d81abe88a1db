"""How an NVML library answers the read-only calls gpukit makes: recorded on a real GPU,
compared with the mock's answers for the same model.

`record` runs in a process whose pynvml loads whichever libnvidia-ml.so.1 it finds (the
driver's on a GPU machine, the mock under `gpukit.lab.nvml.env`). It only reads: no MIG
mode change, no instance created, no reset. Each answer is kept with the rule by which the
mock's answer must match it:

- ``exact``: the same return code and value (what the GPU model fixes: name, memory, MIG
  profile tables and placements, supported events, error codes for misuse);
- ``shape``: the same return code, and a value of the same type (dict keys, list element
  types) and, for strings, matching the entry's pattern (UUIDs, bus IDs, versions);
- ``code``: the same return code (values that drift: power, temperature);
- ``info``: recorded, not compared (the machine around the GPU: NUMA, NVLink wiring).

    python -m gpukit.lab.nvml.fidelity record --out real.json [--index 0]
    python -m gpukit.lab.nvml.fidelity compare real.json mock.json

Only the standard library and pynvml are imported, so a bare GPU machine can run it.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import re
import sys
from collections.abc import Callable
from functools import partial
from typing import Any

RULES = ("exact", "shape", "code", "info")
UUID_GPU = r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
BUS_ID = r"^[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-9A-F]$"
BUS_ID_LEGACY = r"^[0-9A-F]{4}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-9A-F]$"
DRIVER_VERSION = r"^\d{3}\.\d{2,3}(\.\d{2})?$"
VBIOS = r"^[0-9A-F]{2}(\.[0-9A-F]{2}){4}$"
SERIAL = r"^\d{13}$"
BOGUS_UUID = "GPU-00000000-0000-0000-0000-000000000000"


def plain(value: Any) -> Any:
    """An NVML answer as JSON: structures as dicts, arrays as lists, bytes as text."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, ctypes.Structure):
        return {name: plain(getattr(value, name)) for name, *_ in value._fields_}
    if isinstance(value, ctypes.Array):
        return [plain(v) for v in value]
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "__dict__") and type(value).__name__ == "nvmlFriendlyObject":
        return {k: plain(v) for k, v in sorted(vars(value).items())}
    if isinstance(value, ctypes._SimpleCData):
        return plain(value.value)
    return value


class Recorder:
    def __init__(self, pynvml: Any) -> None:
        self.nvml = pynvml
        self.entries: list[dict[str, Any]] = []

    def code_name(self, code: int) -> str:
        for name in dir(self.nvml):
            if name.startswith("NVML_ERROR_") and getattr(self.nvml, name) == code:
                return name
        return f"NVML_ERROR_{code}"

    def call(self, key: str, rule: str, fn: Callable[[], Any], pattern: str | None = None,
             keep: Callable[[Any], Any] = plain) -> Any:
        """Run one query; keep its return code and (on success) its value under `key`."""
        assert rule in RULES, rule
        entry: dict[str, Any] = {"key": key, "rule": rule}
        result = None
        try:
            result = fn()
            entry["rc"] = "NVML_SUCCESS"
            entry["value"] = keep(result)
        except self.nvml.NVMLError as e:
            entry["rc"] = self.code_name(e.value)
        if pattern:
            entry["pattern"] = pattern
        self.entries.append(entry)
        return result


def _gi_profile_keep(info: Any) -> dict[str, Any]:
    d = plain(info)
    d.pop("version", None)  # what the caller passed in
    return dict(d)


def _placements(nvml: Any, handle: Any, profile_id: int) -> list[list[int]]:
    placements = (nvml.c_nvmlGpuInstancePlacement_t * 16)()
    count = ctypes.c_uint(0)
    nvml.nvmlDeviceGetGpuInstancePossiblePlacements(
        handle, profile_id, placements, ctypes.byref(count))
    return [[p.start, p.size] for p in placements[: count.value]]


def _fabric_struct(nvml: Any, name: str) -> Any:
    """A fabric info struct of this pynvml; one too old to have it records FUNCTION_NOT_FOUND."""
    if not hasattr(nvml, name):
        raise nvml.NVMLError(nvml.NVML_ERROR_FUNCTION_NOT_FOUND)
    return getattr(nvml, name)()


def _fabric_info(nvml: Any, handle: Any) -> dict[str, Any]:
    info = _fabric_struct(nvml, "c_nvmlGpuFabricInfo_t")
    nvml.nvmlDeviceGetGpuFabricInfo(handle, ctypes.byref(info))
    return {"clusterUuid": bytes(info.clusterUuid).hex(), "cliqueId": info.cliqueId,
            "state": info.state, "status": info.status}


def _fabric_info_v2(nvml: Any, handle: Any) -> dict[str, Any]:
    info = _fabric_struct(nvml, "c_nvmlGpuFabricInfo_v2_t")
    nvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
    return {"clusterUuid": bytes(info.clusterUuid).hex(), "cliqueId": info.cliqueId,
            "state": info.state, "status": info.status, "healthMask": info.healthMask}


def _gpu_instances(nvml: Any, handle: Any, profile_id: int) -> int:
    instances = (nvml.c_nvmlGpuInstance_t * 8)()
    count = ctypes.c_uint(0)
    nvml.nvmlDeviceGetGpuInstances(handle, profile_id, instances, ctypes.byref(count))
    return count.value


def _xid_wait(nvml: Any, handle: Any) -> str:
    """Register for critical XIDs and wait briefly: no event on a quiet GPU."""
    event_set = nvml.nvmlEventSetCreate()
    try:
        nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, event_set)
        data = nvml.nvmlEventSetWait_v2(event_set, 10)
        return f"event {data.eventType}"
    finally:
        nvml.nvmlEventSetFree(event_set)


def record(nvml: Any, index: int = 0) -> dict[str, Any]:
    r = Recorder(nvml)
    nvml.nvmlInit()
    try:
        r.call("system.driver_version", "shape", nvml.nvmlSystemGetDriverVersion,
               pattern=DRIVER_VERSION)
        r.call("system.cuda_driver_version", "shape", nvml.nvmlSystemGetCudaDriverVersion_v2)
        count = r.call("system.device_count", "info", nvml.nvmlDeviceGetCount)
        r.call("device.by_index(count)", "exact",
               lambda: nvml.nvmlDeviceGetHandleByIndex(count) and None)
        r.call("device.by_uuid(bogus)", "exact",
               lambda: nvml.nvmlDeviceGetHandleByUUID(BOGUS_UUID) and None)
        h = nvml.nvmlDeviceGetHandleByIndex(index)
        _device(r, nvml, h)
        _mig(r, nvml, h)
    finally:
        nvml.nvmlShutdown()
    return {"index": index, "entries": r.entries}


def _device(r: Recorder, nvml: Any, h: Any) -> None:
    name = r.call("device.name", "exact", lambda: nvml.nvmlDeviceGetName(h))
    uuid = r.call("device.uuid", "shape", lambda: nvml.nvmlDeviceGetUUID(h), pattern=UUID_GPU)
    r.call("device.by_uuid(own) is the same device", "exact",
           lambda: nvml.nvmlDeviceGetIndex(nvml.nvmlDeviceGetHandleByUUID(uuid))
           == nvml.nvmlDeviceGetIndex(h))
    r.call("device.serial", "shape", lambda: nvml.nvmlDeviceGetSerial(h), pattern=SERIAL)
    r.call("device.minor_number", "shape", lambda: nvml.nvmlDeviceGetMinorNumber(h))
    pci = r.call("device.pci", "info", lambda: nvml.nvmlDeviceGetPciInfo(h))
    if pci is not None:
        r.call("device.pci.busId", "shape", lambda: pci.busId, pattern=BUS_ID)
        r.call("device.pci.busIdLegacy", "shape", lambda: pci.busIdLegacy, pattern=BUS_ID_LEGACY)
        r.call("device.pci.pciDeviceId", "exact", lambda: pci.pciDeviceId)
        r.call("device.pci.pciSubSystemId", "shape", lambda: pci.pciSubSystemId)
    mem = r.call("device.memory", "info", lambda: nvml.nvmlDeviceGetMemoryInfo(h))
    if mem is not None:
        r.call("device.memory.total", "exact", lambda: mem.total)
        r.call("device.memory.used+free", "exact", lambda: mem.used + mem.free == mem.total)
    r.call("device.memory_v2", "shape",
           lambda: nvml.nvmlDeviceGetMemoryInfo(h, version=nvml.nvmlMemory_v2),
           keep=lambda m: sorted(plain(m)))
    r.call("device.cuda_compute_capability", "exact",
           lambda: nvml.nvmlDeviceGetCudaComputeCapability(h))
    r.call("device.architecture", "exact", lambda: nvml.nvmlDeviceGetArchitecture(h))
    r.call("device.brand", "exact", lambda: nvml.nvmlDeviceGetBrand(h))
    r.call("device.vbios_version", "shape", lambda: nvml.nvmlDeviceGetVbiosVersion(h),
           pattern=VBIOS)
    r.call("device.persistence_mode", "shape", lambda: nvml.nvmlDeviceGetPersistenceMode(h))
    r.call("device.performance_state", "shape", lambda: nvml.nvmlDeviceGetPerformanceState(h))
    r.call("device.fan_speed", "exact", lambda: nvml.nvmlDeviceGetFanSpeed(h) and None)
    r.call("device.temperature", "code",
           lambda: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU))
    r.call("device.power_usage", "code", lambda: nvml.nvmlDeviceGetPowerUsage(h))
    r.call("device.enforced_power_limit", "shape",
           lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(h))
    r.call("device.utilization", "shape", lambda: nvml.nvmlDeviceGetUtilizationRates(h),
           keep=lambda u: sorted(plain(u)))
    r.call("device.compute_processes", "exact",
           lambda: nvml.nvmlDeviceGetComputeRunningProcesses(h))
    r.call("device.graphics_processes", "exact",
           lambda: nvml.nvmlDeviceGetGraphicsRunningProcesses(h))
    r.call("device.numa_node", "info", lambda: nvml.nvmlDeviceGetNumaNodeId(h))
    r.call("device.nvlink_state[0]", "info", lambda: nvml.nvmlDeviceGetNvLinkState(h, 0))
    # The nvmlNvlinkVersion_t the model's links answer (NVML_NVLINK_VERSION_4_0 = 6 on an H100?);
    # the fabric registration depends on the machine (NVSwitch / multi-node NVLink), so info.
    r.call("device.nvlink_version[0]", "exact", lambda: nvml.nvmlDeviceGetNvLinkVersion(h, 0))
    r.call("device.gpu_fabric_info", "info", partial(_fabric_info, nvml, h))
    r.call("device.gpu_fabric_info_v.v2", "info", partial(_fabric_info_v2, nvml, h))
    r.call("device.supported_event_types", "exact",
           lambda: nvml.nvmlDeviceGetSupportedEventTypes(h))
    r.call("device.xid_events(wait 10 ms)", "exact", lambda: _xid_wait(nvml, h))
    r.call("device.is_mig_device_handle", "exact", lambda: nvml.nvmlDeviceIsMigDeviceHandle(h))
    del name


def _mig(r: Recorder, nvml: Any, h: Any) -> None:
    """MIG as seen without changing anything: mode, the profile table, misuse on a full GPU."""
    r.call("mig.mode", "exact", lambda: nvml.nvmlDeviceGetMigMode(h))
    r.call("mig.max_mig_device_count", "exact", lambda: nvml.nvmlDeviceGetMaxMigDeviceCount(h))
    r.call("mig.device_handle(0)", "exact",
           lambda: nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 0) and None)
    r.call("mig.gpu_instance_id(full gpu)", "exact", lambda: nvml.nvmlDeviceGetGpuInstanceId(h))
    r.call("mig.compute_instance_id(full gpu)", "exact",
           lambda: nvml.nvmlDeviceGetComputeInstanceId(h))
    r.call("mig.attributes(full gpu)", "exact", lambda: nvml.nvmlDeviceGetAttributes(h) and None)
    for profile in range(nvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        for version in (1, 2):
            info = r.call(f"mig.gi_profile[{profile}].v{version}", "exact",
                          partial(nvml.nvmlDeviceGetGpuInstanceProfileInfo, h, profile,
                                  version=version),
                          keep=_gi_profile_keep)
        if info is None:
            continue
        pid = info.id
        r.call(f"mig.gi_profile[{profile}].placements", "exact",
               partial(_placements, nvml, h, pid))
        r.call(f"mig.gi_profile[{profile}].remaining_capacity", "exact",
               partial(nvml.nvmlDeviceGetGpuInstanceRemainingCapacity, h, pid))
        r.call(f"mig.gi_profile[{profile}].instances", "exact",
               partial(_gpu_instances, nvml, h, pid))


def _shape(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return ["list", sorted({json.dumps(_shape(v)) for v in value})]
    return type(value).__name__


def compare(real: dict[str, Any], mock: dict[str, Any]) -> list[str]:
    """Where the mock's answers break the rules recorded with the real ones."""
    got = {e["key"]: e for e in mock["entries"]}
    problems = []
    for want in real["entries"]:
        key, rule = want["key"], want["rule"]
        if rule == "info":
            continue
        have = got.get(key)
        if have is None:
            problems.append(f"{key}: not answered by the mock")
            continue
        if have["rc"] != want["rc"]:
            problems.append(f"{key}: returns {have['rc']}, the driver {want['rc']}")
            continue
        if want["rc"] != "NVML_SUCCESS" or rule == "code":
            continue
        if rule == "exact" and have["value"] != want["value"]:
            problems.append(f"{key}: {have['value']!r}, the driver {want['value']!r}")
        elif rule == "shape":
            if _shape(have["value"]) != _shape(want["value"]):
                problems.append(f"{key}: shaped {_shape(have['value'])}, "
                                f"the driver's {_shape(want['value'])}")
            elif "pattern" in want and not re.match(want["pattern"], str(have["value"])):
                problems.append(f"{key}: {have['value']!r} does not match {want['pattern']}")
    return problems


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpukit.lab.nvml.fidelity", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record", help="record this process's NVML answers as JSON")
    rec.add_argument("--out", default="-")
    rec.add_argument("--index", type=int, default=0)
    cmp = sub.add_parser("compare", help="check a mock record against a real one")
    cmp.add_argument("real")
    cmp.add_argument("mock")
    args = p.parse_args(argv)
    if args.cmd == "record":
        import pynvml

        text = json.dumps(record(pynvml, args.index), indent=1, sort_keys=True)
        if args.out == "-":
            print(text)
        else:
            with open(args.out, "w") as f:
                f.write(text + "\n")
        return 0
    with open(args.real) as f:
        real = json.load(f)
    with open(args.mock) as f:
        mock = json.load(f)
    problems = compare(real, mock)
    for line in problems:
        print(line)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
