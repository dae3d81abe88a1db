"""The gRPC side: one DevicePlugin server per resource on its own unix socket, and Register.

`ResourceState` is the live view of one resource (devices with health, the allocator); the
manager replaces it on health or layout changes and every open ListAndWatch stream sends the
new list. The server only translates between protobuf and the plain-data modules.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc

from .allocate import AllocationError, Allocator, ContainerAllocation
from .api import API_VERSION, HEALTHY, UNHEALTHY, deviceplugin_grpc, deviceplugin_pb2
from .devices import NodeDevices
from .metrics import PluginMetrics
from .preferred import preferred
from .resources import Resource

log = logging.getLogger(__name__)
pb = deviceplugin_pb2
_umask_lock = threading.Lock()
# An idle ListAndWatch sleeps until its devices change or its RPC ends (both notify); this
# is only a guard, so an idle agent does not wake once a second per stream.
STREAM_GUARD_SECONDS = 30.0


@dataclass(frozen=True)
class DeviceView:
    """What ListAndWatch says about one device."""

    id: str
    healthy: bool
    numa_node: int | None


class ResourceState:
    """Devices, health and allocation logic of one resource, swapped atomically on change."""

    def __init__(self, resource: Resource, allocator: Allocator, devices: NodeDevices,
                 views: Sequence[DeviceView], replica_policy: str) -> None:
        self._cond = threading.Condition()
        self._version = 0
        self._closed = False
        self.resource = resource
        self.allocator = allocator
        self.devices = devices
        self.views: tuple[DeviceView, ...] = tuple(views)
        self.replica_policy = replica_policy
        self._streams = 0
        self._streams_changed = time.monotonic()

    @property
    def name(self) -> str:
        return self.resource.name

    def update(self, resource: Resource, allocator: Allocator, devices: NodeDevices,
               views: Sequence[DeviceView], replica_policy: str) -> bool:
        """Swap in new devices; wakes ListAndWatch streams only if what they report changed."""
        with self._cond:
            self.resource, self.allocator, self.devices = resource, allocator, devices
            self.replica_policy = replica_policy
            new = tuple(views)
            if new == self.views:
                return False
            self.views = new
            self._version += 1
            self._cond.notify_all()
            return True

    def snapshot(self) -> tuple[int, tuple[DeviceView, ...]]:
        with self._cond:
            return self._version, self.views

    def wait_change(self, version: int, timeout: float,
                    ended: Callable[[], bool] = lambda: False
                    ) -> tuple[int, tuple[DeviceView, ...]]:
        """Until the views change, the state closes, `ended()` (checked whenever the condition
        is notified: `stream_closed` notifies) or `timeout`."""
        with self._cond:
            self._cond.wait_for(
                lambda: self._version != version or self._closed or ended(), timeout)
            return self._version, self.views

    def stream_opened(self) -> None:
        with self._cond:
            self._streams += 1
            self._streams_changed = time.monotonic()

    def stream_closed(self) -> None:
        with self._cond:
            self._streams -= 1
            self._streams_changed = time.monotonic()
            self._cond.notify_all()  # the ended stream's ListAndWatch returns now

    def streamless_since(self) -> float | None:
        """Since when (monotonic) no ListAndWatch stream is open; None while one is."""
        with self._cond:
            return None if self._streams else self._streams_changed

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed


def list_response(views: Sequence[DeviceView]) -> Any:
    devices = []
    for v in views:
        topology = (
            pb.TopologyInfo(nodes=[pb.NUMANode(ID=v.numa_node)])
            if v.numa_node is not None else None
        )
        devices.append(pb.Device(ID=v.id, health=HEALTHY if v.healthy else UNHEALTHY,
                                 topology=topology))
    return pb.ListAndWatchResponse(devices=devices)


def allocation_to_pb(a: ContainerAllocation) -> Any:
    return pb.ContainerAllocateResponse(
        envs=a.envs,
        mounts=[pb.Mount(container_path=m.container_path, host_path=m.host_path,
                         read_only=m.read_only) for m in a.mounts],
        devices=[pb.DeviceSpec(container_path=d.container_path, host_path=d.host_path,
                               permissions=d.permissions) for d in a.devices],
        annotations=a.annotations,
        cdi_devices=[pb.CDIDevice(name=n) for n in a.cdi_devices],
    )


class DevicePluginService:
    """Implements the DevicePlugin gRPC service for one ResourceState."""

    def __init__(self, state: ResourceState, metrics: PluginMetrics | None = None,
                 stream_poll: float = STREAM_GUARD_SECONDS) -> None:
        self.state = state
        self.metrics = metrics
        self.stream_poll = stream_poll

    def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
        return pb.DevicePluginOptions(pre_start_required=False,
                                      get_preferred_allocation_available=True)

    def ListAndWatch(self, request: Any, context: Any) -> Iterator[Any]:
        version, views = self.state.snapshot()
        log.info("ListAndWatch(%s): %d devices", self.state.name, len(views))
        # Counted until the RPC ends, however it ends (the manager re-registers a resource
        # whose stream the kubelet dropped).
        self.state.stream_opened()
        ended = threading.Event()

        def closed() -> None:
            ended.set()
            self.state.stream_closed()

        if not context.add_callback(closed):
            closed()
        yield self._sent(views, "first")
        while context.is_active() and not self.state.closed and not ended.is_set():
            new_version, views = self.state.wait_change(version, self.stream_poll, ended.is_set)
            if new_version != version:
                version = new_version
                log.info("ListAndWatch(%s): update, %d devices, %d unhealthy", self.state.name,
                         len(views), sum(not v.healthy for v in views))
                yield self._sent(views, "change")

    def _sent(self, views: Sequence[DeviceView], reason: str) -> Any:
        if self.metrics:
            self.metrics.device_lists.labels(resource=self.state.name, reason=reason).inc()
        return list_response(views)

    def GetPreferredAllocation(self, request: Any, context: Any) -> Any:
        state = self.state
        responses = [
            pb.ContainerPreferredAllocationResponse(deviceIDs=preferred(
                state.resource, state.devices, list(r.available_deviceIDs),
                list(r.must_include_deviceIDs), int(r.allocation_size), state.replica_policy,
            ))
            for r in request.container_requests
        ]
        return pb.PreferredAllocationResponse(container_responses=responses)

    def Allocate(self, request: Any, context: Any) -> Any:
        allocator = self.state.allocator
        name = self.state.name
        try:
            responses = [allocation_to_pb(allocator.allocate(list(r.devices_ids)))
                         for r in request.container_requests]
        except AllocationError as exc:
            log.warning("Allocate(%s) refused: %s", name, exc)
            if self.metrics:
                self.metrics.allocations.labels(resource=name, result="refused").inc()
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise  # abort raises; this line is for type checkers
        if self.metrics:
            self.metrics.allocations.labels(resource=name, result="ok").inc(len(responses))
            self.metrics.allocated_devices.labels(resource=name).inc(
                sum(len(r.devices_ids) for r in request.container_requests))
        return pb.AllocateResponse(container_responses=responses)

    def PreStartContainer(self, request: Any, context: Any) -> Any:
        return pb.PreStartContainerResponse()


def socket_name(resource_name: str) -> str:
    """`nvidia.com/mig-1g.5gb` -> `gpukit-mig-1g.5gb.sock` (one socket per resource)."""
    return f"gpukit-{resource_name.partition('/')[2]}.sock"


def inode(path: str) -> int | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino if stat.S_ISSOCK(st.st_mode) else None


class PluginServer:
    """A gRPC server for one resource on `<kubelet dir>/gpukit-<name>.sock`, mode 0600."""

    def __init__(self, state: ResourceState, kubelet_dir: str,
                 metrics: PluginMetrics | None = None, workers: int = 8) -> None:
        self.state = state
        self.kubelet_dir = kubelet_dir
        self.endpoint = socket_name(state.name)
        self.path = os.path.join(kubelet_dir, self.endpoint)
        self.metrics = metrics
        self.workers = workers
        self._server: Any = None
        self._inode: int | None = None

    def start(self) -> None:
        if os.path.lexists(self.path):
            os.unlink(self.path)  # a stale socket from an earlier run
        server = grpc.server(futures.ThreadPoolExecutor(
            max_workers=self.workers, thread_name_prefix=f"dp-{self.state.resource.short_name}"))
        deviceplugin_grpc.add_DevicePluginServicer_to_server(
            DevicePluginService(self.state, self.metrics), server)
        # The socket must never be reachable by others, not even between bind and chmod:
        # bind under a restrictive umask (process-wide, hence the lock), then chmod anyway.
        with _umask_lock:
            old = os.umask(0o177)
            try:
                port = server.add_insecure_port(f"unix://{self.path}")
            except RuntimeError as exc:  # newer grpcio raises instead of returning 0
                raise OSError(f"cannot listen on {self.path}: {exc}") from exc
            finally:
                os.umask(old)
        if port == 0:
            raise OSError(f"cannot listen on {self.path}")
        os.chmod(self.path, 0o600)
        server.start()
        self._server = server
        self._inode = inode(self.path)
        log.info("serving %s on %s", self.state.name, self.path)

    def socket_intact(self) -> bool:
        """False once the kubelet (restarting) or anyone else removed or replaced our socket."""
        return self._inode is not None and inode(self.path) == self._inode

    def stop(self, grace: float = 0.5) -> None:
        self.state.close()
        if self._server is not None:
            self._server.stop(grace).wait()
            self._server = None
        if self._inode is not None and inode(self.path) == self._inode:
            os.unlink(self.path)
        self._inode = None

    def restart(self) -> None:
        if self._server is not None:
            self._server.stop(0).wait()
            self._server = None
        self._inode = None
        self.start()


def register(kubelet_socket: str, endpoint: str, resource_name: str, timeout: float = 5.0
             ) -> None:
    """Register one resource with the kubelet; raises grpc.RpcError on failure."""
    with grpc.insecure_channel(f"unix://{kubelet_socket}") as channel:
        stub = deviceplugin_grpc.RegistrationStub(channel)
        stub.Register(
            pb.RegisterRequest(
                version=API_VERSION, endpoint=endpoint, resource_name=resource_name,
                options=pb.DevicePluginOptions(pre_start_required=False,
                                               get_preferred_allocation_available=True),
            ),
            timeout=timeout, wait_for_ready=True,
        )


RegisterFn = Callable[[str, str, str], None]
