"""Which container holds which device: the kubelet's PodResources API (v1 List), read on the node.

The kubelet serves it on `<kubelet root>/pod-resources/kubelet.sock` (beside the device-plugins
directory); the agent's pod mounts that directory read-only. Answers are cached for
`ttl` seconds, so a scrape costs at most one List per interval; a failed List keeps the last
answer (marked stale) instead of failing the scrape.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc

from gpukit.contracts.dra import DRIVER as DRA_DRIVER
from gpukit.contracts.label_names import RESOURCE_PREFIX

from .api import podresources_grpc, podresources_pb2

log = logging.getLogger(__name__)
SOCKET_NAME = "kubelet.sock"
DEFAULT_TTL = 5.0
TIMEOUT = 5.0


@dataclass(frozen=True)
class Holder:
    """A container that was given a device ID of an `nvidia.com/...` resource, or a device of
    a DRA claim allocated by NVIDIA's driver name (resource `gpu.nvidia.com`, the device's
    name in its ResourceSlice, e.g. `gpu-3`)."""

    pod: str
    namespace: str
    container: str
    resource: str
    device_id: str


def socket_path(device_plugins_dir: str) -> str:
    """The PodResources socket beside the kubelet's device-plugins directory."""
    return os.path.join(os.path.dirname(device_plugins_dir.rstrip("/")), "pod-resources",
                        SOCKET_NAME)


def list_holders(socket: str, timeout: float = TIMEOUT) -> list[Holder]:
    """One List call: every container's NVIDIA device IDs."""
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        stub = podresources_grpc.PodResourcesListerStub(channel)
        answer = stub.List(podresources_pb2.ListPodResourcesRequest(), timeout=timeout)
    return holders_of(answer)


def holders_of(answer: podresources_pb2.ListPodResourcesResponse) -> list[Holder]:
    out: list[Holder] = []
    for pod in answer.pod_resources:
        for container in pod.containers:
            for devices in container.devices:
                if not devices.resource_name.startswith(RESOURCE_PREFIX):
                    continue
                out.extend(Holder(pod.name, pod.namespace, container.name,
                                  devices.resource_name, device_id)
                           for device_id in devices.device_ids)
            for claim in container.dynamic_resources:
                out.extend(Holder(pod.name, pod.namespace, container.name, DRA_DRIVER,
                                  device.device_name)
                           for device in claim.claim_resources
                           if device.driver_name == DRA_DRIVER)
    return out


Lister = Callable[[], Sequence[Holder]]


class PodResourcesCache:
    """`holders()`: the last List answer, at most `ttl` seconds old (thread-safe)."""

    def __init__(self, lister: Lister, ttl: float = DEFAULT_TTL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.lister, self.ttl, self.clock = lister, ttl, clock
        self._lock = threading.Lock()
        self._holders: tuple[Holder, ...] = ()
        self._at: float | None = None
        self.error = ""  # why the last List failed; "" when it answered

    def holders(self) -> tuple[Holder, ...]:
        with self._lock:
            now = self.clock()
            if self._at is not None and now - self._at < self.ttl:
                return self._holders
            self._at = now
            try:
                self._holders = tuple(self.lister())
                self.error = ""
            except (grpc.RpcError, OSError) as exc:
                detail = exc.details() if isinstance(exc, grpc.Call) else str(exc)
                if detail != self.error:
                    log.warning("kubelet PodResources List failed (series keep the last "
                                "answer's pods): %s", detail)
                self.error = str(detail)
            return self._holders
