"""The node's CDI spec for its NVIDIA devices (what `nvidia-ctk cdi generate` writes), built
from NVML discovery with the device plugin's own device model.

Kind `nvidia.com/gpu`; every GPU by index and UUID, every MIG device by `<gpu>:<mig>` and
UUID (its parent's node and its /dev/nvidia-caps nodes), and `all`. Container edits, as
NVIDIA's (see gpukit.plugin.cdi): the driver's control nodes that exist,
NVIDIA_VISIBLE_DEVICES=void and NVIDIA_CTK_LIBCUDA_DIR, the driver's files found under the
driver root (its `*.so.<version>` libraries, binaries, IPC sockets, firmware) as read-only
binds, and nvidia-cdi-hook's hooks when the hook is installed. The device plugin's
per-allocation spec (/var/run/cdi) uses the same names and takes precedence where both define
a device (CDI resolves by directory priority); it carries the same spec-wide edits.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import yaml

from gpukit.plugin import cdi as plugin_cdi
from gpukit.plugin.allocate import CONTROL_NODES
from gpukit.plugin.devices import NodeDevices
from gpukit.plugin.resources import Unit, gpu_unit, mig_unit
from gpukit.provision.edit import Edit

DEFAULT_PATH = "/etc/cdi/nvidia.yaml"
HEADER = "# Managed by gpukit (container_toolkit): CDI spec for this node's NVIDIA devices.\n"


def units(inv: NodeDevices, proc_root: str = "/") -> list[Unit]:
    out: list[Unit] = []
    for gpu in inv.gpus:
        out.append(gpu_unit(gpu))
        out += [mig_unit(gpu, m, proc_root) for m in gpu.mig_devices]
    return out


def build(
    inv: NodeDevices,
    exists: Callable[[str], bool] = os.path.exists,
    driver_root: str = "/",
    proc_root: str = "/",
) -> dict[str, Any]:
    """`exists` checks the control nodes and nvidia-cdi-hook; the driver's files are looked
    for under `driver_root` (by soname with `exists` when NVML gave no driver version)."""
    present = [n for n in CONTROL_NODES if exists(n)]
    if inv.driver_version:
        files = plugin_cdi.find_driver(driver_root, inv.driver_version)
        driver = plugin_cdi.driver_edits(files, driver_root, exists(plugin_cdi.CDI_HOOK))
    else:
        driver = plugin_cdi.soname_edits(driver_root, driver_root, exists)
    every_unit = units(inv, proc_root)
    spec = plugin_cdi.build_spec(every_unit, "/", present, driver=driver)
    # A node-wide spec: plain paths (the device root is the host's /).
    for dev in spec["devices"]:
        for node in dev["containerEdits"]["deviceNodes"]:
            node.pop("hostPath", None)
    for node in spec["containerEdits"]["deviceNodes"]:
        node.pop("hostPath", None)
    # `all`: every GPU and MIG device (their caps nodes too), as nvidia-ctk's
    every = dict.fromkeys(p for u in every_unit for p in u.device_nodes)
    if every:
        spec["devices"].append({"name": "all", "containerEdits": {
            "deviceNodes": [{"path": p} for p in every]}})
    spec["cdiVersion"] = "0.5.0"
    return spec


def render(spec: dict[str, Any]) -> str:
    return HEADER + yaml.safe_dump(spec, sort_keys=False, default_flow_style=False)


def plan(
    inv: NodeDevices,
    current: str | None,
    path: str = DEFAULT_PATH,
    exists: Callable[[str], bool] = os.path.exists,
    driver_root: str = "/",
) -> Edit:
    after = render(build(inv, exists, driver_root))
    changes: tuple[str, ...] = ()
    if current != after:
        n = len(inv.gpus) + sum(len(g.mig_devices) for g in inv.gpus)
        changes = (f"{path}: {'created' if current is None else 'updated'} ({n} devices)",)
    return Edit(path=path, before=current, after=after, changes=changes)
