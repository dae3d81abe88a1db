"""Which of the agent's resources the kubelet knows, and registering the others.

A resource needs (re-)registration when its server starts, when its socket was re-served (the
kubelet wipes the directory on start), when kubelet.sock was re-created (a new kubelet knows
nothing), and when the kubelet closed its ListAndWatch stream (see `dropped`). Registration
is retried every `retry_seconds` while it fails; nothing registers before kubelet.sock exists.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence

import grpc

from .metrics import PluginMetrics
from .server import PluginServer, inode

log = logging.getLogger(__name__)

RegisterFn = Callable[[str, str, str, float], None]  # (kubelet socket, endpoint, name, timeout)


class KubeletRegistration:
    def __init__(self, register_fn: RegisterFn, metrics: PluginMetrics, timeout: float,
                 retry_seconds: float, stream_grace_seconds: float) -> None:
        self.register_fn = register_fn
        self.metrics = metrics
        self.timeout = timeout
        self.retry_seconds = retry_seconds
        self.stream_grace_seconds = stream_grace_seconds
        self.pending: set[str] = set()
        self.registered_at: dict[str, float] = {}
        self._next_attempt = 0.0
        self._kubelet_inode: int | None = None

    def want(self, *names: str) -> None:
        """Register these (again) at the next chance."""
        self.pending.update(names)
        self._next_attempt = 0.0

    def forget(self, name: str) -> None:
        self.pending.discard(name)

    def forget_kubelet(self) -> None:
        """The kubelet directory changed: whatever socket is there now is a new kubelet."""
        self._kubelet_inode = None

    def is_registered(self, name: str) -> bool:
        return name not in self.pending and name in self.registered_at

    def kubelet_restarted(self, socket: str) -> bool:
        """kubelet.sock is there and is not the one registered with (then all must
        register again); logs a re-creation."""
        current = inode(socket)
        if current is None or current == self._kubelet_inode:
            return False
        if self._kubelet_inode is not None:
            log.warning("kubelet.sock was re-created: re-registering all resources")
        return True

    def register_pending(self, socket: str,
                         endpoints: Callable[[Sequence[str]], list[tuple[str, str]]]) -> None:
        """`endpoints(names)`: (name, endpoint) of those still served, read under the
        caller's lock."""
        if not self.pending or time.monotonic() < self._next_attempt:
            return
        current = inode(socket)
        if current is None:
            return  # no kubelet yet; the loop retries when kubelet.sock appears
        failed = False
        # Counted after the whole round: the first use of a metric imports prometheus_client
        # (metrics.py), which must not hold up the other resources' registrations at start.
        outcomes: list[tuple[str, str]] = []
        for name, endpoint in endpoints(sorted(self.pending)):
            try:
                self.register_fn(socket, endpoint, name, self.timeout)
            except grpc.RpcError as exc:
                failed = True
                log.error("registering %s with the kubelet failed: %s", name,
                          exc.details() if hasattr(exc, "details") else exc)
                outcomes.append((name, "error"))
                continue
            log.info("registered %s (%s) with the kubelet", name, endpoint)
            outcomes.append((name, "ok"))
            self.pending.discard(name)
            self.registered_at[name] = time.monotonic()
        for name, result in outcomes:
            self.metrics.registrations.labels(resource=name, result=result).inc()
            if result == "error":
                self.metrics.errors.labels(kind="register").inc()
        self._kubelet_inode = current
        if failed:
            self._next_attempt = time.monotonic() + self.retry_seconds

    def dropped(self, servers: Mapping[str, PluginServer]) -> None:
        """Register again each resource whose ListAndWatch stream the kubelet closed.

        The kubelet opens the stream right after a registration and keeps it open; when an
        older plugin's stream for the same resource ends after ours began, the kubelet
        disconnects *ours* and reports the resource's devices unhealthy until the plugin
        registers again (kubernetes#121994), e.g. after an overlapping agent restart."""
        now = time.monotonic()
        for name, server in servers.items():
            since = server.state.streamless_since()
            if name in self.pending or since is None:
                continue
            if now - max(since, self.registered_at.get(name, now)) < self.stream_grace_seconds:
                continue
            log.warning("the kubelet has no ListAndWatch stream open for %s: registering again",
                        name)
            self.want(name)
