"""CDI spec for the devices this plugin serves, for the cdi-annotations / cdi-cri strategies.

One spec of kind `nvidia.com/gpu`; every GPU and MIG device appears twice, named by UUID and by
index (`<gpu>` or `<gpu>:<mig>`, as `nvidia-ctk cdi generate` names them), so the names
Allocate returns resolve under either deviceIDStrategy. Device nodes use the configured device
root as hostPath (CDI 0.5.0 added hostPath), so lab nodes can point at their own /dev tree.
Written atomically: a runtime never reads a half-written spec.

The spec-wide edits are those of NVIDIA's specs (`nvidia-ctk cdi generate`, its driver
discovery), found under the driver root (`find_driver`):
- the control nodes that exist, and env NVIDIA_VISIBLE_DEVICES=void (a runtime in legacy mode
  adds nothing more) and NVIDIA_CTK_LIBCUDA_DIR (libcuda's directory);
- read-only binds of the driver's libraries, every `*.so.<driver version>` in the library
  directories, of its binaries (nvidia-smi, nvidia-debugdump, nvidia-persistenced, the MPS
  control and server, nvidia-imex and -ctl), its IPC sockets (persistenced, fabric manager,
  MPS) and GSP firmware;
- with `nvidia-cdi-hook` on the node, NVIDIA's createContainer hooks: create-symlinks
  (libcuda.so -> libcuda.so.1), enable-cuda-compat, update-ldcache over the libraries'
  directories (the container's loader cache and soname links), and
  disable-device-node-modification. Without the hook the soname links themselves
  (`libcuda.so.1`, ...) are bound as well, so the loader still finds the libraries by soname
  on its default path; what is left out then is an image's own ld.so.cache naming them, the
  `libcuda.so` development link and CUDA forward compatibility.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpukit.contracts.plugin_config import Config

from .allocate import CDI_KIND, CONTROL_NODES, host_path
from .resources import Unit

CDI_VERSION = "0.5.0"
SPEC_FILE = "gpukit-nvidia-gpu.json"
VOID_ENV = "NVIDIA_VISIBLE_DEVICES=void"
LIBCUDA_DIR_ENV = "NVIDIA_CTK_LIBCUDA_DIR"
MOUNT_OPTIONS = ["ro", "nosuid", "nodev", "bind"]
IPC_MOUNT_OPTIONS = [*MOUNT_OPTIONS, "noexec"]
# The driver's user-space files a container gets (utility and compute, as NVIDIA's default
# NVIDIA_DRIVER_CAPABILITIES) by soname: what an agent that only knows paths mounts.
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
# Where NVIDIA's discovery looks (its ldcache and executable locators, in their order);
# merged-/usr aliases (/lib -> usr/lib) are visited once.
LIBRARY_DIRS = ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib64", "/lib64",
                "/usr/lib", "/lib")  # fmt: skip
BINARY_DIRS = ("/usr/bin", "/usr/sbin", "/bin", "/sbin", "/usr/local/bin")
BINARIES = ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control",
            "nvidia-cuda-mps-server", "nvidia-imex", "nvidia-imex-ctl")  # fmt: skip
IPC_PATHS = ("/run/nvidia-persistenced/socket", "/run/nvidia-fabricmanager/socket",
             "/tmp/nvidia-mps")  # fmt: skip
FIRMWARE_DIRS = ("/lib/firmware", "/usr/lib/firmware")
LIBCUDA_SONAME = "libcuda.so.1"
CDI_HOOK = "/usr/bin/nvidia-cdi-hook"
HOOK_ENV = ["NVIDIA_CTK_DEBUG=false"]


@dataclass(frozen=True)
class DriverFiles:
    """The driver's files NVIDIA's spec carries, as paths under the driver root."""

    version: str
    libraries: tuple[str, ...] = ()  # the `*.so.<version>` files
    soname_links: tuple[str, ...] = ()  # links to them: libcuda.so.1 -> libcuda.so.<version>
    binaries: tuple[str, ...] = ()
    ipc: tuple[str, ...] = ()
    firmware: tuple[str, ...] = ()

    @property
    def library_dirs(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(os.path.dirname(p) for p in self.libraries))

    @property
    def libcuda(self) -> str | None:
        return next((p for p in self.libraries
                     if os.path.basename(p).startswith("libcuda.so.")), None)  # fmt: skip


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def find_driver(root_seen: str, version: str) -> DriverFiles:
    """The driver's files under `root_seen` (the driver root as this process sees it) for
    driver `version` ("550.90.07"); nothing when the version is unknown."""
    if not version:
        return DriverFiles(version)
    libraries: list[str] = []
    links: list[str] = []
    seen_dirs: set[str] = set()
    for directory in LIBRARY_DIRS:
        real = os.path.realpath(host_path(root_seen, directory))
        if real in seen_dirs or not os.path.isdir(real):
            continue
        seen_dirs.add(real)
        names = _listdir(real)
        versioned = {n for n in names if n.endswith(f".so.{version}")
                     and os.path.isfile(os.path.join(real, n))
                     and not os.path.islink(os.path.join(real, n))}  # fmt: skip
        libraries += [f"{directory}/{n}" for n in sorted(versioned)]
        for n in names:
            full = os.path.join(real, n)
            if ".so." in n and n not in versioned and os.path.islink(full) \
                    and os.readlink(full) in versioned:  # fmt: skip
                links.append(f"{directory}/{n}")
    binaries: list[str] = []
    for name in BINARIES:
        paths = (f"{d}/{name}" for d in BINARY_DIRS)
        found = next((p for p in paths if os.access(host_path(root_seen, p), os.X_OK)), None)
        if found:
            binaries.append(found)
    ipc = [p for p in IPC_PATHS if os.path.exists(host_path(root_seen, p))]
    firmware: list[str] = []
    for d in FIRMWARE_DIRS:
        fw_dir = f"{d}/nvidia/{version}"
        firmware += [f"{fw_dir}/{n}" for n in _listdir(host_path(root_seen, fw_dir))
                     if n.startswith("gsp") and n.endswith(".bin")]  # fmt: skip
        if firmware:
            break
    return DriverFiles(version, tuple(libraries), tuple(links), tuple(binaries), tuple(ipc),
                       tuple(firmware))  # fmt: skip


def _hook(command: str, *args: str) -> dict[str, Any]:
    return {"hookName": "createContainer", "path": CDI_HOOK,
            "args": ["nvidia-cdi-hook", command, *args], "env": list(HOOK_ENV)}  # fmt: skip


def driver_edits(files: DriverFiles, host_root: str, with_hooks: bool) -> dict[str, Any]:
    """The spec-wide edits for the driver's files (mounts, env, hooks), host paths under
    `host_root` (the driver root on the host)."""

    def bind(paths: Iterable[str], options: list[str] = MOUNT_OPTIONS) -> list[dict[str, Any]]:
        return [{"hostPath": host_path(host_root, p), "containerPath": p,
                 "options": list(options)} for p in paths]  # fmt: skip

    mounts = bind(files.libraries)
    if not with_hooks:  # the loader finds them by soname without ldconfig's links
        mounts += bind(files.soname_links)
    mounts += bind(files.ipc, IPC_MOUNT_OPTIONS) + bind(files.firmware) + bind(files.binaries)
    edits: dict[str, Any] = {"mounts": mounts} if mounts else {}
    libcuda = files.libcuda
    if libcuda:
        edits["env"] = [f"{LIBCUDA_DIR_ENV}={os.path.dirname(libcuda)}"]
    if with_hooks and files.libraries:
        hooks = []
        if libcuda:
            link = f"{os.path.dirname(libcuda)}/libcuda.so"
            hooks.append(_hook("create-symlinks", "--link", f"{LIBCUDA_SONAME}::{link}"))
        hooks.append(_hook("enable-cuda-compat", f"--host-driver-version={files.version}"))
        folders = [a for d in files.library_dirs for a in ("--folder", d)]
        hooks.append(_hook("update-ldcache", *folders))
        hooks.append(_hook("disable-device-node-modification"))
        edits["hooks"] = hooks
    return edits


def soname_edits(root_seen: str, host_root: str,
                 exists: Callable[[str], bool] = os.path.exists) -> dict[str, Any]:
    """Without a driver version there is no `*.so.<version>` to look for (NVIDIA's generator
    gives up): the driver files gpukit knows by soname (DRIVER_FILES) that exist, bound."""
    present = [f for f in DRIVER_FILES if exists(host_path(root_seen, f))]
    mounts = driver_mounts((host_path(host_root, f), f) for f in present)
    return {"mounts": mounts} if mounts else {}


def _node(root: str, path: str) -> dict[str, str]:
    return {"path": path, "hostPath": host_path(root, path)}


def driver_mounts(host_paths: Iterable[tuple[str, str]]) -> list[dict[str, Any]]:
    """Read-only bind mounts of (host path, container path) pairs."""
    return [{"hostPath": h, "containerPath": c, "options": list(MOUNT_OPTIONS)}
            for h, c in host_paths]  # fmt: skip


def common_edits(
    device_root: str,
    control_nodes: Iterable[str],
    driver_files: Iterable[tuple[str, str]] = (),
    driver: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The spec-wide containerEdits: control nodes (host paths under `device_root`), env and
    the driver's edits (`driver_edits`), else `driver_files`, (host path, container path)
    pairs of driver files to bind."""
    common: dict[str, Any] = {
        "env": [VOID_ENV],
        "deviceNodes": [_node(device_root, p) for p in control_nodes],
    }
    if driver is not None:
        common["env"] += driver.get("env", [])
        for key in ("mounts", "hooks"):
            if driver.get(key):
                common[key] = list(driver[key])
    else:
        mounts = driver_mounts(driver_files)
        if mounts:
            common["mounts"] = mounts
    return common


def unit_edits(unit: Unit, device_root: str) -> dict[str, Any]:
    """A device's own containerEdits: its /dev nodes."""
    return {"deviceNodes": [_node(device_root, p) for p in unit.device_nodes]}


def build_spec(
    units: Iterable[Unit],
    device_root: str,
    control_nodes: Iterable[str],
    driver_files: Iterable[tuple[str, str]] = (),
    driver: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """`driver`: the driver's edits (`driver_edits`); else `driver_files`, (host path,
    container path) pairs of driver files to bind."""
    return _spec(units, device_root, common_edits(device_root, control_nodes, driver_files,
                                                  driver))


def _spec(units: Iterable[Unit], device_root: str, common: dict[str, Any]) -> dict[str, Any]:
    """Every unit named by UUID and by index, with the spec-wide edits."""
    devices: list[dict[str, Any]] = []
    for unit in sorted(units, key=lambda u: (u.gpu.index, u.index_id)):
        edits = unit_edits(unit, device_root)
        for name in dict.fromkeys((unit.uuid, unit.index_id)):
            devices.append({"name": name, "containerEdits": edits})
    return {"cdiVersion": CDI_VERSION, "kind": CDI_KIND, "devices": devices,
            "containerEdits": common}  # fmt: skip


def node_edits(root_seen: str, host_root: str, driver_version: str,
               exists: Callable[[str], bool] = os.path.exists) -> dict[str, Any]:
    """The spec-wide containerEdits of a node's GPUs as the agent sees them under the driver
    root (`root_seen`), host paths under `host_root`. Binaries and hooks only when they show
    under that root: with the host's root as driver root the node agent does not see the
    host's /usr/bin, the DRA plugin does (its claims' specs bind and run them as NVIDIA's)."""
    control = [n for n in CONTROL_NODES if exists(host_path(root_seen, n))]
    files = find_driver(root_seen, driver_version)
    if files.libraries:
        driver = driver_edits(files, host_root, exists(host_path(root_seen, CDI_HOOK)))
    else:
        # No `*.so.<version>` where the agent looks (an NVML that gave no version, or a
        # library installed by its soname alone, as the lab's bare nodes have it): the files
        # gpukit knows by soname, so containers still get the NVML library.
        driver = soname_edits(root_seen, host_root, exists)
    return common_edits(host_root, control, driver=driver)


def agent_spec(
    units: Iterable[Unit],
    config: Config,
    driver_version: str,
    exists: Callable[[str], bool] = os.path.exists,
) -> dict[str, Any]:
    """The node agent's spec: control nodes and driver files as the agent sees them under
    the driver root (config.device_root_in_plugin), host paths under config.device_root
    (see `node_edits`)."""
    root = config.device_root
    return _spec(units, root, node_edits(config.device_root_in_plugin, root, driver_version,
                                         exists))


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
