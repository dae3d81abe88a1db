"""nvidia-container-runtime of the gpukit lab: edits a container's OCI spec as NVIDIA's does,
then runs runc.

containerd's runc shim runs it in place of runc. On `create` it reads the bundle's
config.json, works out the GPUs the container asked for and adds what they need; every other
subcommand, and a container that asks for no GPU, goes to runc unchanged. Settings come from
/etc/nvidia-container-runtime/config.toml, with the real runtime's keys and defaults:

- `[nvidia-container-runtime] mode`: `legacy` (devices from NVIDIA_VISIBLE_DEVICES or volume
  mounts, resolved through NVML: the real runtime's prestart hook does this, the stand-in edits
  the spec itself), `cdi` (devices named in `cdi.k8s.io/*` annotations, else the same requests
  qualified with `default-kind`, resolved from the CDI specs in `spec-dirs`), `auto` (cdi when
  every request is a CDI name or CDI annotations are present, else legacy); `runtimes` (the
  low-level runtimes to look for, first found wins); `debug` (a log file).
- top level `accept-nvidia-visible-devices-envvar-when-unprivileged` (default true): false
  ignores NVIDIA_VISIBLE_DEVICES in a container without CAP_SYS_ADMIN in its bounding set;
  `accept-nvidia-visible-devices-as-volume-mounts` (default false): requests as mounts
  under /var/run/nvidia-container-devices/<id> (they take precedence over the variable).

What a GPU gets (legacy): its /dev/nvidia<minor>; a MIG device its parent's node and the
/dev/nvidia-caps nodes whose minors the driver lists in
/proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<G>/access and .../ci<C>/access; every
GPU container the control nodes that exist (nvidiactl, nvidia-uvm, nvidia-uvm-tools,
nvidia-modeset) and the driver files of its NVIDIA_DRIVER_CAPABILITIES as read-only bind
mounts. Device nodes go into linux.devices with the host node's type, major and minor, and
into linux.resources.devices as allow rules (the device cgroup).

A request that cannot be met (an unknown device, a missing CDI spec or device, a bad
config) fails the create: a message on stderr and in runc's --log file, exit status 1,
nothing started.

Standard library only, except PyYAML for YAML CDI specs (the node has python3-yaml). Roots
are injectable (Host) so tests run it against a fake /dev and /proc.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import stat
import sys
import time
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CONFIG_PATH = "/etc/nvidia-container-runtime/config.toml"
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
DRIVER_CAPABILITIES = "NVIDIA_DRIVER_CAPABILITIES"
VOLUME_MOUNTS_ROOT = "/var/run/nvidia-container-devices"
CAP_SYS_ADMIN = "CAP_SYS_ADMIN"
MODES = ("legacy", "cdi", "auto", "csv")
CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools",
                 "/dev/nvidia-modeset")  # fmt: skip
DEFAULT_CAPABILITIES = ("utility", "compute")
# The driver's user-space files by capability, as nvidia-container-cli picks them.
DRIVER_FILES: Mapping[str, tuple[str, ...]] = {
    "utility": ("/usr/bin/nvidia-smi", "/usr/bin/nvidia-debugdump",
                "/usr/bin/nvidia-persistenced",
                "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
                "/usr/lib/x86_64-linux-gnu/libnvidia-cfg.so.1"),
    "compute": ("/usr/bin/nvidia-cuda-mps-control", "/usr/bin/nvidia-cuda-mps-server",
                "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                "/usr/lib/x86_64-linux-gnu/libnvidia-ptxjitcompiler.so.1",
                "/usr/lib/x86_64-linux-gnu/libnvidia-nvvm.so.4"),
    "video": ("/usr/lib/x86_64-linux-gnu/libnvcuvid.so.1",
              "/usr/lib/x86_64-linux-gnu/libnvidia-encode.so.1"),
    "graphics": ("/usr/lib/x86_64-linux-gnu/libGLX_nvidia.so.0",
                 "/usr/lib/x86_64-linux-gnu/libEGL_nvidia.so.0"),
    "display": (),
    "compat32": (),
    "ngx": (),
}  # fmt: skip
BIND_OPTIONS = ("ro", "nosuid", "nodev", "bind")
HOOK_NAMES = ("prestart", "createRuntime", "createContainer", "startContainer", "poststart",
              "poststop")  # fmt: skip


class RuntimeFailure(Exception):
    """The container cannot be created as asked; the message says why."""


# --- configuration -------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    mode: str = "auto"
    runtimes: tuple[str, ...] = ("docker-runc", "runc", "crun")
    debug: str = ""
    spec_dirs: tuple[str, ...] = ("/etc/cdi", "/var/run/cdi")
    default_kind: str = "nvidia.com/gpu"
    annotation_prefixes: tuple[str, ...] = ("cdi.k8s.io/",)
    envvar_when_unprivileged: bool = True
    volume_mounts: bool = False
    driver_root: str = "/"


def _get(table: Mapping[str, Any], key: str, kind: type, where: str, default: Any) -> Any:
    if key not in table:
        return default
    value = table[key]
    if kind is tuple:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise RuntimeFailure(f"{where}{key} = {value!r}: expected a list of strings")
        return tuple(value)
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise RuntimeFailure(f"{where}{key} = {value!r}: expected a {kind.__name__}")
    return value


def _subtable(table: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = table.get(key, {})
    if not isinstance(value, dict):
        raise RuntimeFailure(f"{where}{key} = {value!r}: expected a table")
    return value


def load_config(text: str, path: str = CONFIG_PATH) -> Config:
    """The runtime's settings from config.toml text; unknown keys are ignored (as NVIDIA's)."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise RuntimeFailure(f"{path}: not valid TOML: {e}") from e
    d = Config()
    try:
        rt = _subtable(doc, "nvidia-container-runtime", "")
        cdi = _subtable(_subtable(rt, "modes", "nvidia-container-runtime."), "cdi",
                        "nvidia-container-runtime.modes.")  # fmt: skip
        cli = _subtable(doc, "nvidia-container-cli", "")
        p_rt, p_cdi = "nvidia-container-runtime.", "nvidia-container-runtime.modes.cdi."
        mode = _get(rt, "mode", str, p_rt, d.mode)
        if mode not in MODES:
            raise RuntimeFailure(f"{p_rt}mode = {mode!r}: expected one of {', '.join(MODES)}")
        if mode == "csv":
            raise RuntimeFailure(f"{p_rt}mode = 'csv' is for Tegra systems; this node has"
                                 " discrete GPUs (use legacy, cdi or auto)")  # fmt: skip
        kind = _get(cdi, "default-kind", str, p_cdi, d.default_kind)
        if "/" not in kind:
            raise RuntimeFailure(f"{p_cdi}default-kind = {kind!r}: expected vendor/class")
        return Config(
            mode=mode,
            runtimes=_get(rt, "runtimes", tuple, p_rt, d.runtimes),
            debug=_get(rt, "debug", str, p_rt, d.debug),
            spec_dirs=_get(cdi, "spec-dirs", tuple, p_cdi, d.spec_dirs),
            default_kind=kind,
            annotation_prefixes=_get(cdi, "annotation-prefixes", tuple, p_cdi,
                                     d.annotation_prefixes),
            envvar_when_unprivileged=_get(
                doc, "accept-nvidia-visible-devices-envvar-when-unprivileged", bool, "",
                d.envvar_when_unprivileged),
            volume_mounts=_get(doc, "accept-nvidia-visible-devices-as-volume-mounts", bool,
                               "", d.volume_mounts),
            driver_root=_get(cli, "root", str, "nvidia-container-cli.", d.driver_root),
        )
    except RuntimeFailure as e:
        raise RuntimeFailure(f"{path}: {e}") from None


# --- the host: device nodes, the driver's /proc files, NVML ---------------------------------


@dataclass(frozen=True)
class DevNode:
    type: str  # "c" or "b"
    major: int
    minor: int
    mode: int  # permission bits


@dataclass(frozen=True)
class MigDevice:
    uuid: str
    index: int  # position among the parent's MIG devices: the j of "i:j"
    gi: int
    ci: int


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    minor: int
    mig_devices: tuple[MigDevice, ...] = ()


def stat_node(path: str) -> DevNode | None:
    """The device node at `path`, or None when there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if stat.S_ISCHR(st.st_mode):
        kind = "c"
    elif stat.S_ISBLK(st.st_mode):
        kind = "b"
    else:
        return None
    return DevNode(kind, os.major(st.st_rdev), os.minor(st.st_rdev), stat.S_IMODE(st.st_mode))


NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6


def nvml_gpus(library: str = "libnvidia-ml.so.1") -> list[Gpu]:
    """The node's GPUs and MIG devices, enumerated through NVML as nvidia-container-cli does."""
    try:
        lib = ctypes.CDLL(library)
    except OSError as e:
        raise RuntimeFailure(f"cannot load NVML ({library}): {e}") from e
    lib.nvmlErrorString.restype = ctypes.c_char_p

    def call(name: str, *args: Any, ok: Iterable[int] = ()) -> int:
        rc = int(getattr(lib, name)(*args))
        if rc != NVML_SUCCESS and rc not in ok:
            msg = lib.nvmlErrorString(rc)
            raise RuntimeFailure(f"NVML {name}: {msg.decode() if msg else rc}")
        return rc

    call("nvmlInit_v2")
    try:
        count = ctypes.c_uint()
        call("nvmlDeviceGetCount_v2", ctypes.byref(count))
        gpus: list[Gpu] = []
        for i in range(count.value):
            handle = ctypes.c_void_p()
            call("nvmlDeviceGetHandleByIndex_v2", ctypes.c_uint(i), ctypes.byref(handle))
            uuid = ctypes.create_string_buffer(96)
            call("nvmlDeviceGetUUID", handle, uuid, ctypes.c_uint(96))
            minor = ctypes.c_uint()
            call("nvmlDeviceGetMinorNumber", handle, ctypes.byref(minor))
            current, pending = ctypes.c_uint(), ctypes.c_uint()
            rc = call("nvmlDeviceGetMigMode", handle, ctypes.byref(current),
                      ctypes.byref(pending), ok=(NVML_ERROR_NOT_SUPPORTED,))  # fmt: skip
            migs: list[MigDevice] = []
            if rc == NVML_SUCCESS and current.value == 1:
                slots = ctypes.c_uint()
                call("nvmlDeviceGetMaxMigDeviceCount", handle, ctypes.byref(slots))
                for slot in range(slots.value):
                    mig = ctypes.c_void_p()
                    if call("nvmlDeviceGetMigDeviceHandleByIndex", handle, ctypes.c_uint(slot),
                            ctypes.byref(mig), ok=(NVML_ERROR_NOT_FOUND,)) != NVML_SUCCESS:
                        continue  # fmt: skip
                    mig_uuid = ctypes.create_string_buffer(96)
                    call("nvmlDeviceGetUUID", mig, mig_uuid, ctypes.c_uint(96))
                    gi, ci = ctypes.c_uint(), ctypes.c_uint()
                    call("nvmlDeviceGetGpuInstanceId", mig, ctypes.byref(gi))
                    call("nvmlDeviceGetComputeInstanceId", mig, ctypes.byref(ci))
                    migs.append(MigDevice(mig_uuid.value.decode(), len(migs), gi.value, ci.value))
            gpus.append(Gpu(i, uuid.value.decode(), minor.value, tuple(migs)))
        return gpus
    finally:
        lib.nvmlShutdown()


@dataclass
class Host:
    """Where the runtime looks: `dev_root` holds dev/, `proc_root` is /proc, `driver_root` the
    driver's files; `stat` reads a device node, `discover` enumerates the GPUs (NVML)."""

    dev_root: str = "/"
    proc_root: str = "/proc"
    driver_root: str = "/"
    stat: Callable[[str], DevNode | None] = stat_node
    discover: Callable[[], list[Gpu]] = nvml_gpus
    _gpus: list[Gpu] | None = field(default=None, repr=False)

    def dev(self, path: str) -> str:
        return os.path.join(self.dev_root, path.lstrip("/"))

    def gpus(self) -> list[Gpu]:
        if self._gpus is None:
            self._gpus = self.discover()
        return self._gpus

    def cap_minor(self, gpu_minor: int, gi: int, ci: int | None = None) -> int:
        """The /dev/nvidia-caps minor the driver lists for a GPU or compute instance."""
        rel = f"driver/nvidia/capabilities/gpu{gpu_minor}/mig/gi{gi}"
        rel += f"/ci{ci}/access" if ci is not None else "/access"
        path = os.path.join(self.proc_root, rel)
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise RuntimeFailure(f"cannot read the MIG capability file /proc/{rel}: "
                                 f"{e.strerror}") from e  # fmt: skip
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "DeviceFileMinor" and value.strip().isdigit():
                return int(value)
        raise RuntimeFailure(f"/proc/{rel}: no DeviceFileMinor line")


# --- what the container asks for --------------------------------------------------------------


def env_map(spec: Mapping[str, Any]) -> dict[str, str]:
    """The process environment; a name set twice takes its last value (as exec does)."""
    out: dict[str, str] = {}
    for item in (spec.get("process") or {}).get("env") or []:
        key, sep, value = str(item).partition("=")
        if sep:
            out[key] = value
    return out


def is_privileged(spec: Mapping[str, Any]) -> bool:
    """NVIDIA's test: CAP_SYS_ADMIN in the bounding set (what --privileged gives)."""
    caps = (spec.get("process") or {}).get("capabilities") or {}
    return CAP_SYS_ADMIN in (caps.get("bounding") or [])


def _split(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def devices_from_envvar(env: Mapping[str, str]) -> list[str]:
    if VISIBLE_DEVICES in env:
        return _split(env[VISIBLE_DEVICES])
    # A legacy CUDA image (CUDA_VERSION without NVIDIA_REQUIRE_CUDA) gets every GPU.
    if "CUDA_VERSION" in env and "NVIDIA_REQUIRE_CUDA" not in env:
        return ["all"]
    return []


def devices_from_mounts(spec: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    for m in spec.get("mounts") or []:
        dest = str(m.get("destination", ""))
        if dest.startswith(VOLUME_MOUNTS_ROOT + "/"):
            name = dest[len(VOLUME_MOUNTS_ROOT) + 1:].strip("/")
            if name:
                out.append(name)
    return out


def requested_devices(spec: Mapping[str, Any], cfg: Config) -> tuple[list[str], list[str]]:
    """(devices asked for, notes): volume mounts first when accepted, else the variable unless
    the container is unprivileged and the config refuses the variable for such containers."""
    notes: list[str] = []
    if cfg.volume_mounts:
        mounted = devices_from_mounts(spec)
        if mounted:
            return mounted, notes
    from_env = devices_from_envvar(env_map(spec))
    if not from_env:
        return [], notes
    if cfg.envvar_when_unprivileged or is_privileged(spec):
        return from_env, notes
    notes.append(f"ignoring {VISIBLE_DEVICES} in an unprivileged container"
                 " (accept-nvidia-visible-devices-envvar-when-unprivileged = false)")  # fmt: skip
    return [], notes


def cdi_annotation_devices(spec: Mapping[str, Any], cfg: Config) -> list[str]:
    out: list[str] = []
    for key, value in sorted((spec.get("annotations") or {}).items()):
        if any(key.startswith(p) for p in cfg.annotation_prefixes):
            for name in _split(str(value)):
                if not is_qualified(name):
                    raise RuntimeFailure(f"annotation {key}: {name!r} is not a qualified CDI"
                                         " device name (vendor.com/class=name)")  # fmt: skip
                out.append(name)
    return out


def is_qualified(name: str) -> bool:
    kind, sep, dev = name.partition("=")
    vendor, slash, cls = kind.partition("/")
    return bool(sep and slash and dev and vendor and cls)


def resolve_mode(cfg: Config, spec: Mapping[str, Any]) -> str:
    if cfg.mode != "auto":
        return cfg.mode
    if cdi_annotation_devices(spec, cfg):
        return "cdi"
    asked = devices_from_envvar(env_map(spec))
    if asked and all(is_qualified(d) for d in asked):
        return "cdi"
    return "legacy"


# --- spec edits --------------------------------------------------------------------------------


@dataclass
class Edits:
    """What gets added to the spec; kept in order, deduplicated by container path."""

    devices: dict[str, tuple[str, DevNode, str]] = field(default_factory=dict)  # path: host..
    mounts: dict[str, dict[str, Any]] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    hooks: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def device(self, host: Host, path: str, host_path: str | None = None,
               permissions: str = "rwm") -> None:  # fmt: skip
        source = host_path or host.dev(path)
        node = host.stat(source)
        if node is None:
            raise RuntimeFailure(f"device node {source} does not exist on this node")
        self.devices[path] = (source, node, permissions)

    def bind(self, source: str, dest: str, options: Sequence[str] = BIND_OPTIONS,
             kind: str = "bind") -> None:  # fmt: skip
        self.mounts[dest] = {"destination": dest, "type": kind, "source": source,
                             "options": list(options)}  # fmt: skip

    def summary(self) -> str:
        parts = [f"devices {' '.join(self.devices) or '-'}"]
        if self.mounts:
            parts.append(f"mounts {' '.join(self.mounts)}")
        if self.env:
            parts.append(f"env {' '.join(f'{k}={v}' for k, v in self.env.items())}")
        if self.hooks:
            parts.append(f"hooks {' '.join(h['path'] for _, h in self.hooks)}")
        return ", ".join(parts)


def _find_gpu(gpus: Sequence[Gpu], request: str) -> tuple[Gpu, MigDevice | None]:
    for gpu in gpus:
        if request == gpu.uuid or (request.isdigit() and int(request) == gpu.index):
            return gpu, None
        for mig in gpu.mig_devices:
            if request == mig.uuid or request == f"{gpu.index}:{mig.index}":
                return gpu, mig
    raise RuntimeFailure(f"device error: {request}: unknown device")


def _add_gpu(edits: Edits, host: Host, gpu: Gpu, mig: MigDevice | None) -> None:
    edits.device(host, f"/dev/nvidia{gpu.minor}")
    if mig is not None:
        for minor in (host.cap_minor(gpu.minor, mig.gi), host.cap_minor(gpu.minor, mig.gi,
                                                                          mig.ci)):
            edits.device(host, f"/dev/nvidia-caps/nvidia-cap{minor}")


def driver_capabilities(env: Mapping[str, str]) -> tuple[str, ...]:
    raw = env.get(DRIVER_CAPABILITIES)
    if raw is None or not raw.strip():
        return DEFAULT_CAPABILITIES
    caps = _split(raw)
    if "all" in caps:
        return tuple(DRIVER_FILES)
    unknown = [c for c in caps if c not in DRIVER_FILES]
    if unknown:
        raise RuntimeFailure(f"{DRIVER_CAPABILITIES}: unknown capability {unknown[0]!r}"
                             f" (known: all, {', '.join(DRIVER_FILES)})")  # fmt: skip
    return tuple(caps)


def legacy_edits(spec: Mapping[str, Any], requests: Sequence[str], host: Host) -> Edits:
    edits = Edits()
    if not requests or requests == ["void"]:
        return edits
    wanted = [r for r in requests if r not in ("none", "void")]
    if "all" in wanted:
        for gpu in host.gpus():
            _add_gpu(edits, host, gpu, None)
            for mig in gpu.mig_devices:
                _add_gpu(edits, host, gpu, mig)
    else:
        gpus = host.gpus() if wanted else []
        for request in wanted:
            _add_gpu(edits, host, *_find_gpu(gpus, request))
    for node in CONTROL_NODES:
        if host.stat(host.dev(node)) is not None:
            edits.device(host, node)
    for cap in driver_capabilities(env_map(spec)):
        for path in DRIVER_FILES[cap]:
            source = os.path.join(host.driver_root, path.lstrip("/"))
            if os.path.exists(source):
                edits.bind(source, path)
    return edits


# --- CDI -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CdiDevice:
    name: str  # qualified: vendor.com/class=name
    spec_path: str
    spec_edits: Mapping[str, Any]
    edits: Mapping[str, Any]


def _load_spec_file(path: Path) -> Any:
    text = path.read_text()
    if path.suffix == ".json":
        return json.loads(text)
    import yaml  # PyYAML: python3-yaml on the node

    return yaml.safe_load(text)


def load_cdi(dirs: Sequence[str]) -> tuple[dict[str, CdiDevice], list[str]]:
    """Every device the spec dirs define (a later dir wins a name clash, as in CDI's cache);
    specs that cannot be read are skipped and reported."""
    devices: dict[str, CdiDevice] = {}
    problems: list[str] = []
    for d in dirs:
        directory = Path(d)
        if not directory.is_dir():
            continue
        for path in sorted(directory.iterdir()):
            if path.suffix not in (".json", ".yaml", ".yml") or not path.is_file():
                continue
            try:
                doc = _load_spec_file(path)
                kind = doc["kind"]
                if not isinstance(kind, str) or "/" not in kind:
                    raise ValueError(f"kind {kind!r} is not vendor/class")
                spec_edits = doc.get("containerEdits") or {}
                for dev in doc.get("devices") or []:
                    name = f"{kind}={dev['name']}"
                    devices[name] = CdiDevice(name, str(path), spec_edits,
                                              dev.get("containerEdits") or {})  # fmt: skip
            except Exception as e:  # any broken spec: skipped like CDI's cache does
                problems.append(f"{path}: {type(e).__name__}: {e}")
    return devices, problems


def _apply_cdi(edits: Edits, host: Host, ce: Mapping[str, Any], where: str) -> None:
    for item in ce.get("env") or []:
        key, _, value = str(item).partition("=")
        edits.env[key] = value
    for dn in ce.get("deviceNodes") or []:
        path = dn.get("path")
        if not path:
            raise RuntimeFailure(f"{where}: a deviceNode without a path")
        source = dn.get("hostPath") or path
        if dn.get("major") is not None and dn.get("minor") is not None:
            # A complete node needs no host lookup (CDI fills in only what is missing).
            node: DevNode | None = DevNode(dn.get("type") or "c", int(dn["major"]),
                                           int(dn["minor"]), int(dn.get("fileMode") or 0o666))
        else:
            node = host.stat(source)
        if node is None:
            raise RuntimeFailure(f"{where}: device node {source} does not exist on this node")
        edits.devices[path] = (source, node, dn.get("permissions") or "rwm")
    for m in ce.get("mounts") or []:
        edits.bind(m["hostPath"], m["containerPath"], m.get("options") or BIND_OPTIONS,
                   m.get("type") or "bind")  # fmt: skip
    for h in ce.get("hooks") or []:
        name = h.get("hookName")
        if name not in HOOK_NAMES:
            raise RuntimeFailure(f"{where}: unknown hookName {name!r}")
        hook = {k: h[k] for k in ("path", "args", "env", "timeout") if h.get(k) is not None}
        if (name, hook) not in edits.hooks:
            edits.hooks.append((name, hook))


def cdi_edits(spec: Mapping[str, Any], cfg: Config, host: Host) -> Edits:
    names = cdi_annotation_devices(spec, cfg)
    if not names:
        requests, _ = requested_devices(spec, cfg)
        if any(r in ("none", "void") for r in requests):
            requests = []
        names = [r if is_qualified(r) else f"{cfg.default_kind}={r}" for r in requests]
    edits = Edits()
    if not names:
        return edits
    known, problems = load_cdi(cfg.spec_dirs)
    missing = [n for n in dict.fromkeys(names) if n not in known]
    if missing:
        detail = f" (unreadable specs: {'; '.join(problems)})" if problems else ""
        raise RuntimeFailure(f"unresolvable CDI devices {', '.join(missing)} in"
                             f" {', '.join(cfg.spec_dirs)}{detail}")  # fmt: skip
    applied_specs: set[str] = set()
    for name in dict.fromkeys(names):
        dev = known[name]
        if dev.spec_path not in applied_specs:
            applied_specs.add(dev.spec_path)
            _apply_cdi(edits, host, dev.spec_edits, dev.spec_path)
        _apply_cdi(edits, host, dev.edits, f"{dev.spec_path}: {name}")
    return edits


# --- the OCI spec ------------------------------------------------------------------------------


def apply(spec: dict[str, Any], edits: Edits) -> None:
    linux = spec.setdefault("linux", {})
    devices = [d for d in linux.get("devices") or [] if d.get("path") not in edits.devices]
    rules = list((linux.get("resources") or {}).get("devices") or [])
    for path, (_, node, perms) in edits.devices.items():
        devices.append({"path": path, "type": node.type, "major": node.major,
                        "minor": node.minor, "fileMode": node.mode, "uid": 0, "gid": 0})
        rule = {"allow": True, "type": node.type, "major": node.major, "minor": node.minor,
                "access": perms}  # fmt: skip
        if rule not in rules:
            rules.append(rule)
    if edits.devices:
        linux["devices"] = devices
        linux.setdefault("resources", {})["devices"] = rules
    if edits.mounts:
        mounts = [m for m in spec.get("mounts") or [] if m.get("destination") not in edits.mounts]
        spec["mounts"] = mounts + list(edits.mounts.values())
    if edits.env:
        process = spec.setdefault("process", {})
        kept = [e for e in process.get("env") or [] if e.partition("=")[0] not in edits.env]
        process["env"] = kept + [f"{k}={v}" for k, v in edits.env.items()]
    for name, hook in edits.hooks:
        spec.setdefault("hooks", {}).setdefault(name, []).append(hook)


def modify(spec: dict[str, Any], cfg: Config, host: Host) -> tuple[str, Edits, list[str]]:
    """Edit an OCI spec in place for the GPUs it asks for: (mode used, edits, notes)."""
    mode = resolve_mode(cfg, spec)
    notes: list[str] = []
    if mode == "cdi":
        edits = cdi_edits(spec, cfg, host)
    else:
        requests, notes = requested_devices(spec, cfg)
        edits = legacy_edits(spec, requests, host)
    apply(spec, edits)
    return mode, edits, notes


# --- command line ------------------------------------------------------------------------------


def _is_bundle_flag(arg: str) -> bool:
    return arg in ("-b", "--bundle", "-bundle")


def is_create(args: Sequence[str]) -> bool:
    """runc's `create` subcommand among its global flags (a bundle dir named `create` is not)."""
    after_bundle = False
    for a in args:
        if not after_bundle and _is_bundle_flag(a):
            after_bundle = True
            continue
        if not after_bundle and a == "create":
            return True
        after_bundle = False
    return False


def bundle_dir(args: Sequence[str]) -> str:
    for i, a in enumerate(args):
        if _is_bundle_flag(a) and i + 1 < len(args):
            return args[i + 1]
        for flag in ("-b=", "--bundle=", "-bundle="):
            if a.startswith(flag):
                return a[len(flag):]
    return os.getcwd()


def _option(args: Sequence[str], name: str) -> str | None:
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a[len(name) + 1:]
    return None


def find_runtime(candidates: Sequence[str]) -> str:
    path = os.environ.get("PATH", "") + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin"
    for name in candidates:
        if os.path.isabs(name):
            if os.access(name, os.X_OK):
                return name
            continue
        found = shutil.which(name, path=path)
        if found:
            return found
    raise RuntimeFailure(f"no low-level runtime found (tried {', '.join(candidates)})")


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class Log:
    """The config's `debug` file: one line per invocation, one per container edited."""

    def __init__(self, path: str) -> None:
        self.path = path

    def write(self, line: str) -> None:
        if not self.path:
            return
        try:
            with open(self.path, "a") as fh:
                fh.write(f"{_now()} {line}\n")
        except OSError:
            pass


def _report(args: Sequence[str], message: str, log: Log) -> None:
    """A failure on stderr, in the debug log and in runc's --log file (where containerd's shim
    looks for the reason a create failed)."""
    print(f"nvidia-container-runtime: {message}", file=sys.stderr)
    log.write(f"nvidia-container-runtime: error: {message}")
    runc_log = _option(args, "--log")
    if runc_log:
        try:
            with open(runc_log, "a") as fh:
                fh.write(json.dumps({"level": "error", "msg": f"nvidia-container-runtime:"
                                     f" {message}", "time": _now()}) + "\n")  # fmt: skip
        except OSError:
            pass


def run(
    args: Sequence[str],
    config_path: str = CONFIG_PATH,
    host: Host | None = None,
    execv: Callable[[str, list[str]], Any] = os.execv,
) -> int:
    """What the binary does: edit the bundle on `create`, then exec the low-level runtime."""
    log = Log("")
    try:
        try:
            text = Path(config_path).read_text()
        except FileNotFoundError:
            text = ""
        cfg = load_config(text, config_path)
        log = Log(cfg.debug)
        log.write(f"nvidia-container-runtime {' '.join(args)}")
        runtime = find_runtime(cfg.runtimes)
        if is_create(args):
            bundle = Path(bundle_dir(args))
            config_json = bundle / "config.json"
            try:
                spec = json.loads(config_json.read_text())
            except (OSError, ValueError) as e:
                raise RuntimeFailure(f"cannot read the OCI spec {config_json}: {e}") from e
            host = host or Host(driver_root=cfg.driver_root)
            mode, edits, notes = modify(spec, cfg, host)
            for note in notes:
                log.write(f"nvidia-container-runtime: {bundle.name}: {note}")
            if edits.devices or edits.mounts or edits.env or edits.hooks:
                tmp = config_json.with_name(".config.json.nvidia")
                tmp.write_text(json.dumps(spec))
                os.replace(tmp, config_json)
                log.write(f"nvidia-container-runtime: {bundle.name}: mode {mode}:"
                          f" {edits.summary()}")  # fmt: skip
    except RuntimeFailure as e:
        _report(args, str(e), log)
        return 1
    execv(runtime, [runtime, *args])
    return 0


def config_path() -> str:
    """NVIDIA's lookup: $XDG_CONFIG_HOME/nvidia-container-runtime/config.toml when set."""
    xdg = os.environ.get("XDG_CONFIG_HOME")
    return os.path.join(xdg, "nvidia-container-runtime/config.toml") if xdg else CONFIG_PATH


def main() -> None:
    sys.exit(run(sys.argv[1:], config_path()))


if __name__ == "__main__":
    main()
