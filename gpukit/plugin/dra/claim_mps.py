"""MPS for a prepared claim, as NVIDIA's DRA driver does it: one MPS control daemon per claim
(gpukit.plugin.mps_daemons, key `claim-<uid>`) serving the claim's devices that a GpuConfig or
MigDeviceConfig shares with strategy MPS, set to the config's `mpsConfig` (default active
thread percentage, default and per-device pinned memory limits, per-device keys a device's
UUID or its position among those devices, as NVIDIA's driver normalises them); the claim's
containers get NVIDIA's paths: `CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps` with the daemon's pipe
directory there and the MPS root's shm at /dev/shm. Unlike NVIDIA's driver, this runs with the
health checks on."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpukit.contracts import dra_claim_config as opaque

from ..mps_daemons import DaemonDirs, DaemonSpec

CONTAINER_PIPE = "/tmp/nvidia-mps"
KEY_PREFIX = "claim-"
_BIND = ["rw", "nosuid", "nodev", "bind"]


def claim_key(uid: str) -> str:
    return f"{KEY_PREFIX}{uid}"


@dataclass(frozen=True)
class MpsDevice:
    uuid: str
    whole_gpu: bool  # a MIG device's GPU stays in its compute mode
    request: str
    sharing: opaque.Sharing


def daemon_spec(uid: str, devices: Sequence[MpsDevice]) -> DaemonSpec:
    """The claim's daemon; opaque.ConfigError when its requests ask for different MPS settings
    or a limit NVIDIA's driver would refuse."""
    first = devices[0]
    for d in devices[1:]:
        if d.sharing != first.sharing:
            raise opaque.ConfigError(
                f"requests {first.request} and {d.request} share through MPS with different "
                "mpsConfig; one claim has one MPS daemon (use one config, or two claims)")
    uuids = list(dict.fromkeys(d.uuid for d in devices))
    sharing = first.sharing
    limits: dict[str, str] = {}
    if sharing.pinned_memory_limit:
        value = opaque.quantity_mib("mpsConfig.defaultPinnedDeviceMemoryLimit",
                                    sharing.pinned_memory_limit)
        limits = dict.fromkeys(uuids, value)
    for key, quantity in sharing.per_device_pinned_memory_limit:
        where = f"mpsConfig.defaultPerDevicePinnedMemoryLimit[{key}]"
        if key in uuids:
            uuid = key
        elif key.isdigit() and int(key) < len(uuids):
            uuid = uuids[int(key)]
        else:
            raise opaque.ConfigError(f"{where}: not one of the claim's MPS devices (their "
                                     f"UUIDs, or 0 to {len(uuids) - 1})")
        limits[uuid] = opaque.quantity_mib(where, quantity)
    return DaemonSpec(
        key=claim_key(uid), devices=tuple(uuids),
        exclusive=tuple(dict.fromkeys(d.uuid for d in devices if d.whole_gpu)),
        memory_limits=tuple(limits.items()), thread_percentage=sharing.active_thread_percentage)


def container_edits(root: str, uid: str) -> dict[str, Any]:
    """CDI container edits of an MPS device of the claim."""
    return {
        "env": [f"CUDA_MPS_PIPE_DIRECTORY={CONTAINER_PIPE}"],
        "mounts": [
            {"hostPath": f"{root}/shm", "containerPath": "/dev/shm", "options": list(_BIND)},
            {"hostPath": DaemonDirs(root, claim_key(uid)).pipe, "containerPath": CONTAINER_PIPE,
             "options": list(_BIND)},
        ],
    }
