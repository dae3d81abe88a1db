"""Device plugin configuration: NVIDIA k8s-device-plugin `version: v1` schema plus gpukit fields.

Users bring their existing NVIDIA config files unchanged; gpukit-only settings live under a
top-level `gpukit:` key, which NVIDIA's parser ignores, so one file serves both plugins.

Precedence (as in NVIDIA's plugin): command-line flag > environment variable > file > default.
Overrides are merged into the raw document before validation, so an invalid value reports the
same field path whether it came from the file, a flag or the environment (plus where it came from).

Extension over NVIDIA: `sharing.timeSlicing.resources` (and `sharing.mps.resources`) may list the
same `name` more than once with disjoint `devices`, giving per-GPU replica counts (selected GPUs
shared, the others whole).

`sharing.mps` takes NVIDIA's shape unchanged (the same replicated-resources schema as
timeSlicing); as in NVIDIA's plugin, `failRequestsGreaterThanOne` defaults to true there, and MIG
devices cannot be shared with MPS. A config sharing with both is refused: NVIDIA's plugin would
silently use MPS and drop the time-slicing entries.
"""

from __future__ import annotations

import copy
import difflib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

VERSION = "v1"
RESOURCE_PREFIX = "nvidia.com"
SHARED_SUFFIX = ".shared"
MAX_RESOURCE_NAME_LENGTH = 63

MIG_STRATEGIES = ("none", "single", "mixed")
DEVICE_LIST_STRATEGIES = ("envvar", "volume-mounts", "cdi-annotations", "cdi-cri")
DEVICE_ID_STRATEGIES = ("uuid", "index")
REPLICA_POLICIES = ("distributed", "packed")
# NVIDIA's list of application XIDs: the GPU itself is fine after these.
DEFAULT_IGNORED_XIDS = (13, 31, 43, 45, 68, 109)
# What NVIDIA's k8s-device-plugin leaves on a node (internal/plugin/server.go,
# cmd/nvidia-device-plugin/plugin-manager.go): a socket nvidia-<name>.sock per resource in the
# kubelet's device-plugins directory, and CDI specs of vendor k8s.device-plugin.nvidia.com
# (kind <vendor>/gpu for its GPUs). gpukit's agent: gpukit-<name>.sock, kind nvidia.com/gpu.
NVIDIA_PLUGIN_SOCKET_PREFIX = "nvidia-"
NVIDIA_PLUGIN_CDI_VENDOR = "k8s.device-plugin.nvidia.com"
GPUKIT_AGENT_SOCKET_PREFIX = "gpukit-"
# Replicas per device: a node's largest resource (16 GPUs x 7 MIG devices) at this count
# still lists in one ListAndWatch message under gRPC's default 4 MiB limit (tests prove it).
MAX_REPLICAS = 256
DEFAULT_KUBELET_DIR = "/var/lib/kubelet/device-plugins"
DEFAULT_CDI_DIR = "/var/run/cdi"
DEFAULT_CDI_ANNOTATION_PREFIX = "cdi.k8s.io/"
DEFAULT_METRICS_ADDRESS = "127.0.0.1:9402"
# NVIDIA's `flags.mpsRoot` default: per-GPU pipe and log directories and the shared /dev/shm.
DEFAULT_MPS_ROOT = "/run/nvidia/mps"
# NVIDIA's MPS guide (Limitations): an MPS server serves at most 48 client contexts per device.
MAX_MPS_CLIENTS = 48

_DNS_LABEL_CHARS = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_GPU_UUID = re.compile(r"^GPU-[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$")
_MIG_UUID = re.compile(
    r"^MIG-([0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}|GPU-[0-9a-fA-F-]{36}/\d+/\d+)$"
)
_MIG_INDEX = re.compile(r"^\d+:\d+$")

# Keys NVIDIA's schema knows but gpukit does not act on: accepted so existing files load.
_NVIDIA_FLAGS_IGNORED = {
    "restartOnDeviceUnhealthy", "nvidiaDevRoot", "gdsEnabled", "mofedEnabled",
    "gdrcopyEnabled", "useNodeFeatureAPI", "deviceDiscoveryStrategy", "gfd",
}
_NVIDIA_PLUGIN_FLAGS_IGNORED = {"nvidiaCTKPath", "containerDriverRoot", "nvidiaCDIHookPath"}


class ConfigError(ValueError):
    """One or more invalid settings; each message starts with the field path."""

    def __init__(self, problems: Sequence[str], source: str = "") -> None:
        self.problems = list(problems)
        self.source = source
        where = f" in {source}" if source else ""
        if len(self.problems) == 1:  # one problem, one line (logs, Events, --check-config)
            super().__init__(f"invalid device plugin config{where}: {self.problems[0]}")
        else:
            super().__init__(f"invalid device plugin config{where}:\n  "
                             + "\n  ".join(self.problems))


@dataclass(frozen=True)
class PluginFlags:
    pass_device_specs: bool = False
    device_list_strategy: tuple[str, ...] = ("envvar",)
    device_id_strategy: str = "uuid"
    cdi_annotation_prefix: str = DEFAULT_CDI_ANNOTATION_PREFIX


@dataclass(frozen=True)
class Flags:
    mig_strategy: str = "none"
    fail_on_init_error: bool = True
    nvidia_driver_root: str = "/"
    mps_root: str = DEFAULT_MPS_ROOT
    plugin: PluginFlags = field(default_factory=PluginFlags)


@dataclass(frozen=True)
class ReplicaDevices:
    """Which devices of a resource are shared: all, the first `count`, or listed refs.

    A ref is a GPU index ("0"), a MIG index ("0:1"), or a GPU/MIG UUID.
    """

    all: bool = True
    count: int = 0
    refs: tuple[str, ...] = ()


@dataclass(frozen=True)
class ReplicatedResource:
    name: str
    replicas: int
    rename: str = ""
    devices: ReplicaDevices = field(default_factory=ReplicaDevices)

    @property
    def shared_name(self) -> str:
        """Resource name the replicas are advertised under."""
        return self.rename or self.name


@dataclass(frozen=True)
class ReplicatedResources:
    """NVIDIA's ReplicatedResources: how `sharing.timeSlicing` or `sharing.mps` shares."""

    rename_by_default: bool = False
    fail_requests_greater_than_one: bool = False
    resources: tuple[ReplicatedResource, ...] = ()


@dataclass(frozen=True)
class HealthSettings:
    ignored_xids: tuple[int, ...] = DEFAULT_IGNORED_XIDS
    # Seconds without a new critical XID (and a passing probe) before a device is Healthy
    # again; None keeps it Unhealthy until the plugin restarts (NVIDIA's behaviour).
    recovery_seconds: float | None = 60.0
    probe_interval_seconds: float = 5.0
    disabled: bool = False


@dataclass(frozen=True)
class GpukitSettings:
    device_root: str | None = None  # host prefix of /dev nodes; None: flags.nvidiaDriverRoot
    device_root_in_plugin: str | None = None  # where this process sees that tree; None: same
    kubelet_dir: str = DEFAULT_KUBELET_DIR
    cdi_spec_dir: str = DEFAULT_CDI_DIR
    metrics_address: str = DEFAULT_METRICS_ADDRESS
    replica_policy: str = "distributed"
    rescan_interval_seconds: float = 10.0
    health: HealthSettings = field(default_factory=HealthSettings)


@dataclass(frozen=True)
class Config:
    version: str = VERSION
    flags: Flags = field(default_factory=Flags)
    time_slicing: ReplicatedResources = field(default_factory=ReplicatedResources)
    mps: ReplicatedResources | None = None
    gpukit: GpukitSettings = field(default_factory=GpukitSettings)
    warnings: tuple[str, ...] = ()

    @property
    def device_root(self) -> str:
        return self.gpukit.device_root or self.flags.nvidia_driver_root or "/"

    @property
    def device_root_in_plugin(self) -> str:
        return self.gpukit.device_root_in_plugin or self.device_root

    @property
    def sharing(self) -> ReplicatedResources:
        """The replicated resources of the sharing in force (MPS or time-slicing)."""
        return self.mps if self.mps is not None else self.time_slicing

    @property
    def sharing_path(self) -> str:
        """Where `sharing` came from in the document, for messages."""
        return "sharing.mps" if self.mps is not None else "sharing.timeSlicing"

    @property
    def sharing_strategy(self) -> str:
        """GFD's `nvidia.com/gpu.sharing-strategy` value."""
        if self.mps is not None and self.mps.resources:
            return "mps"
        return "time-slicing" if self.time_slicing.resources else "none"


# --------------------------------------------------------------------------------------------
# Raw-document handling


def qualify_resource_name(name: str) -> str:
    """`gpu` -> `nvidia.com/gpu`, like NVIDIA's NewResourceName."""
    return name if name.startswith(RESOURCE_PREFIX + "/") else f"{RESOURCE_PREFIX}/{name}"


def resource_name_problem(name: str) -> str | None:
    """Why `name` (fully qualified) is not a valid extended resource name, or None."""
    if len(name) > MAX_RESOURCE_NAME_LENGTH:
        return f"{name!r} is longer than {MAX_RESOURCE_NAME_LENGTH} characters"
    _, _, short = name.partition("/")
    if not short or not _DNS_LABEL_CHARS.match(short):
        return (
            f"{name!r} is not a valid resource name (lower-case letters, digits, '-' and '.', "
            "starting and ending with a letter or digit)"
        )
    return None


def merge_documents(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge override into a copy of base (mappings merge, everything else replaces)."""
    out: dict[str, Any] = copy.deepcopy(dict(base))
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge_documents(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def set_path(doc: dict[str, Any], dotted: str, value: Any) -> None:
    """Set `a.b.c` in a nested dict, creating mappings on the way."""
    parts = dotted.split(".")
    cur = doc
    for part in parts[:-1]:
        nxt = cur.get(part)
        if not isinstance(nxt, dict):
            nxt = {}
            cur[part] = nxt
        cur = nxt
    cur[parts[-1]] = value


def load_document(path: Path) -> dict[str, Any]:
    """Read a YAML/JSON config file into a mapping; errors name the file and what is wrong."""
    from gpukit.contracts import bounded_yaml  # PyYAML only when a file is read (agent start-up)

    try:
        text = bounded_yaml.read_text(path)
    except OSError as exc:
        raise ConfigError([f"cannot read config file: {exc.strerror or exc}"], str(path)) from exc
    except bounded_yaml.UnreadableText as exc:
        raise ConfigError([f"<root>: refused, the file is {exc}"], str(path)) from None
    return require_content(parse_document(text, str(path)), str(path))


def require_content(doc: dict[str, Any], source: str = "") -> dict[str, Any]:
    """A named config must say something: an empty file or ConfigMap entry is a mistake (a
    truncated write, a templating slip), not a request for defaults. Taking it as defaults
    silently turned a time-sliced node's 8 GPUs back into 2 under running pods."""
    if not doc:
        raise ConfigError(["<root>: the config is empty (an empty config is not taken as "
                           "defaults; write 'version: v1' for NVIDIA's defaults)"], source)
    return doc


def parse_document(text: str, source: str = "") -> dict[str, Any]:
    import yaml

    from gpukit.contracts import bounded_yaml

    try:
        doc = bounded_yaml.load(text)
    except bounded_yaml.BoundExceeded as exc:
        raise ConfigError([f"<root>: refused, the document is {exc}"], source) from exc
    except yaml.YAMLError as exc:
        raise ConfigError([f"malformed YAML: {exc}"], source) from exc
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError([f"<root>: expected a mapping, got {type(doc).__name__}"], source)
    return doc


# --------------------------------------------------------------------------------------------
# Validation


class _Reader:
    """Collects problems while reading typed values out of the raw document."""

    def __init__(self, origins: Mapping[str, str]) -> None:
        self.problems: list[str] = []
        self.warnings: list[str] = []
        self.origins = origins

    def fail(self, path: str, message: str) -> None:
        origin = self.origins.get(path)
        suffix = f" (from {origin})" if origin else ""
        self.problems.append(f"{path}: {message}{suffix}")

    def mapping(self, value: Any, path: str) -> Mapping[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.fail(path, f"expected a mapping, got {value!r}")
            return {}
        return value

    def check_keys(
        self, doc: Mapping[str, Any], path: str, known: set[str], ignored: set[str]
    ) -> None:
        """Keys NVIDIA's schema knows but gpukit does not use are warnings; anything else is an
        error: a typo such as `timeSlicng` would otherwise silently turn sharing off."""
        for key in doc:
            if key in known:
                continue
            where = f"{path}.{key}" if path else str(key)
            if key in ignored:
                self.warnings.append(f"{where}: accepted but not used by gpukit")
                continue
            close = difflib.get_close_matches(str(key), sorted(known | ignored), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            self.fail(where, f"unknown field ({hint}known: {', '.join(sorted(known))})")

    def boolean(self, value: Any, path: str, default: bool) -> bool:
        if value is None:
            return default
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0"):
            return value.strip().lower() in ("true", "1")
        self.fail(path, f"{value!r} is not a boolean (true or false)")
        return default

    def choice(self, value: Any, path: str, choices: Sequence[str], default: str) -> str:
        if value is None:
            return default
        if not isinstance(value, str) or value not in choices:
            self.fail(path, f"{value!r} is not one of {', '.join(choices)}")
            return default
        return value

    def string(self, value: Any, path: str, default: str) -> str:
        if value is None:
            return default
        if not isinstance(value, str):
            self.fail(path, f"{value!r} is not a string")
            return default
        return value

    def number(
        self, value: Any, path: str, default: float, minimum: float = 0.0
    ) -> float:
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(
                value):
            self.fail(path, f"{value!r} is not a number")
            return default
        if value < minimum:
            self.fail(path, f"{value!r} is not >= {minimum:g}")
            return default
        return float(value)


def parse_config(
    doc: Mapping[str, Any], source: str = "", origins: Mapping[str, str] | None = None
) -> Config:
    """Validate a raw document and build a Config; raises ConfigError listing every problem."""
    r = _Reader(origins or {})
    r.check_keys(
        doc, "", {"version", "flags", "sharing", "gpukit"}, {"resources", "imex", "health"}
    )
    version = doc.get("version", VERSION)
    if version is None:
        version = VERSION
    if version != VERSION:
        r.fail("version", f"{version!r} is not supported (only {VERSION!r})")
    flags = _parse_flags(r, r.mapping(doc.get("flags"), "flags"))
    sharing = r.mapping(doc.get("sharing"), "sharing")
    r.check_keys(sharing, "sharing", {"timeSlicing", "mps"}, set())
    ts = _parse_replicated_resources(r, sharing.get("timeSlicing"), "sharing.timeSlicing")
    mps = None
    if sharing.get("mps") is not None:
        mps = _parse_replicated_resources(r, sharing.get("mps"), "sharing.mps", mps=True)
        if ts.resources:
            r.fail("sharing", "both timeSlicing and mps share devices; a GPU is shared one way "
                   "(NVIDIA's plugin would use mps and silently drop timeSlicing)")
    gk = _parse_gpukit(r, r.mapping(doc.get("gpukit"), "gpukit"))
    if r.problems:
        raise ConfigError(r.problems, source)
    return Config(
        version=VERSION, flags=flags, time_slicing=ts, mps=mps, gpukit=gk,
        warnings=tuple(r.warnings),
    )


def _parse_flags(r: _Reader, doc: Mapping[str, Any]) -> Flags:
    r.check_keys(
        doc, "flags", {"migStrategy", "failOnInitError", "nvidiaDriverRoot", "mpsRoot", "plugin"},
        _NVIDIA_FLAGS_IGNORED,
    )
    plugin = r.mapping(doc.get("plugin"), "flags.plugin")
    r.check_keys(
        plugin, "flags.plugin",
        {"passDeviceSpecs", "deviceListStrategy", "deviceIDStrategy", "cdiAnnotationPrefix"},
        _NVIDIA_PLUGIN_FLAGS_IGNORED,
    )
    return Flags(
        mig_strategy=r.choice(doc.get("migStrategy"), "flags.migStrategy", MIG_STRATEGIES, "none"),
        fail_on_init_error=r.boolean(doc.get("failOnInitError"), "flags.failOnInitError", True),
        nvidia_driver_root=r.string(doc.get("nvidiaDriverRoot"), "flags.nvidiaDriverRoot", "/"),
        mps_root=_parse_mps_root(r, doc.get("mpsRoot"), "flags.mpsRoot"),
        plugin=PluginFlags(
            pass_device_specs=r.boolean(
                plugin.get("passDeviceSpecs"), "flags.plugin.passDeviceSpecs", False
            ),
            device_list_strategy=_parse_list_strategy(
                r, plugin.get("deviceListStrategy"), "flags.plugin.deviceListStrategy"
            ),
            device_id_strategy=r.choice(
                plugin.get("deviceIDStrategy"), "flags.plugin.deviceIDStrategy",
                DEVICE_ID_STRATEGIES, "uuid",
            ),
            cdi_annotation_prefix=r.string(
                plugin.get("cdiAnnotationPrefix"), "flags.plugin.cdiAnnotationPrefix",
                DEFAULT_CDI_ANNOTATION_PREFIX,
            ),
        ),
    )


def _parse_list_strategy(r: _Reader, value: Any, path: str) -> tuple[str, ...]:
    if value is None:
        return ("envvar",)
    # NVIDIA accepts a single string, a list, or (from the CLI/env) a comma-separated string.
    items: list[Any]
    if isinstance(value, str):
        items = [v.strip() for v in value.split(",") if v.strip()]
    elif isinstance(value, list):
        items = value
    else:
        r.fail(path, f"{value!r} is not a string or a list of strings")
        return ("envvar",)
    if not items:
        r.fail(path, "must name at least one strategy")
        return ("envvar",)
    out: list[str] = []
    for i, item in enumerate(items):
        if item not in DEVICE_LIST_STRATEGIES:
            r.fail(f"{path}[{i}]", f"{item!r} is not one of {', '.join(DEVICE_LIST_STRATEGIES)}")
        elif item in out:
            r.fail(f"{path}[{i}]", f"{item!r} is listed twice")
        else:
            out.append(item)
    return tuple(out) or ("envvar",)


def _parse_mps_root(r: _Reader, value: Any, path: str) -> str:
    root = r.string(value, path, DEFAULT_MPS_ROOT)
    if not root.startswith("/"):
        r.fail(path, f"{root!r} is not an absolute path")
        return DEFAULT_MPS_ROOT
    return root


def _parse_replicated_resources(
    r: _Reader, value: Any, path: str, mps: bool = False
) -> ReplicatedResources:
    if value is None:
        return ReplicatedResources()
    doc = r.mapping(value, path)
    r.check_keys(
        doc, path, {"renameByDefault", "failRequestsGreaterThanOne", "resources", "strategy"},
        set(),
    )
    if doc.get("strategy") not in (None, ""):
        r.fail(f"{path}.strategy", f"{doc.get('strategy')!r} is not supported (leave it unset)")
    rename_by_default = r.boolean(doc.get("renameByDefault"), f"{path}.renameByDefault", False)
    # NVIDIA keeps MPS's historical default: one replica per container unless relaxed.
    fail_gt_one = r.boolean(
        doc.get("failRequestsGreaterThanOne"), f"{path}.failRequestsGreaterThanOne", mps
    )
    raw = doc.get("resources")
    if not isinstance(raw, list) or not raw:
        r.fail(f"{path}.resources", "no resources specified (need a non-empty list)")
        return ReplicatedResources(rename_by_default, fail_gt_one, ())
    parsed = [
        (i, res)
        for i, item in enumerate(raw)
        if (res := _parse_replicated(r, item, f"{path}.resources[{i}]", rename_by_default))
    ]
    _check_replica_overlaps(r, parsed, f"{path}.resources")
    if mps:
        _check_mps_resources(r, parsed, f"{path}.resources")
    return ReplicatedResources(rename_by_default, fail_gt_one, tuple(res for _, res in parsed))


def _check_mps_resources(
    r: _Reader, parsed: list[tuple[int, ReplicatedResource]], path: str
) -> None:
    for pos, res in parsed:
        if res.name.partition("/")[2].startswith("mig-"):
            r.fail(f"{path}[{pos}].name", f"{res.name!r}: MIG devices cannot be shared with MPS "
                   "(NVIDIA's plugin refuses it too; share them with timeSlicing)")
        if res.replicas > MAX_MPS_CLIENTS:
            r.fail(f"{path}[{pos}].replicas", f"{res.replicas} is more than {MAX_MPS_CLIENTS}, "
                   "the clients an MPS server serves per GPU")


def _parse_replicated(
    r: _Reader, value: Any, path: str, rename_by_default: bool
) -> ReplicatedResource | None:
    doc = r.mapping(value, path)
    if not doc:
        r.fail(path, "expected a mapping with name and replicas")
        return None
    r.check_keys(doc, path, {"name", "rename", "devices", "replicas"}, set())
    ok = True
    raw_name = doc.get("name")
    name = ""
    if not isinstance(raw_name, str) or not raw_name:
        r.fail(f"{path}.name", "no resource name specified")
        ok = False
    else:
        name = qualify_resource_name(raw_name)
        problem = resource_name_problem(name)
        short = name.partition("/")[2]
        if problem:
            r.fail(f"{path}.name", problem)
            ok = False
        elif short != "gpu" and not short.startswith("mig-"):
            r.fail(f"{path}.name", f"{name!r} is not served by this plugin (nvidia.com/gpu or "
                   "nvidia.com/mig-<profile>)")
            ok = False
    replicas = doc.get("replicas")
    if replicas is None:
        r.fail(f"{path}.replicas", "no replicas specified")
        ok = False
    elif isinstance(replicas, bool) or not isinstance(replicas, int):
        r.fail(f"{path}.replicas", f"{replicas!r} is not an integer")
        ok = False
    elif replicas < 2:
        r.fail(f"{path}.replicas", f"{replicas} is not >= 2")
    elif replicas > MAX_REPLICAS:
        r.fail(f"{path}.replicas", f"{replicas} is more than {MAX_REPLICAS}, the most gpukit "
               "serves (ListAndWatch must fit gRPC's 4 MiB message limit with 16 GPUs x 7 "
               "MIG devices)")
        ok = False
    rename = ""
    raw_rename = doc.get("rename")
    if raw_rename is not None:
        if not isinstance(raw_rename, str) or not raw_rename:
            r.fail(f"{path}.rename", f"{raw_rename!r} is not a resource name")
            ok = False
        else:
            rename = qualify_resource_name(raw_rename)
            problem = resource_name_problem(rename)
            if problem:
                r.fail(f"{path}.rename", problem)
                ok = False
    elif rename_by_default and name:
        rename = name + SHARED_SUFFIX
    devices = _parse_replica_devices(r, doc.get("devices", "all"), f"{path}.devices")
    if devices is None or not ok:
        return None
    assert isinstance(replicas, int)
    return ReplicatedResource(name=name, replicas=replicas, rename=rename, devices=devices)


def _parse_replica_devices(r: _Reader, value: Any, path: str) -> ReplicaDevices | None:
    if value == "all":
        return ReplicaDevices(all=True)
    if isinstance(value, str):
        r.fail(path, f"{value!r} is not valid: the only string allowed is 'all'")
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        if value <= 0:
            r.fail(path, f"{value} is not a device count > 0")
            return None
        return ReplicaDevices(all=False, count=value)
    if isinstance(value, list) and value:
        refs: list[str] = []
        for i, item in enumerate(value):
            ref = str(item) if isinstance(item, int) and not isinstance(item, bool) else item
            if isinstance(item, int) and not isinstance(item, bool) and item < 0:
                r.fail(f"{path}[{i}]", f"{item} is not a GPU index")
                return None
            if not isinstance(ref, str) or not (
                ref.isdigit() or _MIG_INDEX.match(ref) or _GPU_UUID.match(ref)
                or _MIG_UUID.match(ref)
            ):
                r.fail(f"{path}[{i}]", f"{item!r} is not a GPU index, MIG index (i:j) or UUID")
                return None
            if ref in refs:
                r.fail(f"{path}[{i}]", f"{ref!r} is listed twice")
                return None
            refs.append(ref)
        return ReplicaDevices(all=False, refs=tuple(refs))
    r.fail(path, f"{value!r} is not 'all', a device count, or a non-empty list of devices")
    return None


def _check_replica_overlaps(
    r: _Reader, parsed: list[tuple[int, ReplicatedResource]], path: str
) -> None:
    # gpukit extension: the same resource may appear more than once (per-GPU replica counts),
    # but then each entry must list its devices, and no device may be shared twice.
    by_name: dict[str, list[tuple[int, ReplicatedResource]]] = {}
    for pos, res in parsed:
        by_name.setdefault(res.name, []).append((pos, res))
    for entries in by_name.values():
        if len(entries) < 2:
            continue
        seen: dict[str, int] = {}
        for pos, res in entries:
            if not res.devices.refs:
                r.fail(f"{path}[{pos}].devices", f"{res.name} is listed more than once, so each "
                       "entry must list its devices (indices or UUIDs), not 'all' or a count")
                continue
            for ref in res.devices.refs:
                if ref in seen:
                    r.fail(f"{path}[{pos}].devices", f"device {ref!r} is already shared by "
                           f"{path}[{seen[ref]}]")
                seen[ref] = pos


def _parse_gpukit(r: _Reader, doc: Mapping[str, Any]) -> GpukitSettings:
    known = {
        "deviceRoot", "deviceRootInPlugin", "kubeletDir", "cdiSpecDir", "metricsAddress",
        "replicaPolicy", "rescanIntervalSeconds", "health",
    }
    r.check_keys(doc, "gpukit", known, set())
    health = r.mapping(doc.get("health"), "gpukit.health")
    r.check_keys(
        health, "gpukit.health",
        {"ignoredXids", "recoverySeconds", "probeIntervalSeconds", "disabled"}, set(),
    )
    root = doc.get("deviceRoot")
    root_in_plugin = doc.get("deviceRootInPlugin")
    recovery_raw = health.get("recoverySeconds", 60.0)
    recovery = (
        None if recovery_raw is None
        else r.number(recovery_raw, "gpukit.health.recoverySeconds", 60.0)
    )
    return GpukitSettings(
        device_root=r.string(root, "gpukit.deviceRoot", "") or None,
        device_root_in_plugin=r.string(root_in_plugin, "gpukit.deviceRootInPlugin", "") or None,
        kubelet_dir=r.string(doc.get("kubeletDir"), "gpukit.kubeletDir", DEFAULT_KUBELET_DIR),
        cdi_spec_dir=r.string(doc.get("cdiSpecDir"), "gpukit.cdiSpecDir", DEFAULT_CDI_DIR),
        metrics_address=_parse_address(r, doc.get("metricsAddress"), "gpukit.metricsAddress"),
        replica_policy=r.choice(
            doc.get("replicaPolicy"), "gpukit.replicaPolicy", REPLICA_POLICIES, "distributed"
        ),
        rescan_interval_seconds=r.number(
            doc.get("rescanIntervalSeconds"), "gpukit.rescanIntervalSeconds", 10.0
        ),
        health=HealthSettings(
            ignored_xids=_parse_xids(r, health.get("ignoredXids"), "gpukit.health.ignoredXids"),
            recovery_seconds=recovery,
            probe_interval_seconds=r.number(
                health.get("probeIntervalSeconds"), "gpukit.health.probeIntervalSeconds", 5.0,
                minimum=0.05,
            ),
            disabled=r.boolean(health.get("disabled"), "gpukit.health.disabled", False),
        ),
    )


def _parse_xids(r: _Reader, value: Any, path: str) -> tuple[int, ...]:
    if value is None:
        return DEFAULT_IGNORED_XIDS
    items: list[Any]
    if isinstance(value, str):  # from the environment: "13,31,43"
        items = [v.strip() for v in value.split(",") if v.strip()]
    elif isinstance(value, list):
        items = value
    else:
        r.fail(path, f"{value!r} is not a list of XID numbers")
        return DEFAULT_IGNORED_XIDS
    out: list[int] = []
    for i, item in enumerate(items):
        # An integer, or digits (from the environment); not 13.5, .inf, true or "x".
        if isinstance(item, str) and item.isdigit():
            item = int(item)
        if isinstance(item, bool) or not isinstance(item, int) or item < 0:
            r.fail(f"{path}[{i}]", f"{item!r} is not an XID number")
            continue
        out.append(item)
    return tuple(sorted(set(out)))


def parse_host_port(value: str) -> tuple[str, int]:
    """`host:port`, `:port` (all interfaces) or `[v6]:port` -> (host, port)."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{value!r} is not host:port")
    return host.strip("[]") or "0.0.0.0", int(port)


def _parse_address(r: _Reader, value: Any, path: str) -> str:
    text = r.string(value, path, DEFAULT_METRICS_ADDRESS)
    if text == "":
        return ""  # disabled
    try:
        parse_host_port(text)
    except ValueError as exc:
        r.fail(path, f"{exc} (use host:port, or '' to disable)")
        return DEFAULT_METRICS_ADDRESS
    return text
