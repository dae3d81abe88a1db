"""GPU discovery through pynvml: real libnvidia-ml.so.1 or the lab's mock.

Optional facts a GPU may not support (NUMA node, NVLink, MIG, topology) fall back to "unknown"
on NVML_ERROR_NOT_SUPPORTED instead of failing discovery, like the real plugin on older GPUs.
"""

from __future__ import annotations

import ctypes
import logging
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pynvml

from gpukit.contracts import gpu_architectures

from ..devices import Fabric, Gpu, Link, MigDevice, NodeDevices, mig_memory_gb, profile_name
from .calls import NvmlError, _text, call, normalize_bus_id, optional

log = logging.getLogger(__name__)

# nvmlDeviceGetBrand as NVIDIA's tools spell it (go-nvlib's GetBrandAsString, what NVIDIA's DRA
# driver publishes as `brand`); a code this table lacks is left out, not guessed.
_BRANDS = {
    0: "Unknown", 1: "Quadro", 2: "Tesla", 3: "NVS", 4: "Grid", 5: "GeForce", 6: "Titan",
    7: "NvidiaVApps", 8: "NvidiaVPC", 9: "NvidiaVCS", 10: "NvidiaVWS", 11: "NvidiaCloudGaming",
    12: "QuadroRTX", 13: "NvidiaRTX", 14: "Nvidia", 15: "GeForceRTX", 16: "TitanRTX",
}
_MIG_NAME = re.compile(r"\bMIG\s+(\S+)\s*$")

def discover(with_topology: bool = True) -> NodeDevices:
    """Enumerate GPUs and MIG devices. A GPU that NVML reports lost is left out and its index
    recorded in `lost_indices`; any other failure raises NvmlError."""
    count = call("nvmlDeviceGetCount", pynvml.nvmlDeviceGetCount)
    gpus: list[Gpu] = []
    handles: dict[str, Any] = {}
    lost: list[int] = []
    for index in range(count):
        try:
            handle = call("nvmlDeviceGetHandleByIndex", pynvml.nvmlDeviceGetHandleByIndex, index,
                          subject=f"GPU {index}")
            gpu = _describe_gpu(index, handle)
        except NvmlError as exc:
            if exc.gpu_lost:
                log.warning("GPU %d is lost: %s", index, exc)
                lost.append(index)
                continue
            raise
        gpus.append(gpu)
        handles[gpu.uuid] = handle
    driver = _text(optional("nvmlSystemGetDriverVersion", pynvml.nvmlSystemGetDriverVersion,
                            default=""))
    cuda = optional("nvmlSystemGetCudaDriverVersion", pynvml.nvmlSystemGetCudaDriverVersion,
                    default=0)
    links = _links(gpus, handles) if with_topology else {}
    return NodeDevices(
        gpus=tuple(gpus), driver_version=driver, cuda_driver_version=int(cuda), links=links,
        lost_indices=tuple(lost),
    )


def _describe_gpu(index: int, handle: Any) -> Gpu:
    subject = f"GPU {index}"
    uuid = _text(call("nvmlDeviceGetUUID", pynvml.nvmlDeviceGetUUID, handle, subject=subject))
    subject = f"GPU {index} ({uuid})"
    name = _text(call("nvmlDeviceGetName", pynvml.nvmlDeviceGetName, handle, subject=subject))
    minor = call("nvmlDeviceGetMinorNumber", pynvml.nvmlDeviceGetMinorNumber, handle,
                 subject=subject)
    mem = call("nvmlDeviceGetMemoryInfo", pynvml.nvmlDeviceGetMemoryInfo, handle, subject=subject)
    pci = optional("nvmlDeviceGetPciInfo", pynvml.nvmlDeviceGetPciInfo, handle, default=None,
                   subject=subject)
    bus_id = normalize_bus_id(_text(pci.busId)) if pci is not None else ""
    numa = optional("nvmlDeviceGetNumaNodeId", pynvml.nvmlDeviceGetNumaNodeId, handle,
                    default=-1, subject=subject)
    major, minor_cc = optional(
        "nvmlDeviceGetCudaComputeCapability", pynvml.nvmlDeviceGetCudaComputeCapability, handle,
        default=(0, 0), subject=subject,
    )
    arch = optional("nvmlDeviceGetArchitecture", pynvml.nvmlDeviceGetArchitecture, handle,
                    default=-1, subject=subject)
    brand = optional("nvmlDeviceGetBrand", pynvml.nvmlDeviceGetBrand, handle, default=-1,
                     subject=subject)
    current_mode, _pending = optional(
        "nvmlDeviceGetMigMode", pynvml.nvmlDeviceGetMigMode, handle, default=(-1, -1),
        subject=subject,
    )
    mig_capable = current_mode != -1
    mig_enabled = current_mode == pynvml.NVML_DEVICE_MIG_ENABLE
    migs = _mig_devices(index, uuid, handle, int(mem.total)) if mig_enabled else ()
    fabric = _fabric(handle, subject)
    return Gpu(
        index=index, uuid=uuid, minor=int(minor), name=name,
        memory_mb=int(mem.total) // (1024 * 1024), pci_bus_id=bus_id,
        numa_node=int(numa) if numa is not None and numa >= 0 else None,
        compute_major=int(major), compute_minor=int(minor_cc),
        architecture=gpu_architectures.from_nvml(int(arch)), brand=_BRANDS.get(int(brand), ""),
        mig_capable=mig_capable,
        mig_enabled=mig_enabled, mig_devices=migs, fabric=fabric,
    )


def _fabric_info(handle: Any) -> Any:
    """nvmlDeviceGetGpuFabricInfo (the v1 struct, the call GFD and NVIDIA's DRA driver make);
    a library without it (deprecated since CUDA 13) is asked the versioned call with v2."""
    try:
        info = pynvml.c_nvmlGpuFabricInfo_t()
        pynvml.nvmlDeviceGetGpuFabricInfo(handle, ctypes.byref(info))
        return info
    except pynvml.NVMLError as exc:
        if exc.value != pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
            raise
    info = pynvml.c_nvmlGpuFabricInfo_v2_t()
    pynvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
    return info


def _fabric(handle: Any, subject: str) -> Fabric | None:
    """The GPU's NVLink fabric registration; None where the GPU or driver has no fabric
    (NOT_SUPPORTED, as every GPU outside a multi-node NVLink system answers) or the call fails
    otherwise (logged: GFD would stop labelling the node; gpukit only leaves the clique out)."""
    try:
        info = optional("nvmlDeviceGetGpuFabricInfo", _fabric_info, handle, default=None,
                        subject=subject)
    except NvmlError as exc:
        if exc.gpu_lost:
            raise
        log.warning("%s: no NVLink fabric information: %s", subject, exc)
        return None
    if info is None:
        return None
    raw = bytes(info.clusterUuid).hex()
    cluster = f"{raw[:8]}-{raw[8:12]}-{raw[12:16]}-{raw[16:20]}-{raw[20:]}"
    return Fabric(cluster_uuid=cluster, clique_id=int(info.cliqueId), state=int(info.state),
                  status=int(info.status))


def _mig_devices(index: int, parent_uuid: str, handle: Any, total_bytes: int
                 ) -> tuple[MigDevice, ...]:
    subject = f"GPU {index} ({parent_uuid})"
    slots = call("nvmlDeviceGetMaxMigDeviceCount", pynvml.nvmlDeviceGetMaxMigDeviceCount, handle,
                 subject=subject)
    out: list[MigDevice] = []
    for slot in range(int(slots)):
        mig = optional("nvmlDeviceGetMigDeviceHandleByIndex",
                       pynvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, slot, default=None,
                       subject=subject)
        if mig is None:
            continue
        out.append(_describe_mig(index, parent_uuid, len(out), mig, total_bytes))
    return tuple(out)


def _describe_mig(parent_index: int, parent_uuid: str, position: int, mig: Any,
                  total_bytes: int) -> MigDevice:
    subject = f"MIG device {parent_index}:{position}"
    uuid = _text(call("nvmlDeviceGetUUID", pynvml.nvmlDeviceGetUUID, mig, subject=subject))
    subject = f"MIG device {parent_index}:{position} ({uuid})"
    gi = call("nvmlDeviceGetGpuInstanceId", pynvml.nvmlDeviceGetGpuInstanceId, mig,
              subject=subject)
    ci = call("nvmlDeviceGetComputeInstanceId", pynvml.nvmlDeviceGetComputeInstanceId, mig,
              subject=subject)
    attrs = call("nvmlDeviceGetAttributes", pynvml.nvmlDeviceGetAttributes, mig, subject=subject)
    name = _text(optional("nvmlDeviceGetName", pynvml.nvmlDeviceGetName, mig, default="",
                          subject=subject))
    memory_mb = int(attrs.memorySizeMB)
    # The driver names MIG devices "<product> MIG 3g.20gb": that is the profile string users
    # know (including "+me"). Compute it from the attributes only when the name lacks it.
    m = _MIG_NAME.search(name)
    profile = m.group(1) if m else profile_name(
        int(attrs.gpuInstanceSliceCount), int(attrs.computeInstanceSliceCount),
        mig_memory_gb(total_bytes, memory_mb),
    )
    return MigDevice(
        uuid=uuid, parent_uuid=parent_uuid, parent_index=parent_index, index=position,
        gi=int(gi), ci=int(ci), profile=profile, memory_mb=memory_mb,
        multiprocessors=int(attrs.multiprocessorCount),
        slices_gi=int(attrs.gpuInstanceSliceCount), slices_ci=int(attrs.computeInstanceSliceCount),
        engines_copy=int(attrs.sharedCopyEngineCount),
        engines_decoder=int(attrs.sharedDecoderCount),
        engines_encoder=int(attrs.sharedEncoderCount),
        engines_jpeg=int(attrs.sharedJpegCount), engines_ofa=int(attrs.sharedOfaCount),
    )


def _links(gpus: list[Gpu], handles: dict[str, Any]) -> dict[frozenset[str], Link]:
    by_bus = {g.pci_bus_id: g.uuid for g in gpus if g.pci_bus_id}
    ends = {gpu.uuid: _nvlink_ends(gpu, handles[gpu.uuid], by_bus) for gpu in gpus}
    links: dict[frozenset[str], Link] = {}
    for i, a in enumerate(gpus):
        for b in gpus[i + 1:]:
            level = optional(
                "nvmlDeviceGetTopologyCommonAncestor", pynvml.nvmlDeviceGetTopologyCommonAncestor,
                handles[a.uuid], handles[b.uuid], default=None,
                subject=f"GPUs {a.index} and {b.index}",
            )
            links[frozenset((a.uuid, b.uuid))] = Link(
                nvlinks=_nvlinks_between(ends[a.uuid], ends[b.uuid], a.uuid, b.uuid),
                ancestor=int(level) if level is not None else None)
    return links


@dataclass
class _NvlinkEnds:
    """Where a GPU's active NVLinks go: link counts by peer GPU (UUID) and by NVSwitch (bus id)."""

    gpus: Counter[str] = field(default_factory=Counter)
    switches: Counter[str] = field(default_factory=Counter)


def _nvlinks_between(a: _NvlinkEnds, b: _NvlinkEnds, a_uuid: str, b_uuid: str) -> int:
    """NVLinks joining two GPUs, as nvidia-smi topo -m counts them (NV12 for every pair of a
    DGX A100, NV18 of a DGX H100): direct links (each seen from both ends, counted once), plus,
    per NVSwitch both reach, the fewer of their links to it (a switch forwards between any two
    of its GPUs at the narrower side's width)."""
    direct = (a.gpus[b_uuid] + b.gpus[a_uuid]) // 2
    shared = a.switches.keys() & b.switches.keys()
    return direct + sum(min(a.switches[s], b.switches[s]) for s in shared)


def _nvlink_ends(gpu: Gpu, handle: Any, by_bus: dict[str, str]) -> _NvlinkEnds:
    ends = _NvlinkEnds()
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        subject = f"GPU {gpu.index} link {link}"
        state = optional("nvmlDeviceGetNvLinkState", pynvml.nvmlDeviceGetNvLinkState, handle,
                         link, default=None, subject=subject)
        if state is None:
            break  # no more links (or no NVLink at all)
        if state != pynvml.NVML_FEATURE_ENABLED:
            continue
        remote = optional("nvmlDeviceGetNvLinkRemotePciInfo",
                          pynvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link, default=None,
                          subject=subject)
        if remote is None:
            continue
        bus = normalize_bus_id(_text(remote.busId))
        # A driver without the call (older than NVSwitch support) leaves None: only links whose
        # far end is a GPU of this node then count.
        kind = optional("nvmlDeviceGetNvLinkRemoteDeviceType",
                        pynvml.nvmlDeviceGetNvLinkRemoteDeviceType, handle, link, default=None,
                        subject=subject)
        peer = by_bus.get(bus)
        if kind == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH:
            ends.switches[bus] += 1
        elif peer and peer != gpu.uuid:
            ends.gpus[peer] += 1
    return ends


def mig_mode(index: int) -> tuple[int | None, int | None]:
    """(current, pending) MIG mode of GPU `index`; (None, None) where NVML cannot say."""
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        current, pending = pynvml.nvmlDeviceGetMigMode(handle)
    except pynvml.NVMLError:
        return None, None
    return int(current), int(pending)


def gpu_minors() -> dict[int, int]:
    """Minor number (/dev/nvidia<minor>) -> NVML index of every GPU (NVML initialised)."""
    count = call("nvmlDeviceGetCount", pynvml.nvmlDeviceGetCount)
    out: dict[int, int] = {}
    for index in range(count):
        h = call("nvmlDeviceGetHandleByIndex", pynvml.nvmlDeviceGetHandleByIndex, index,
                 subject=f"GPU {index}")
        minor = call("nvmlDeviceGetMinorNumber", pynvml.nvmlDeviceGetMinorNumber, h,
                     subject=f"GPU {index}")
        out[int(minor)] = index
    return out
