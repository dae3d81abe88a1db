"""The metrics endpoint's HTTP server (wsgiref), imported when the endpoint starts: the
standard library's HTTP stack is not on the agent's way to registering with the kubelet."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

WsgiApp = Callable[[dict[str, Any], Any], Iterable[bytes]]


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a stuck scrape must not hold up the agent's exit


class _Server6(_Server):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass  # a probe every few seconds is not worth a log line


def start(host: str, port: int, app: WsgiApp) -> WSGIServer:
    """Listen on host:port (IPv6 when host has a colon) and serve `app` from a thread."""
    server_cls = _Server6 if ":" in host else _Server
    server = make_server(host, port, app, server_cls, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="gpukit-metrics", daemon=True).start()
    return server
