"""The nodes as hosts: pytest-testinfra's ansible backend over the same inventory.

The suite reaches a node exactly as `site.yml` does (ansible_host, user, key, SSH arguments from
the inventory) and asks NVML itself with `nvml_probe.py` (stdlib python3 on the node).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpukit.contracts import label_names, mig_profiles
from gpukit.contracts.plugin_config import (
    GPUKIT_AGENT_SOCKET_PREFIX,
    NVIDIA_PLUGIN_CDI_VENDOR,
    NVIDIA_PLUGIN_SOCKET_PREFIX,
)
from gpukit.inventory import NodeDecl

PROBE_SOURCE = Path(__file__).with_name("nvml_probe.py")


def ensure_ansible_on_path() -> None:
    """testinfra runs `ansible-inventory` from PATH: use this interpreter's when missing."""
    if shutil.which("ansible-inventory"):
        return
    here = str(Path(sys.executable).parent)
    if (Path(here) / "ansible-inventory").exists():
        os.environ["PATH"] = here + os.pathsep + os.environ.get("PATH", "")


def connect(inventory: str, host: str) -> Any:
    import testinfra

    ensure_ansible_on_path()
    return testinfra.get_host(f"ansible://{host}", ansible_inventory=inventory)


@dataclass(frozen=True)
class MigSeen:
    uuid: str
    gi: int
    ci: int
    profile: str  # GPU instance profile name from the MIG table ("?<id>" when unknown)
    start: int
    memory_mib: int
    caps: tuple[int, ...] = ()  # /dev/nvidia-caps minors the driver lists for it


@dataclass(frozen=True)
class GpuSeen:
    index: int
    uuid: str
    name: str
    minor: int
    memory_mib: int
    mig_current: bool | None
    mig_pending: bool | None
    migs: tuple[MigSeen, ...] = ()
    error: str = ""  # NVML could not query this GPU (then only `index` is known)
    lost: bool = False  # ... because it is lost (NVML_ERROR_GPU_IS_LOST)
    compute_mode: str = ""  # DEFAULT, EXCLUSIVE_PROCESS, ... ("" when NVML has none)

    @property
    def state(self) -> str:
        """`present`, or what NVML said instead, for expected/observed lines."""
        if not self.error:
            return "present"
        return f"{'lost' if self.lost else 'unreadable'} ({self.error})"


@dataclass(frozen=True)
class NvmlSeen:
    """What NVML reported on a node."""

    ok: bool
    error: str = ""
    library: str = ""
    mock: bool = False
    driver_version: str = ""
    cuda_driver_version: int = 0
    gpus: tuple[GpuSeen, ...] = ()
    by_uuid: dict[str, tuple[GpuSeen, MigSeen | None]] = field(default_factory=dict)

    @property
    def readable(self) -> tuple[GpuSeen, ...]:
        """The GPUs NVML could query (not lost)."""
        return tuple(g for g in self.gpus if not g.error)

    def parent(self, device_uuid: str) -> GpuSeen | None:
        hit = self.by_uuid.get(device_uuid)
        return hit[0] if hit else None

    def mig(self, device_uuid: str) -> MigSeen | None:
        hit = self.by_uuid.get(device_uuid)
        return hit[1] if hit else None

    def index_to_uuid(self, ref: str) -> str:
        """`0` or `0:1` (deviceIDStrategy index) -> UUID; other refs unchanged."""
        if ref.isdigit():
            return next((g.uuid for g in self.gpus if g.index == int(ref) and g.uuid), ref)
        gpu_idx, sep, pos = ref.partition(":")
        if sep and gpu_idx.isdigit() and pos.isdigit():
            gpu = next((g for g in self.gpus if g.index == int(gpu_idx) and not g.error), None)
            if gpu and int(pos) < len(gpu.migs):
                return gpu.migs[int(pos)].uuid
        return ref


def parse_probe(doc: dict[str, Any]) -> NvmlSeen:
    gpus: list[GpuSeen] = []
    by_uuid: dict[str, tuple[GpuSeen, MigSeen | None]] = {}
    for g in doc.get("gpus", []):
        if g.get("error"):
            gpus.append(GpuSeen(int(g["index"]), "", "", -1, 0, None, None,
                                error=str(g["error"]), lost=bool(g.get("lost"))))
            continue
        table = mig_profiles.for_product(g["name"])
        migs = []
        for m in g.get("migs", []):
            profile = f"?{m['gi_profile_id']}"
            if table is not None:
                try:  # nvmlGpuInstanceGetInfo's profileId is the driver's id, not the constant
                    profile = table.gpu_instance_profile_by_driver_id(
                        int(m["gi_profile_id"])).name
                except KeyError:
                    pass
            migs.append(MigSeen(m["uuid"], int(m["gi"]), int(m["ci"]), profile,
                                int(m["start"]), int(m["memory_mib"]),
                                tuple(int(c) for c in m.get("caps", ()))))
        gpu = GpuSeen(int(g["index"]), g["uuid"], g["name"], int(g["minor"]),
                      int(g["memory_mib"]), g.get("mig_current"), g.get("mig_pending"),
                      tuple(migs), compute_mode=str(g.get("compute_mode", "")))
        gpus.append(gpu)
        by_uuid[gpu.uuid] = (gpu, None)
        for mig in migs:
            by_uuid[mig.uuid] = (gpu, mig)
    return NvmlSeen(ok=bool(doc.get("ok")), error=str(doc.get("error", "")),
                    library=str(doc.get("library", "")), mock=bool(doc.get("mock")),
                    driver_version=str(doc.get("driver_version", "")),
                    cuda_driver_version=int(doc.get("cuda_driver_version") or 0),
                    gpus=tuple(gpus), by_uuid=by_uuid)


def run_probe(host: Any) -> NvmlSeen:
    """Run nvml_probe.py on the host with its python3; raises RuntimeError with the output."""
    source = PROBE_SOURCE.read_text()
    cmd = host.run("python3 -c %s", source)
    lines = [ln for ln in cmd.stdout.splitlines() if ln.startswith("{")]
    if cmd.rc != 0 or not lines:
        raise RuntimeError(f"NVML probe failed (rc {cmd.rc}): {cmd.stderr.strip() or cmd.stdout}")
    doc: dict[str, Any] = json.loads(lines[-1])
    return parse_probe(doc)


# ---- what the host area reads on a node (the `host` stage of conformance.schedule)

RUNTIME_SERVICES = {"containerd": "containerd", "crio": "crio"}
RUNTIME_CONFIGS = {
    "containerd": ["/etc/containerd/config.toml", "/etc/containerd/conf.d/*.toml"],
    "crio": ["/etc/crio/crio.conf", "/etc/crio/crio.conf.d/*"],
}
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
# containerd's CRI runtime settings: config version 3 (containerd 2) and version 2 (1.x).
CRI_RUNTIME_TABLES = ("io.containerd.cri.v1.runtime", "io.containerd.grpc.v1.cri")


@dataclass(frozen=True)
class ContainerdView:
    """What containerd itself says it runs with (`containerd config dump`: the files merged,
    imports applied, defaults filled in), not what one file says."""

    enable_cdi: bool
    nvidia_runtimes: tuple[str, ...]  # runtimes whose BinaryName is the NVIDIA runtime
    default_runtime: str


@dataclass(frozen=True)
class HostView:
    """Everything the host checks read on one node, read once (tests assert on it)."""

    service: str
    service_running: bool
    service_enabled: bool
    containerd: ContainerdView | str | None = None  # str: why it cannot be read
    runtime_config: str = ""  # CRI-O's files, concatenated
    kernel_version: str | None = None  # /proc/driver/nvidia/version (None: absent)
    cdi_dirs: tuple[str, ...] = ()
    cdi_kinds: tuple[str, ...] | None = None  # None: no CDI strategy, not read
    sockets: dict[str, tuple[str, str]] = field(default_factory=dict)  # resource: (path, state)


def containerd_view(host: Any) -> ContainerdView | str:
    """The effective CRI settings, or why they cannot be read."""
    out = host.run("containerd config dump")
    if out.rc != 0:
        return f"`containerd config dump` failed: {(out.stderr or out.stdout).strip()[:200]}"
    try:
        plugins = tomllib.loads(out.stdout).get("plugins", {})
    except tomllib.TOMLDecodeError as e:
        return f"`containerd config dump` is not TOML: {e}"
    cri = next((plugins[k] for k in CRI_RUNTIME_TABLES if k in plugins), None)
    if not isinstance(cri, dict):
        return "`containerd config dump` has no CRI runtime plugin"
    runtimes = (cri.get("containerd") or {}).get("runtimes") or {}
    nvidia = tuple(sorted(
        name for name, rt in runtimes.items()
        if str(((rt or {}).get("options") or {}).get("BinaryName", "")).endswith(
            "nvidia-container-runtime")
    ))  # fmt: skip
    return ContainerdView(enable_cdi=cri.get("enable_cdi") is True, nvidia_runtimes=nvidia,
                          default_runtime=str((cri.get("containerd") or {}).get(
                              "default_runtime_name", "")))  # fmt: skip


def socket_prefix(decl: NodeDecl) -> str:
    """How the node's device plugin names its sockets: gpukit's agent, or NVIDIA's plugin where
    the inventory declares another device plugin (gpukit_node_agent: false)."""
    return GPUKIT_AGENT_SOCKET_PREFIX if decl.node_agent else NVIDIA_PLUGIN_SOCKET_PREFIX


def cdi_kind(decl: NodeDecl) -> str:
    """The kind of the CDI spec the node's device plugin writes for its GPUs (as socket_prefix)."""
    return label_names.GPU_RESOURCE if decl.node_agent else f"{NVIDIA_PLUGIN_CDI_VENDOR}/gpu"


def read_view(host: Any, decl: NodeDecl, resources: Iterable[str], mock: bool) -> HostView:
    """Read what the host checks compare (the NVML probe aside): the runtime's service and
    effective config, the kernel module's version file (not on the lab's mock), the CDI specs
    (for CDI strategies), the device plugin's sockets per resource."""
    svc = host.service(RUNTIME_SERVICES[decl.container_runtime])
    containerd: ContainerdView | str | None = None
    config = ""
    if decl.container_runtime == "containerd":
        containerd = containerd_view(host)
    else:
        paths = " ".join(RUNTIME_CONFIGS[decl.container_runtime])
        config = str(host.run(f"cat {paths} 2>/dev/null").stdout)
    version = None
    if not mock:
        f = host.file("/proc/driver/nvidia/version")
        version = f.content_string if f.exists else None
    strategies = set(decl.plugin_config.flags.plugin.device_list_strategy)
    dirs = tuple(sorted({*CDI_DIRS, decl.plugin_config.gpukit.cdi_spec_dir}))
    kinds: tuple[str, ...] | None = None
    if strategies & {"cdi-annotations", "cdi-cri"}:
        out = host.run("cat " + " ".join(f"{shlex.quote(d)}/*.json" for d in dirs)
                       + " 2>/dev/null")  # fmt: skip
        found = []
        for chunk in out.stdout.replace("}\n{", "}\0{").split("\0"):
            try:
                found.append(str(json.loads(chunk).get("kind", "")))
            except ValueError:
                continue
        kinds = tuple(found)
    base = decl.plugin_config.gpukit.kubelet_dir.rstrip("/")
    listening = str(host.run("ss -xlH 2>/dev/null").stdout).replace("///", "/").replace("//", "/")
    sockets: dict[str, tuple[str, str]] = {}
    for resource in resources:
        path = f"{base}/{socket_prefix(decl)}{resource.partition('/')[2]}.sock"
        f = host.file(path)
        state = ("listening" if f.exists and f.is_socket and path in listening
                 else "present, not listening" if f.exists else "absent")  # fmt: skip
        sockets[resource] = (path, state)
    return HostView(service=str(svc.name), service_running=bool(svc.is_running),
                    service_enabled=bool(svc.is_enabled), containerd=containerd,
                    runtime_config=config, kernel_version=version, cdi_dirs=dirs,
                    cdi_kinds=kinds, sockets=sockets)  # fmt: skip
