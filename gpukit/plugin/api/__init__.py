"""Kubelet gRPC APIs: device plugin v1beta1, PodResources v1, plugin registration v1, DRA v1 and
DRA resource health v1.

`deviceplugin_pb2`, `deviceplugin_grpc`, `podresources_pb2`, `podresources_grpc`,
`registration_pb2`, `registration_grpc`, `dra_pb2`, `dra_grpc`, `dra_health_pb2` and
`dra_health_grpc` are the generated modules,
loaded on first use. An installed gpukit carries them (the wheel's build generates them); only
a checkout generates missing ones then (a fresh clone needs no build step, grpcio-tools is a
dev dependency). They are typed `Any` on purpose: type checking must not depend on build
outputs. Loading lazily also keeps `python -m gpukit.plugin.api.generate` from importing
itself twice.
"""

from __future__ import annotations

import importlib
import os
import threading
from pathlib import Path
from typing import Any

API_VERSION = "v1beta1"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
KUBELET_SOCKET_NAME = "kubelet.sock"

_DIR = Path(__file__).resolve().parent
_MODULES = {
    "deviceplugin_pb2": "deviceplugin_v1beta1_pb2",
    "deviceplugin_grpc": "deviceplugin_v1beta1_pb2_grpc",
    "podresources_pb2": "podresources_v1_pb2",
    "podresources_grpc": "podresources_v1_pb2_grpc",
    "registration_pb2": "pluginregistration_v1_pb2",
    "registration_grpc": "pluginregistration_v1_pb2_grpc",
    "dra_pb2": "dra_v1_pb2",
    "dra_grpc": "dra_v1_pb2_grpc",
    "dra_health_pb2": "dra_health_v1_pb2",
    "dra_health_grpc": "dra_health_v1_pb2_grpc",
}
_lock = threading.Lock()


def in_checkout(directory: Path = _DIR) -> bool:
    """A source checkout (gpukit/plugin/api beside the project's pyproject.toml), not an install."""
    return (directory.parents[2] / "pyproject.toml").is_file()


def _ensure_stubs() -> None:
    with _lock:
        if all((_DIR / f"{m}.py").is_file() for m in _MODULES.values()):
            return
        if not in_checkout():
            raise ImportError(
                f"kubelet API stubs are missing in {_DIR}: this gpukit was installed without "
                "them; reinstall it from a wheel (its build generates them)"
            )
        if not os.access(_DIR, os.W_OK):
            raise ImportError(
                f"kubelet API stubs are missing in {_DIR} and it is read-only; run "
                "`python -m gpukit.plugin.api.generate` at build time"
            )
        importlib.import_module(f"{__name__}.generate").generate()


def __getattr__(name: str) -> Any:
    if name not in _MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    _ensure_stubs()
    module = importlib.import_module(f"{__name__}.{_MODULES[name]}")
    globals()[name] = module
    return module


__all__ = [
    "API_VERSION",
    "HEALTHY",
    "KUBELET_SOCKET_NAME",
    "UNHEALTHY",
    "deviceplugin_grpc",
    "deviceplugin_pb2",
    "dra_grpc",
    "dra_health_grpc",
    "dra_health_pb2",
    "dra_pb2",
    "podresources_grpc",
    "podresources_pb2",
    "registration_grpc",
    "registration_pb2",
]
