"""CDI spec for the devices this plugin serves, for the cdi-annotations / cdi-cri strategies.

One spec of kind `nvidia.com/gpu`; every GPU and MIG device appears twice, named by UUID and by
index, so the names Allocate returns resolve under either deviceIDStrategy. Device nodes use
the configured device root as hostPath (CDI 0.5.0 added hostPath), so lab nodes can point at
their own /dev tree. Written atomically: a runtime never reads a half-written spec.

As NVIDIA's specs (`nvidia-ctk cdi generate`), the spec-wide edits carry the control nodes, the
driver's libraries and binaries as read-only bind mounts, and NVIDIA_VISIBLE_DEVICES=void, so
an nvidia-container-runtime in legacy mode adds nothing more to a CDI-injected container.
(NVIDIA's `nvidia-cdi-hook` hooks, update-ldcache and create-symlinks, are not emitted: the
files are mounted at the paths the driver installed them, where the loader already looks.)
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .allocate import CDI_KIND, host_path
from .resources import Unit

CDI_VERSION = "0.5.0"
SPEC_FILE = "gpukit-nvidia-gpu.json"
VOID_ENV = "NVIDIA_VISIBLE_DEVICES=void"
MOUNT_OPTIONS = ["ro", "nosuid", "nodev", "bind"]
# The driver's user-space files a container gets (utility and compute, as NVIDIA's default
# NVIDIA_DRIVER_CAPABILITIES), mounted where present.
DRIVER_FILES = (
    "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
    "/usr/lib/x86_64-linux-gnu/libnvidia-cfg.so.1",
    "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
    "/usr/lib/x86_64-linux-gnu/libnvidia-ptxjitcompiler.so.1",
    "/usr/lib/x86_64-linux-gnu/libnvidia-nvvm.so.4",
    "/usr/bin/nvidia-smi",
    "/usr/bin/nvidia-debugdump",
    "/usr/bin/nvidia-persistenced",
    "/usr/bin/nvidia-cuda-mps-control",
    "/usr/bin/nvidia-cuda-mps-server",
)


def _node(root: str, path: str) -> dict[str, str]:
    return {"path": path, "hostPath": host_path(root, path)}


def driver_mounts(host_paths: Iterable[tuple[str, str]]) -> list[dict[str, Any]]:
    """Read-only bind mounts of (host path, container path) pairs."""
    return [{"hostPath": h, "containerPath": c, "options": list(MOUNT_OPTIONS)}
            for h, c in host_paths]  # fmt: skip


def build_spec(
    units: Iterable[Unit],
    device_root: str,
    control_nodes: Iterable[str],
    driver_files: Iterable[tuple[str, str]] = (),
) -> dict[str, Any]:
    """`driver_files`: (host path, container path) of the driver files to mount."""
    devices: list[dict[str, Any]] = []
    for unit in sorted(units, key=lambda u: (u.gpu.index, u.index_id)):
        edits = {"deviceNodes": [_node(device_root, p) for p in unit.device_nodes]}
        for name in dict.fromkeys((unit.uuid, unit.index_id)):
            devices.append({"name": name, "containerEdits": edits})
    common: dict[str, Any] = {
        "env": [VOID_ENV],
        "deviceNodes": [_node(device_root, p) for p in control_nodes],
    }
    mounts = driver_mounts(driver_files)
    if mounts:
        common["mounts"] = mounts
    return {"cdiVersion": CDI_VERSION, "kind": CDI_KIND, "devices": devices,
            "containerEdits": common}  # fmt: skip


def write_spec(spec: dict[str, Any], spec_dir: str, file_name: str = SPEC_FILE) -> Path:
    """Write (or replace) the spec file atomically; returns its path."""
    directory = Path(spec_dir)
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / file_name
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{file_name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(spec, fh, indent=2, sort_keys=True)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)  # runtimes read it as another user
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def remove_spec(spec_dir: str, file_name: str = SPEC_FILE) -> None:
    (Path(spec_dir) / file_name).unlink(missing_ok=True)
