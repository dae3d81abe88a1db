"""CDI spec for the devices this plugin serves, for the cdi-annotations / cdi-cri strategies.

One spec of kind `nvidia.com/gpu`; every GPU and MIG device appears twice, named by UUID and by
index, so the names Allocate returns resolve under either deviceIDStrategy. Device nodes use
the configured device root as hostPath (CDI 0.5.0 added hostPath), so lab nodes can point at
their own /dev tree. Written atomically: a runtime never reads a half-written spec.
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


def _node(root: str, path: str) -> dict[str, str]:
    return {"path": path, "hostPath": host_path(root, path)}


def build_spec(
    units: Iterable[Unit], device_root: str, control_nodes: Iterable[str]
) -> dict[str, Any]:
    devices: list[dict[str, Any]] = []
    for unit in sorted(units, key=lambda u: (u.gpu.index, u.index_id)):
        edits = {"deviceNodes": [_node(device_root, p) for p in unit.device_nodes]}
        for name in dict.fromkeys((unit.uuid, unit.index_id)):
            devices.append({"name": name, "containerEdits": edits})
    return {
        "cdiVersion": CDI_VERSION,
        "kind": CDI_KIND,
        "devices": devices,
        "containerEdits": {"deviceNodes": [_node(device_root, p) for p in control_nodes]},
    }


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
