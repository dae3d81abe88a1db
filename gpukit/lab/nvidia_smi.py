"""An ``nvidia-smi`` over pynvml (read-only but for the compute mode), for lab nodes (where the
mock NVML has no nvidia-smi) and anywhere else: it only uses public NVML calls, so it works
against the real library too.

    python -m gpukit.lab.nvidia_smi                  summary table
    python -m gpukit.lab.nvidia_smi -L               list GPUs and MIG devices, like nvidia-smi -L
    python -m gpukit.lab.nvidia_smi --query-gpu=name,uuid,driver_version,memory.total,\
mig.mode.current --format=csv,noheader [-i 0,1]
    python -m gpukit.lab.nvidia_smi topo -m         GPU topology matrix, like nvidia-smi topo -m
    python -m gpukit.lab.nvidia_smi -i GPU-... -c EXCLUSIVE_PROCESS   set the compute mode

Exit status: 0, or the NVML error code of the failure (as nvidia-smi does).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pynvml

NA = "[N/A]"


class _Lost(Exception):
    """A GPU could not be reached (NVML error code in ``code``)."""

    def __init__(self, index: int, code: int, text: str) -> None:
        super().__init__(f"Unable to determine the device handle for GPU {index}: {text}")
        self.code = code


def _err_text(e: pynvml.NVMLError) -> str:
    return str(e)


def _try(fn: Callable[..., Any], *args: Any, default: Any = None) -> Any:
    """fn(*args), or ``default`` where NVML says no (not supported, lost, ...)."""
    try:
        return fn(*args)
    except pynvml.NVMLError:
        return default


@dataclass
class MigDevice:
    index: int
    profile: str
    uuid: str
    gi: int | None
    ci: int | None
    memory_total_mib: int | None
    memory_used_mib: int | None
    sm: int | None
    engines: tuple[int, int, int, int, int] | None  # CE ENC DEC OFA JPG


def _mig_profile_name(name: str) -> str:
    # NVML names MIG devices "<GPU name> MIG <profile>"; nvidia-smi shows the profile.
    return name.split(" MIG ", 1)[1] if " MIG " in name else name


def _mig_devices(handle: Any) -> list[MigDevice]:
    mode = _try(pynvml.nvmlDeviceGetMigMode, handle)
    if not mode or mode[0] != pynvml.NVML_DEVICE_MIG_ENABLE:
        return []
    out: list[MigDevice] = []
    count = int(_try(pynvml.nvmlDeviceGetMaxMigDeviceCount, handle, default=0))
    for i in range(count):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
        except pynvml.NVMLError:
            continue
        mem = _try(pynvml.nvmlDeviceGetMemoryInfo, mig)
        attrs = _try(pynvml.nvmlDeviceGetAttributes, mig)
        gi = _try(pynvml.nvmlDeviceGetGpuInstanceId, mig)
        ci = _try(pynvml.nvmlDeviceGetComputeInstanceId, mig)
        out.append(
            MigDevice(
                index=len(out),
                profile=_mig_profile_name(str(pynvml.nvmlDeviceGetName(mig))),
                uuid=str(pynvml.nvmlDeviceGetUUID(mig)),
                gi=None if gi is None else int(gi),
                ci=None if ci is None else int(ci),
                memory_total_mib=int(mem.total) >> 20 if mem else None,
                memory_used_mib=int(mem.used) >> 20 if mem else None,
                sm=int(attrs.multiprocessorCount) if attrs else None,
                engines=(
                    int(attrs.sharedCopyEngineCount),
                    int(attrs.sharedEncoderCount),
                    int(attrs.sharedDecoderCount),
                    int(attrs.sharedOfaCount),
                    int(attrs.sharedJpegCount),
                )
                if attrs
                else None,
            )
        )
    return out


def _handle(index: int) -> Any:
    try:
        return pynvml.nvmlDeviceGetHandleByIndex(index)
    except pynvml.NVMLError as e:
        raise _Lost(index, int(e.value), _err_text(e)) from e


def list_gpus(indexes: list[int]) -> tuple[list[str], int]:
    """``nvidia-smi -L`` lines and exit status."""
    lines: list[str] = []
    status = 0
    for i in indexes:
        try:
            h = _handle(i)
            lines.append(
                f"GPU {i}: {pynvml.nvmlDeviceGetName(h)} (UUID: {pynvml.nvmlDeviceGetUUID(h)})"
            )
            for m in _mig_devices(h):
                lines.append(f"  MIG {m.profile:<11} Device {m.index:>2}: (UUID: {m.uuid})")
        except _Lost as e:
            lines.append(str(e))
            status = e.code
        except pynvml.NVMLError as e:
            lines.append(f"GPU {i}: {_err_text(e)}")
            status = int(e.value)
    return lines, status


# ---- --query-gpu ----
def _mib(value: int) -> tuple[str, str]:
    return str(value >> 20), "MiB"


def _enabled(flag: bool) -> str:
    return "Enabled" if flag else "Disabled"


def _mig_mode(h: Any, which: int) -> str:
    mode = pynvml.nvmlDeviceGetMigMode(h)
    return _enabled(mode[which] == pynvml.NVML_DEVICE_MIG_ENABLE)


# field -> (unit or "", getter(handle, index) -> value string)
# nvmlComputeMode_t: the name -c takes, the one --query-gpu=compute_mode prints
_COMPUTE_MODES = {
    0: ("DEFAULT", "Default"),
    1: ("EXCLUSIVE_THREAD", "Exclusive_Thread"),
    2: ("PROHIBITED", "Prohibited"),
    3: ("EXCLUSIVE_PROCESS", "Exclusive_Process"),
}
_FIELDS: dict[str, tuple[str, Callable[[Any, int], str]]] = {
    "index": ("", lambda h, i: str(i)),
    "count": ("", lambda h, i: str(pynvml.nvmlDeviceGetCount())),
    "name": ("", lambda h, i: str(pynvml.nvmlDeviceGetName(h))),
    "uuid": ("", lambda h, i: str(pynvml.nvmlDeviceGetUUID(h))),
    "serial": ("", lambda h, i: str(pynvml.nvmlDeviceGetSerial(h))),
    "pci.bus_id": ("", lambda h, i: str(pynvml.nvmlDeviceGetPciInfo(h).busId)),
    "driver_version": ("", lambda h, i: str(pynvml.nvmlSystemGetDriverVersion())),
    "vbios_version": ("", lambda h, i: str(pynvml.nvmlDeviceGetVbiosVersion(h))),
    "memory.total": ("MiB", lambda h, i: str(int(pynvml.nvmlDeviceGetMemoryInfo(h).total) >> 20)),
    "memory.used": ("MiB", lambda h, i: str(int(pynvml.nvmlDeviceGetMemoryInfo(h).used) >> 20)),
    "memory.free": ("MiB", lambda h, i: str(int(pynvml.nvmlDeviceGetMemoryInfo(h).free) >> 20)),
    "mig.mode.current": ("", lambda h, i: _mig_mode(h, 0)),
    "mig.mode.pending": ("", lambda h, i: _mig_mode(h, 1)),
    "compute_cap": (
        "",
        lambda h, i: "{}.{}".format(*pynvml.nvmlDeviceGetCudaComputeCapability(h)),
    ),
    "persistence_mode": (
        "",
        lambda h, i: _enabled(
            pynvml.nvmlDeviceGetPersistenceMode(h) == pynvml.NVML_FEATURE_ENABLED
        ),
    ),
    "pstate": ("", lambda h, i: f"P{int(pynvml.nvmlDeviceGetPerformanceState(h))}"),
    "compute_mode": ("", lambda h, i: _COMPUTE_MODES[int(pynvml.nvmlDeviceGetComputeMode(h))][1]),
    "temperature.gpu": (
        "",
        lambda h, i: str(pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)),
    ),
    "power.draw": ("W", lambda h, i: f"{pynvml.nvmlDeviceGetPowerUsage(h) / 1000:.2f}"),
    "power.limit": (
        "W",
        lambda h, i: f"{pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000:.2f}",
    ),
    "utilization.gpu": ("%", lambda h, i: str(pynvml.nvmlDeviceGetUtilizationRates(h).gpu)),
    "utilization.memory": ("%", lambda h, i: str(pynvml.nvmlDeviceGetUtilizationRates(h).memory)),
}
_ALIASES = {
    "gpu_name": "name",
    "gpu_uuid": "uuid",
    "gpu_serial": "serial",
    "gpu_bus_id": "pci.bus_id",
    "pstate": "pstate",
}


def set_compute_mode(mode: str, indexes: list[int]) -> tuple[list[str], int]:
    """``-c/--compute-mode``: as NVIDIA's, by number or name, for each GPU of ``-i`` (all
    without it); NVIDIA's mps-control-daemon runs ``nvidia-smi -i <uuid> -c EXCLUSIVE_PROCESS``."""
    value = next((n for n, (name, _) in _COMPUTE_MODES.items()
                  if mode.upper() in (str(n), name)), None)
    if value is None:
        return [f'Invalid compute mode "{mode}".'], 2  # NVIDIA's exact wording not documented
    out = []
    for i in indexes:
        h = _handle(i)
        bus = str(pynvml.nvmlDeviceGetPciInfo(h).busId)
        try:
            pynvml.nvmlDeviceSetComputeMode(h, value)
        except pynvml.NVMLError as e:
            out.append(f"Unable to set compute mode for GPU {bus}: {_err_text(e)}")
            return out, int(e.value)
        out.append(f"Set compute mode to {_COMPUTE_MODES[value][0]} for GPU {bus}.")
    out.append("All done.")
    return out, 0


def query_gpu(fields: list[str], fmt: str, indexes: list[int]) -> tuple[list[str], int]:
    """``--query-gpu`` output lines (csv) and exit status."""
    opts = {o.strip() for o in fmt.split(",")}
    if "csv" not in opts:
        return ["Only CSV output format is supported (--format=csv)."], 2
    names = [_ALIASES.get(f.strip(), f.strip()) for f in fields if f.strip()]
    for f in names:
        if f not in _FIELDS:
            return [f'Field "{f}" is not a valid field to query.'], 2
    nounits = "nounits" in opts
    lines: list[str] = []
    if "noheader" not in opts:
        lines.append(
            ", ".join(
                f"{f} [{_FIELDS[f][0]}]" if _FIELDS[f][0] and not nounits else f for f in names
            )
        )
    status = 0
    for i in indexes:
        try:
            h = _handle(i)
        except _Lost as e:
            lines.append(str(e))
            status = e.code
            continue
        values: list[str] = []
        for f in names:
            unit, getter = _FIELDS[f]
            try:
                v = getter(h, i)
                values.append(f"{v} {unit}" if unit and not nounits else v)
            except pynvml.NVMLError_NotSupported:
                values.append(NA)
            except pynvml.NVMLError as e:
                values.append(f"[{_err_text(e)}]")
        lines.append(", ".join(values))
    return lines, status


# ---- summary table ----
def _cell(text: str, width: int, right: bool = False) -> str:
    text = text[:width]
    return text.rjust(width) if right else text.ljust(width)


W = 89  # inner width of nvidia-smi's table
_SEP = "+" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+"
_HEAD = [
    "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
    "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
    "|                                         |                        |               MIG M. |",
]
_MIG_SEP = "+" + "-" * 18 + "+" + "-" * 34 + "+" + "-" * 11 + "+" + "-" * 23 + "+"
_MIG_HEAD = [
    "| GPU  GI  CI  MIG |                     Memory-Usage |        Vol|      Shared           |",
    "|      ID  ID  Dev |                                  | SM     Unc| CE ENC  DEC  OFA  JPG |",
    "|                  |                                  |        ECC|                       |",
]
_PROC_HEAD = [
    "|  GPU   GI   CI        PID   Type   Process name                              GPU Memory |",
    "|        ID   ID                                                               Usage      |",
]


def _box(text: str) -> str:
    return "|" + _cell(text, W) + "|"


def _gpu_rows(i: int, h: Any) -> list[str]:
    name = str(pynvml.nvmlDeviceGetName(h))
    pers = _try(pynvml.nvmlDeviceGetPersistenceMode, h)
    pers_s = NA if pers is None else ("On" if pers == pynvml.NVML_FEATURE_ENABLED else "Off")
    pci = _try(pynvml.nvmlDeviceGetPciInfo, h)
    bus = str(pci.busId) if pci is not None else NA
    temp = _try(pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU)
    pstate = _try(pynvml.nvmlDeviceGetPerformanceState, h)
    power = _try(pynvml.nvmlDeviceGetPowerUsage, h)
    limit = _try(pynvml.nvmlDeviceGetEnforcedPowerLimit, h)
    mem = _try(pynvml.nvmlDeviceGetMemoryInfo, h)
    util = _try(pynvml.nvmlDeviceGetUtilizationRates, h)
    mig = _try(pynvml.nvmlDeviceGetMigMode, h)
    fan = _try(pynvml.nvmlDeviceGetFanSpeed, h)
    mig_s = NA if mig is None else _enabled(mig[0] == pynvml.NVML_DEVICE_MIG_ENABLE)
    fan_s = "N/A" if fan is None else f"{fan}%"
    temp_s = "N/A" if temp is None else f"{temp}C"
    perf_s = "N/A" if pstate is None else f"P{pstate}"
    pwr_s = "N/A" if power is None or not limit else f"{power // 1000}W / {limit // 1000:>4}W"
    mem_s = "N/A" if mem is None else f"{int(mem.used) >> 20}MiB / {int(mem.total) >> 20:>6}MiB"
    util_s = "N/A" if util is None else f"{util.gpu}%"
    return [
        f"| {i:>3}  {_cell(name, 27)}{pers_s:>6}  | {bus:>18} Off | {'0':>20} |",
        f"| {fan_s:<4} {temp_s:>5}   {perf_s:<4}{pwr_s:>22} | {mem_s:>22} | {util_s:>7}"
        "      Default |",
        f"|{'':41}|{'':24}| {mig_s:>20} |",
        _SEP,
    ]


def _mig_row(gpu: int, m: MigDevice) -> str:
    gi = "-" if m.gi is None else str(m.gi)
    ci = "-" if m.ci is None else str(m.ci)
    mem_s = "N/A"
    if m.memory_total_mib is not None:
        mem_s = f"{m.memory_used_mib}MiB / {m.memory_total_mib}MiB"
    sm = "N/A" if m.sm is None else str(m.sm)
    ce, enc, dec, ofa, jpg = m.engines or (0, 0, 0, 0, 0)
    return (
        f"| {gpu:>2} {gi:>4} {ci:>3} {m.index:>3}  | {mem_s:>32} | {sm:>3}      0| "
        f"{ce:>2} {enc:>3} {dec:>4} {ofa:>4} {jpg:>4} |"
    )


def _proc_row(gpu: int, p: Any) -> str:
    gi = "N/A" if p.gpuInstanceId in (None, 0xFFFFFFFF) else str(p.gpuInstanceId)
    ci = "N/A" if p.computeInstanceId in (None, 0xFFFFFFFF) else str(p.computeInstanceId)
    pname = str(_try(pynvml.nvmlSystemGetProcessName, p.pid, default="N/A"))
    used = "N/A" if p.usedGpuMemory is None else f"{int(p.usedGpuMemory) >> 20}MiB"
    return f"|  {gpu:>3}  {gi:>4} {ci:>4} {p.pid:>10}      C   {_cell(pname, 40)} {used:>10} |"


def summary(indexes: list[int]) -> tuple[list[str], int]:
    """The table ``nvidia-smi`` prints without arguments, and exit status."""
    driver = str(_try(pynvml.nvmlSystemGetDriverVersion, default=NA))
    cuda = _try(pynvml.nvmlSystemGetCudaDriverVersion_v2)
    cuda_s = f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else NA
    lines = [
        time.strftime("%a %b %d %H:%M:%S %Y"),
        "+" + "-" * W + "+",
        _box(f" NVIDIA-SMI {driver:<22}Driver Version: {driver:<15}CUDA Version: {cuda_s}"),
        "|" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "|",
        *_HEAD,
        "|" + "=" * 41 + "+" + "=" * 24 + "+" + "=" * 22 + "|",
    ]
    status = 0
    procs: list[tuple[int, Any]] = []
    migs: list[tuple[int, MigDevice]] = []
    for i in indexes:
        try:
            h = _handle(i)
        except _Lost as e:
            lines += [_box(f" {e}"), _SEP]
            status = e.code
            continue
        lines += _gpu_rows(i, h)
        procs += [(i, p) for p in _try(pynvml.nvmlDeviceGetComputeRunningProcesses, h, default=[])]
        migs += [(i, m) for m in _mig_devices(h)]
    if migs:
        lines += ["", "+" + "-" * W + "+", _box(" MIG devices:"), _MIG_SEP, *_MIG_HEAD]
        lines.append("|" + "=" * 18 + "+" + "=" * 34 + "+" + "=" * 11 + "+" + "=" * 23 + "|")
        for gpu, m in migs:
            lines += [_mig_row(gpu, m), _MIG_SEP]
    lines += ["", "+" + "-" * W + "+", _box(" Processes:"), *_PROC_HEAD, "|" + "=" * W + "|"]
    if not procs:
        lines.append(_box("  No running processes found"))
    lines += [_proc_row(gpu, p) for gpu, p in procs]
    lines.append("+" + "-" * W + "+")
    return lines, status


# ---- topo -m ----
_PCIE_LEVEL = {
    pynvml.NVML_TOPOLOGY_INTERNAL: "PIX", pynvml.NVML_TOPOLOGY_SINGLE: "PIX",
    pynvml.NVML_TOPOLOGY_MULTIPLE: "PXB", pynvml.NVML_TOPOLOGY_HOSTBRIDGE: "PHB",
    pynvml.NVML_TOPOLOGY_NODE: "NODE", pynvml.NVML_TOPOLOGY_SYSTEM: "SYS",
}
_TOPO_LEGEND = [
    "",
    "Legend:",
    "",
    "  X    = Self",
    "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes "
    "(e.g., QPI/UPI)",
    "  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges "
    "within a NUMA node",
    "  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)",
    "  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host "
    "Bridge)",
    "  PIX  = Connection traversing at most a single PCIe bridge",
    "  NV#  = Connection traversing a bonded set of # NVLinks",
]


@dataclass
class _LinkEnds:
    """A GPU's active NVLinks by far end: GPU bus ids, and NVSwitch bus ids."""

    gpus: Counter[str]
    switches: Counter[str]


def _link_ends(h: Any) -> _LinkEnds:
    ends = _LinkEnds(Counter(), Counter())
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        try:
            if pynvml.nvmlDeviceGetNvLinkState(h, link) != pynvml.NVML_FEATURE_ENABLED:
                continue
        except pynvml.NVMLError:
            break  # past the GPU's links, or no NVLink
        bus = _try(pynvml.nvmlDeviceGetNvLinkRemotePciInfo, h, link)
        if bus is None:
            continue
        kind = _try(pynvml.nvmlDeviceGetNvLinkRemoteDeviceType, h, link)
        side = ends.switches if kind == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH else ends.gpus
        side[str(bus.busId)] += 1
    return ends


def _nvlinks(a: _LinkEnds, b: _LinkEnds, b_bus: str) -> int:
    """Links from a to b: direct ones, plus per NVSwitch both reach the fewer of their links."""
    shared = a.switches.keys() & b.switches.keys()
    return a.gpus[b_bus] + sum(min(a.switches[s], b.switches[s]) for s in shared)


def _cpu_list(mask: list[int]) -> str:
    """CPU affinity words (64 CPUs each) -> "0-55,112-167"."""
    cpus = [w * 64 + bit for w, word in enumerate(mask) for bit in range(64) if word >> bit & 1]
    ranges: list[str] = []
    for cpu in cpus:
        if ranges and cpu == int(ranges[-1].split("-")[-1]) + 1:
            ranges[-1] = f"{ranges[-1].split('-')[0]}-{cpu}"
        else:
            ranges.append(str(cpu))
    return ",".join(ranges) or "N/A"


def topology_matrix(indexes: list[int]) -> tuple[list[str], int]:
    """``nvidia-smi topo -m``: NV# where GPUs have NVLinks (directly or through NVSwitches),
    else the PCIe path; CPU and NUMA affinity. Tab-separated, as nvidia-smi prints it."""
    try:
        handles = [_handle(i) for i in indexes]
    except _Lost as e:
        return [str(e)], e.code
    buses = [str(pynvml.nvmlDeviceGetPciInfo(h).busId) for h in handles]
    ends = [_link_ends(h) for h in handles]
    # The header is underlined with ANSI escapes, by the real one too, even into a pipe.
    lines = ["\t\x1b[4m" + "\t".join(f"GPU{i}" for i in indexes)
             + "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m"]
    for r, (i, h) in enumerate(zip(indexes, handles, strict=True)):
        cells = []
        for c, other in enumerate(handles):
            if c == r:
                cells.append(" X ")
                continue
            n = _nvlinks(ends[r], ends[c], buses[c])
            level = _try(pynvml.nvmlDeviceGetTopologyCommonAncestor, h, other)
            cells.append(f"NV{n}" if n else _PCIE_LEVEL.get(level, "N/A"))
        cpus = _cpu_list(list(_try(pynvml.nvmlDeviceGetCpuAffinity, h, 16, default=[])))
        nodes = _try(pynvml.nvmlDeviceGetMemoryAffinity, h, 1, pynvml.NVML_AFFINITY_SCOPE_NODE)
        numa = _cpu_list(list(nodes)) if nodes else "N/A"
        lines.append(f"GPU{i}\t" + "\t".join(cells) + f"\t{cpus}\t{numa}\t\tN/A")
    return lines + _TOPO_LEGEND, 0


def _indexes(arg: str | None) -> list[int]:
    count = int(pynvml.nvmlDeviceGetCount())
    if not arg:
        return list(range(count))
    out = []
    for part in arg.split(","):
        if part.startswith(("GPU-", "MIG-")):  # -i takes UUIDs too
            try:
                h = pynvml.nvmlDeviceGetHandleByUUID(part)
            except pynvml.NVMLError as e:
                raise ValueError(f"No devices were found with UUID {part}") from e
            out.append(int(pynvml.nvmlDeviceGetIndex(h)))
            continue
        i = int(part)
        if not 0 <= i < count:
            raise ValueError(f"No devices were found with index {i}")
        out.append(i)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    topo = bool(argv) and argv[0] == "topo"
    ap = argparse.ArgumentParser(prog="nvidia-smi topo" if topo else "nvidia-smi",
                                 description="nvidia-smi over NVML")
    if topo:
        ap.add_argument("-m", "--matrix", action="store_true", required=True,
                        help="GPU topology matrix")
        argv = argv[1:]
    else:
        ap.add_argument("-L", "--list-gpus", action="store_true", help="list GPUs and MIG devices")
        ap.add_argument("--query-gpu", help="comma-separated fields")
        ap.add_argument("--format", default="csv", help="csv[,noheader][,nounits]")
        ap.add_argument("-c", "--compute-mode", help="set the compute mode (with -i: those GPUs)")
    ap.add_argument("-i", "--id", help="comma-separated GPU indexes")
    args = ap.parse_args(argv)
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        code = int(e.value)
        if code == pynvml.NVML_ERROR_DRIVER_NOT_LOADED:
            print(
                "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                "Make sure that the latest NVIDIA driver is installed and running."
            )
        else:
            print(f"Failed to initialize NVML: {_err_text(e)}")
        return code
    try:
        try:
            indexes = _indexes(args.id)
        except ValueError as bad:
            print(bad)
            return 6
        if topo:
            lines, status = topology_matrix(indexes)
        elif args.compute_mode:
            lines, status = set_compute_mode(args.compute_mode, indexes)
        elif args.query_gpu:
            lines, status = query_gpu(args.query_gpu.split(","), args.format, indexes)
        elif args.list_gpus:
            lines, status = list_gpus(indexes)
        else:
            lines, status = summary(indexes)
        print("\n".join(lines))
        return status
    finally:
        pynvml.nvmlShutdown()


if __name__ == "__main__":
    sys.exit(main())
