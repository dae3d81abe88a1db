"""The gRPC side: plugin registration (plugins_registry/) and the DRAPlugin service
(plugins/gpu.nvidia.com/), each on its own unix socket; translates protobuf to prepare.py.

The DRA socket is listening before the registration socket appears: the kubelet's plugin
watcher calls GetInfo as soon as it sees the registration socket, then dials the endpoint.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc

from gpukit.contracts.dra import DRIVER, PLUGIN_TYPE, SUPPORTED_SERVICES

from ..api import dra_grpc, dra_health_grpc, dra_pb2, registration_grpc, registration_pb2
from .health_stream import SERVICE as HEALTH_SERVICE
from .health_stream import HealthService
from .prepare import ClaimRef, Preparer

log = logging.getLogger(__name__)
_umask_lock = threading.Lock()


class RegistrationService(registration_grpc.RegistrationServicer):  # type: ignore[misc]
    def __init__(self, endpoint: str, services: tuple[str, ...] = SUPPORTED_SERVICES) -> None:
        self.endpoint = endpoint
        self.services = services
        self.registered = threading.Event()
        self.last_error = ""

    def GetInfo(self, request: Any, context: Any) -> Any:
        return registration_pb2.PluginInfo(type=PLUGIN_TYPE, name=DRIVER, endpoint=self.endpoint,
                                           supported_versions=list(self.services))

    def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        if request.plugin_registered:
            log.info("the kubelet registered DRA driver %s (%s)", DRIVER, self.endpoint)
            self.last_error = ""
            self.registered.set()
        else:
            log.error("the kubelet refused DRA driver %s: %s", DRIVER, request.error)
            self.last_error = request.error
            self.registered.clear()
        return registration_pb2.RegistrationStatusResponse()


class DraService(dra_grpc.DRAPluginServicer):  # type: ignore[misc]
    def __init__(self, preparer: Preparer) -> None:
        self.preparer = preparer

    def NodePrepareResources(self, request: Any, context: Any) -> Any:
        out = dra_pb2.NodePrepareResourcesResponse()
        for c in request.claims:
            ref, entry = ClaimRef(c.namespace, c.name, c.uid), out.claims[c.uid]
            with _claim_answer(ref, entry, "preparing"):
                for d in self.preparer.prepare(ref).devices:
                    entry.devices.add(request_names=list(d.requests), pool_name=d.pool,
                                      device_name=d.device, cdi_device_ids=list(d.cdi_device_ids))
        return out

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        out = dra_pb2.NodeUnprepareResourcesResponse()
        for c in request.claims:
            ref, entry = ClaimRef(c.namespace, c.name, c.uid), out.claims[c.uid]
            with _claim_answer(ref, entry, "unpreparing"):
                self.preparer.unprepare(ref)
        return out


@contextmanager
def _claim_answer(ref: ClaimRef, entry: Any, doing: str) -> Iterator[None]:
    """One claim's failure is its own answer (`entry.error`); the request's others go on."""
    try:
        yield
    except Exception as exc:
        log.error("%s %s failed: %s", doing, ref, exc)
        entry.error = str(exc) or type(exc).__name__


def _listen(server: grpc.Server, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)  # a socket left by an earlier run
    # Only root (the kubelet) may connect, also between bind and chmod.
    with _umask_lock:
        old = os.umask(0o177)
        try:
            port = server.add_insecure_port(f"unix://{path}")
        except RuntimeError as exc:
            raise OSError(f"cannot listen on {path}: {exc}") from exc
        finally:
            os.umask(old)
    if port == 0:
        raise OSError(f"cannot listen on {path}")
    os.chmod(path, 0o600)


class DraServer:
    """Both servers; `start` serves, `stop` stops them and removes their sockets (the
    kubelet then drops the plugin; its ResourceSlices stay until the agent deletes them)."""

    def __init__(self, preparer: Preparer, plugin_socket: Path, registration_socket: Path,
                 workers: int = 8, health: HealthService | None = None) -> None:
        self.plugin_socket = plugin_socket
        self.registration_socket = registration_socket
        # The health stream, when served, is listed so the kubelet watches it; its streams
        # get workers of their own (health_stream.MAX_STREAMS), not prepare's.
        services = SUPPORTED_SERVICES + ((HEALTH_SERVICE,) if health else ())
        self.registration = RegistrationService(str(plugin_socket), services)
        streams = health.max_streams if health else 0
        self._dra = grpc.server(futures.ThreadPoolExecutor(max_workers=workers + streams,
                                                           thread_name_prefix="dra"))
        dra_grpc.add_DRAPluginServicer_to_server(DraService(preparer), self._dra)
        if health is not None:
            dra_health_grpc.add_DRAResourceHealthServicer_to_server(health, self._dra)
        self._reg = grpc.server(futures.ThreadPoolExecutor(max_workers=2,
                                                           thread_name_prefix="dra-reg"))
        registration_grpc.add_RegistrationServicer_to_server(self.registration, self._reg)

    def start(self) -> None:
        _listen(self._dra, self.plugin_socket)
        self._dra.start()
        _listen(self._reg, self.registration_socket)
        self._reg.start()
        log.info("DRA driver %s: plugin on %s, registration on %s", DRIVER,
                 self.plugin_socket, self.registration_socket)

    def sockets_intact(self) -> bool:
        """False when someone (a kubelet cleaning up) removed a socket: restart serving."""
        return self.plugin_socket.exists() and self.registration_socket.exists()

    def stop(self, grace: float = 1.0) -> None:
        self._reg.stop(grace).wait()
        self._dra.stop(grace).wait()
        self.registration_socket.unlink(missing_ok=True)
        self.plugin_socket.unlink(missing_ok=True)
