"""What NVML says on a node, as JSON: run on the node itself (`python3 nvml_probe.py`).

Standard library only (ctypes against `libnvidia-ml.so.1`), so it runs with any python3 on a
node, where pynvml is usually not installed; the suite sends this file over SSH. It reads the GPU
instance profile of every MIG device through nvmlDeviceGetGpuInstanceById/nvmlGpuInstanceGetInfo,
a different path from the device plugin's (MIG device names and attributes): the suite must not
share the code it checks.

Output: {"ok": bool, "error": str, "library": path, "mock": bool, "driver_version": str,
"cuda_driver_version": int, "gpus": [{"index", "uuid", "name", "minor", "memory_mib",
"mig_current", "mig_pending", "migs": [{"uuid", "gi", "ci", "gi_profile_id", "start", "size",
"memory_mib", "caps"}]}]}; caps are the /dev/nvidia-caps minors the driver lists for the MIG
device's GPU and compute instance (/proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<G>/access
and .../ci<C>/access, "DeviceFileMinor: N"), [] where it lists none; gi_profile_id is
nvmlGpuInstanceInfo_t.profileId, the driver's profile id
(`nvidia-smi mig -lgip`'s ID: 19 for an A100's 1g.5gb), not an NVML_GPU_INSTANCE_PROFILE_*
constant. A GPU NVML cannot query (lost: NVML_ERROR_GPU_IS_LOST, or another error) is
{"index", "lost": bool, "error": str} and the GPUs after it are still read, each under its own
index; "ok" then stays true (NVML answers), the GPU's entry carries the failure.
"""

from __future__ import annotations

import ctypes
import json
import sys
from typing import Any

LIBRARY = "libnvidia-ml.so.1"
SUCCESS = 0
NOT_SUPPORTED = 3
NOT_FOUND = 6
GPU_IS_LOST = 15
BUFFER = 96


# nvmlComputeMode_t
COMPUTE_MODES = {0: "DEFAULT", 1: "EXCLUSIVE_THREAD", 2: "PROHIBITED", 3: "EXCLUSIVE_PROCESS"}


class _Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]


class _Placement(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


class _GpuInstanceInfo(ctypes.Structure):
    _fields_ = [("device", ctypes.c_void_p), ("id", ctypes.c_uint), ("profileId", ctypes.c_uint),
                ("placement", _Placement)]


class NvmlFailure(RuntimeError):
    def __init__(self, message: str, rc: int = -1) -> None:
        super().__init__(message)
        self.rc = rc


class Nvml:
    def __init__(self, library: str = LIBRARY) -> None:
        self.lib = ctypes.CDLL(library)
        self.lib.nvmlErrorString.restype = ctypes.c_char_p

    def call(self, name: str, *args: Any) -> int:
        rc = int(getattr(self.lib, name)(*args))
        if rc != SUCCESS:
            text = self.lib.nvmlErrorString(rc)
            raise NvmlFailure(f"{name}: {text.decode() if text else rc} ({rc})", rc)
        return rc

    def try_call(self, name: str, *args: Any) -> int:
        return int(getattr(self.lib, name)(*args))

    def text(self, name: str, handle: Any) -> str:
        buf = ctypes.create_string_buffer(BUFFER)
        self.call(name, handle, buf, ctypes.c_uint(BUFFER))
        return buf.value.decode(errors="replace")

    def uint(self, name: str, *args: Any) -> int:
        out = ctypes.c_uint()
        self.call(name, *args, ctypes.byref(out))
        return out.value

    def memory_mib(self, handle: Any) -> int:
        mem = _Memory()
        self.call("nvmlDeviceGetMemoryInfo", handle, ctypes.byref(mem))
        return int(mem.total // (1024 * 1024))


def _loaded_library() -> str:
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                if "libnvidia-ml" in line:
                    return line.split()[-1]
    except OSError:
        pass
    return ""


CAPABILITIES = "/proc/driver/nvidia/capabilities"


def _cap_minor(path: str) -> int | None:
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "DeviceFileMinor" and value.strip().isdigit():
                    return int(value)
    except OSError:
        pass
    return None


def _mig_caps(gpu_minor: int, gi: int, ci: int) -> list[int]:
    base = f"{CAPABILITIES}/gpu{gpu_minor}/mig/gi{gi}"
    found = (_cap_minor(f"{base}/access"), _cap_minor(f"{base}/ci{ci}/access"))
    return [m for m in found if m is not None]


def _mig_devices(nvml: Nvml, handle: Any, gpu_minor: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    slots = nvml.uint("nvmlDeviceGetMaxMigDeviceCount", handle)
    for slot in range(slots):
        mig = ctypes.c_void_p()
        rc = nvml.try_call("nvmlDeviceGetMigDeviceHandleByIndex", handle, ctypes.c_uint(slot),
                           ctypes.byref(mig))
        if rc == NOT_FOUND:
            continue
        if rc != SUCCESS:
            raise NvmlFailure(f"nvmlDeviceGetMigDeviceHandleByIndex({slot}): error {rc}", rc)
        gi_id = nvml.uint("nvmlDeviceGetGpuInstanceId", mig)
        ci_id = nvml.uint("nvmlDeviceGetComputeInstanceId", mig)
        gi = ctypes.c_void_p()
        nvml.call("nvmlDeviceGetGpuInstanceById", handle, ctypes.c_uint(gi_id), ctypes.byref(gi))
        info = _GpuInstanceInfo()
        nvml.call("nvmlGpuInstanceGetInfo", gi, ctypes.byref(info))
        out.append({
            "uuid": nvml.text("nvmlDeviceGetUUID", mig), "gi": gi_id, "ci": ci_id,
            "gi_profile_id": int(info.profileId), "start": int(info.placement.start),
            "size": int(info.placement.size), "memory_mib": nvml.memory_mib(mig),
            "caps": _mig_caps(gpu_minor, gi_id, ci_id),
        })
    return out


def _gpu(nvml: Nvml, index: int) -> dict[str, Any]:
    handle = ctypes.c_void_p()
    nvml.call("nvmlDeviceGetHandleByIndex_v2", ctypes.c_uint(index), ctypes.byref(handle))
    gpu: dict[str, Any] = {
        "index": index,
        "uuid": nvml.text("nvmlDeviceGetUUID", handle),
        "name": nvml.text("nvmlDeviceGetName", handle),
        "minor": nvml.uint("nvmlDeviceGetMinorNumber", handle),
        "memory_mib": nvml.memory_mib(handle),
        "mig_current": None, "mig_pending": None, "migs": [],
    }
    mode = ctypes.c_uint()  # MPS: EXCLUSIVE_PROCESS while a daemon serves the GPU
    if nvml.try_call("nvmlDeviceGetComputeMode", handle, ctypes.byref(mode)) == SUCCESS:
        gpu["compute_mode"] = COMPUTE_MODES.get(mode.value, str(mode.value))
    cur, pend = ctypes.c_uint(), ctypes.c_uint()
    rc = nvml.try_call("nvmlDeviceGetMigMode", handle, ctypes.byref(cur), ctypes.byref(pend))
    if rc == SUCCESS:
        gpu["mig_current"], gpu["mig_pending"] = bool(cur.value), bool(pend.value)
        if cur.value:
            gpu["migs"] = _mig_devices(nvml, handle, gpu["minor"])
    elif rc != NOT_SUPPORTED:
        raise NvmlFailure(f"nvmlDeviceGetMigMode(GPU {index}): error {rc}", rc)
    return gpu


def probe(library: str = LIBRARY) -> dict[str, Any]:
    result: dict[str, Any] = {"ok": False, "error": "", "library": "", "mock": False,
                              "driver_version": "", "cuda_driver_version": 0, "gpus": []}
    try:
        nvml = Nvml(library)
    except OSError as exc:
        result["error"] = f"cannot load {library}: {exc}"
        return result
    result["mock"] = hasattr(nvml.lib, "gpukitMockStatusJson")
    try:
        nvml.call("nvmlInit_v2")
    except NvmlFailure as exc:
        result["error"] = str(exc)
        return result
    result["library"] = _loaded_library()
    try:
        buf = ctypes.create_string_buffer(80)
        nvml.call("nvmlSystemGetDriverVersion", buf, ctypes.c_uint(80))
        result["driver_version"] = buf.value.decode()
        cuda = ctypes.c_int()
        if nvml.try_call("nvmlSystemGetCudaDriverVersion", ctypes.byref(cuda)) == SUCCESS:
            result["cuda_driver_version"] = cuda.value
        for index in range(nvml.uint("nvmlDeviceGetCount_v2")):
            try:
                result["gpus"].append(_gpu(nvml, index))
            except NvmlFailure as exc:
                # One GPU's failure is that GPU's: the next index is the next GPU, as NVML
                # numbers them (stopping here reported every later GPU as absent).
                result["gpus"].append({"index": index, "lost": exc.rc == GPU_IS_LOST,
                                       "error": str(exc)})
        result["ok"] = True
    except NvmlFailure as exc:
        result["error"] = str(exc)
    finally:
        nvml.try_call("nvmlShutdown")
    return result


if __name__ == "__main__":
    json.dump(probe(sys.argv[1] if len(sys.argv) > 1 else LIBRARY), sys.stdout)
    sys.stdout.write("\n")
