"""MPS sharing: each shared GPU's share of memory and threads, and what a container gets.

One MPS control daemon per shared GPU (gpukit.plugin.mps_daemons), restricted to that GPU with
CUDA_VISIBLE_DEVICES, so a container's pipe directory reaches its own GPU's server and no other
(NVIDIA's plugin runs one daemon per resource over all of its GPUs). Host layout under
`flags.mpsRoot` (NVIDIA's default /run/nvidia/mps):

    <root>/<gpu uuid>/pipe   the daemon's pipe directory, mounted at /mps/<resource>/pipe
    <root>/<gpu uuid>/log    its log directory (control.log, server.log)
    <root>/shm               shared memory of the servers and their clients, at /dev/shm

The container paths are NVIDIA's (`/mps/<resource>/pipe`, /dev/shm), so pods written for
NVIDIA's plugin find the same environment. Each replica is an equal share of its GPU unless the
config says otherwise: memory total/replicas (MiB, rounded down, as NVIDIA computes it) and
100/replicas percent of the threads; the daemon enforces them as defaults and the container's
environment states them too (a client may lower, never raise, what the daemon sets).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from .devices import Gpu
from .mps_daemons import DaemonDirs, DaemonSpec
from .resources import PluginDevice, ResourceSet

CONTAINER_ROOT = "/mps"
PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
MEMORY_LIMIT_ENV = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
THREADS_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
CONTAINER_SHM = "/dev/shm"


class MpsRequestError(ValueError):
    """A request MPS cannot serve; the allocator answers it as an invalid request."""


@dataclass(frozen=True)
class MpsAnswer:
    envs: dict[str, str]
    mounts: tuple[tuple[str, str], ...]  # (container path, host path)


@dataclass(frozen=True)
class GpuShare:
    """One MPS-shared GPU: its replicas and each replica's limits."""

    gpu: Gpu
    resource: str
    replicas: int

    @property
    def memory_limit_mb(self) -> int:
        return self.gpu.memory_mb // self.replicas

    @property
    def thread_percentage(self) -> int:
        return max(1, 100 // self.replicas)

    def daemon(self) -> DaemonSpec:
        """Its daemon: this GPU only (limits by UUID, as NVIDIA's DRA driver sets them)."""
        uuid = self.gpu.uuid
        return DaemonSpec(key=uuid, devices=(uuid,), exclusive=(uuid,),
                          memory_limits=((uuid, f"{self.memory_limit_mb}M"),),
                          thread_percentage=self.thread_percentage)


@dataclass(frozen=True)
class MpsLayout:
    root: str
    shares: dict[str, GpuShare]  # GPU UUID -> share

    def pipe_dir(self, uuid: str) -> str:
        return DaemonDirs(self.root, uuid).pipe

    def daemons(self) -> dict[str, DaemonSpec]:
        return {uuid: share.daemon() for uuid, share in self.shares.items()}

    @property
    def shm_dir(self) -> str:
        return os.path.join(self.root, "shm")


def container_pipe_dir(resource: str) -> str:
    return f"{CONTAINER_ROOT}/{resource}/pipe"


def mps_layout(resources: ResourceSet, root: str) -> MpsLayout:
    """The GPUs whose replicas are served through MPS (every replicated device, when the
    config's sharing is MPS: build_resources refused MIG devices already)."""
    counts: Counter[tuple[str, str]] = Counter()
    gpus: dict[str, Gpu] = {}
    for res in resources.resources.values():
        for dev in res.devices:
            if dev.is_replica:
                counts[(dev.unit.gpu.uuid, res.name)] += 1
                gpus[dev.unit.gpu.uuid] = dev.unit.gpu
    shares = {uuid: GpuShare(gpus[uuid], resource, n) for (uuid, resource), n in counts.items()}
    return MpsLayout(root=root, shares=dict(sorted(shares.items())))


def mps_answer(layout: MpsLayout, resource: str, devices: Sequence[PluginDevice]
               ) -> MpsAnswer | None:
    """Point a container's replicas at their GPU's MPS daemon, with the share's limits; None
    when it holds no replica (a GPU of the resource that is not shared)."""
    gpus = {d.unit.gpu.uuid for d in devices if d.is_replica}
    if not gpus:
        return None
    if len(gpus) > 1:
        raise MpsRequestError(
            f"MPS replicas of {len(gpus)} GPUs in one container (an MPS client reaches one "
            "GPU's daemon; request replicas of one GPU)"
        )
    uuid = gpus.pop()
    share = layout.shares.get(uuid)
    if share is None:
        raise MpsRequestError(f"GPU {uuid} is not shared through MPS")
    # A container holding k replicas of one GPU holds k shares of it.
    k = sum(1 for d in devices if d.is_replica)
    pipe = container_pipe_dir(resource)
    return MpsAnswer(
        envs={
            PIPE_ENV: pipe,
            MEMORY_LIMIT_ENV: f"0={share.memory_limit_mb * k}M",
            THREADS_ENV: str(min(100, share.thread_percentage * k)),
        },
        mounts=((pipe, layout.pipe_dir(uuid)), (CONTAINER_SHM, layout.shm_dir)),
    )
