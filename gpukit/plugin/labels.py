"""GFD-compatible node labels computed from the inventory, the config and the host's sysfs.

Follows NVIDIA gpu-feature-discovery v0.20 (k8s-device-plugin internal/lm/*.go): full-GPU
labels under `nvidia.com/gpu.*` (product, `-SHARED` when time-sliced without rename, count,
replicas, sharing-strategy, memory, family, compute capability), MIG labels under the MIG
resource (`nvidia.com/gpu.*` for strategy single, `nvidia.com/mig-<profile>.*` for mixed, `+`
as `.`), driver and CUDA versions, mig.capable, mig.strategy, mps.capable, gpu.mode (PCI class
of the GPUs), gpu.machine (DMI product name), gpu.clique (the GPUs' NVLink fabric clique) and
vgpu.present. Host files are read under a
sysfs root: `GPUKIT_SYSFS_ROOT`, default `/sys`. Values are made valid label values.

gpukit extension: with per-GPU replica counts, `<resource>.replicas` is the largest count.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path

from gpukit.contracts import gpu_architectures
from gpukit.contracts import label_names as ln
from gpukit.contracts.device_ids import mig_resource_name
from gpukit.contracts.plugin_config import Config

from .devices import Gpu, MigDevice, NodeDevices

SYSFS_ROOT_ENV = "GPUKIT_SYSFS_ROOT"
DEFAULT_SYSFS_ROOT = "/sys"
UNKNOWN = "unknown"  # GFD's value for a machine type or GPU mode it cannot determine

_INVALID = re.compile(r"[^A-Za-z0-9_.-]+")
_GFD_DROPPED = re.compile(r"[^A-Za-z0-9\-_. ]")  # lm/resource.go sanitise()
_OWNED = re.compile(
    r"^nvidia\.com/(gpu|mig-[A-Za-z0-9_.-]+)\.("
    + "|".join(re.escape(s) for s in (
        ln.PRODUCT, ln.COUNT, ln.REPLICAS, ln.SHARING, ln.FAMILY, ln.COMPUTE_MAJOR,
        ln.COMPUTE_MINOR, *ln.MIG_ATTRIBUTE_SUFFIXES))
    + r")$"
)
_OWNED_NODE_WIDE = {
    ln.MIG_CAPABLE, ln.MIG_STRATEGY, ln.MPS_CAPABLE, ln.GPU_MODE, ln.GPU_MACHINE, ln.GPU_CLIQUE,
    ln.VGPU_PRESENT, ln.VGPU_HOST_DRIVER_VERSION, ln.VGPU_HOST_DRIVER_BRANCH,
    ln.CUDA_DRIVER_MAJOR, ln.CUDA_DRIVER_MINOR, ln.CUDA_DRIVER_REVISION, ln.CUDA_DRIVER_FULL,
    ln.CUDA_RUNTIME_MAJOR, ln.CUDA_RUNTIME_MINOR, ln.CUDA_RUNTIME_FULL,
    ln.CUDA_DRIVER_MAJOR_DEPRECATED, ln.CUDA_DRIVER_MINOR_DEPRECATED,
    ln.CUDA_DRIVER_REV_DEPRECATED, ln.CUDA_RUNTIME_MAJOR_DEPRECATED,
    ln.CUDA_RUNTIME_MINOR_DEPRECATED,
}

# PCI ids as go-nvlib's nvpci and GFD's vgpu package compare them
PCI_VENDOR_NVIDIA = 0x10DE
PCI_CLASS_VGA = 0x030000  # a GPU in graphics mode
PCI_CLASS_3D = 0x030200  # a GPU in compute mode
_MODES = {PCI_CLASS_VGA: "graphics", PCI_CLASS_3D: "compute"}


def label_value(value: object) -> str:
    """A valid label value: at most 63 chars of [A-Za-z0-9_.-], alphanumeric at both ends."""
    text = _INVALID.sub("-", str(value))[:63]
    return text.strip("-_.")


def gfd_sanitise(text: str) -> str:
    """GFD's sanitise(): drop characters other than [A-Za-z0-9-_. ], join the words by '-'."""
    return "-".join(_GFD_DROPPED.sub("", text).split())


def owned(name: str) -> bool:
    """Labels this labeler writes, and may therefore remove when they no longer apply."""
    return name in _OWNED_NODE_WIDE or bool(_OWNED.match(name))


def default_sysfs_root() -> str:
    """Where host sysfs is read: `GPUKIT_SYSFS_ROOT`, default /sys (the lab points it at a
    tree of its own)."""
    return os.environ.get(SYSFS_ROOT_ENV) or DEFAULT_SYSFS_ROOT


# -- host files -------------------------------------------------------------------------------


def _read(path: Path) -> str:
    return path.read_bytes().decode("utf-8", errors="replace")


def machine_type(sysfs_root: str) -> str:
    """GFD's `gpu.machine` (lm/machine-type.go): the DMI product name, sanitised; "unknown"
    when the file cannot be read."""
    try:
        text = _read(Path(sysfs_root) / "class/dmi/id/product_name")
    except OSError:
        return UNKNOWN
    return gfd_sanitise(text.strip())


def _parse_uint(text: str, bits: int) -> int:
    """Go's strconv.ParseUint(text, 0, bits): 0x/0o/0b prefixes, a leading 0 is octal."""
    if text.startswith(("+", "-")):
        raise ValueError(text)
    try:
        value = int(text, 0)
    except ValueError:
        if not (len(text) > 1 and text[0] == "0" and text.isdigit()):
            raise
        value = int(text, 8)
    if value >= 1 << bits:
        raise ValueError(text)
    return value


def pci_gpu_class(sysfs_root: str, bus_id: str) -> int | None:
    """The PCI class of the NVIDIA GPU at `bus_id` (`0000:07:00.0`), read as go-nvlib's
    nvpci.GetGPUByPciBusID reads it for GFD (vendor, class, device, numa_node and resource
    must all be readable and well formed); None where that read fails or finds no NVIDIA GPU
    (GFD's GetPCIClass errors, or dereferences the nil device it gets)."""
    dev = Path(sysfs_root) / "bus/pci/devices" / bus_id
    try:
        if _parse_uint(_read(dev / "vendor").strip(), 16) != PCI_VENDOR_NVIDIA:
            return None
        pci_class = _parse_uint(_read(dev / "class").strip(), 32)
        _parse_uint(_read(dev / "device").strip(), 16)
        int(_read(dev / "numa_node").strip(), 0)
        lines = _read(dev / "resource").strip().split("\n")
    except (OSError, ValueError):
        return None
    if any(len(line.split(" ")) != 3 for line in lines):
        return None
    return pci_class if pci_class in _MODES else None


def gpu_mode(gpus: Iterable[Gpu], sysfs_root: str) -> str:
    """GFD's `gpu.mode` (lm/nvml.go newGPUModeLabeler): "compute" when every GPU has PCI class
    0x030200, "graphics" when every one has 0x030000, else "unknown" (mixed classes, or a
    class that cannot be read)."""
    classes: set[int] = set()
    for gpu in gpus:
        pci_class = pci_gpu_class(sysfs_root, gpu.pci_bus_id) if gpu.pci_bus_id else None
        if pci_class is None:
            return UNKNOWN
        classes.add(pci_class)
    if len(classes) != 1:
        return UNKNOWN
    return _MODES[classes.pop()]


class _NoVgpuLabels(Exception):
    """GFD's vGPU scan failed: it logs the error and writes no vgpu label."""


def _vendor_capability(config: bytes) -> bytes | None:
    """The vendor-specific capability (id 0x09) of a PCI config space, walking the capability
    list as GFD's vgpu/pciutil.go does; the whole config space (256 bytes, which needs
    CAP_SYS_ADMIN) is required."""
    if len(config) < 256:
        raise _NoVgpuLabels("PCI config space not fully readable")
    if not config[0x06] & 0x10:  # status: no capability list
        return None
    visited: set[int] = set()
    pos = config[0x34]
    while pos != 0:
        cap_id, nxt, length = config[pos], config[(pos + 1) & 0xFF], config[(pos + 2) & 0xFF]
        if pos in visited or cap_id == 0xFF:  # looped or broken chain
            break
        if cap_id == 0x09:
            return config[pos:(pos + length) & 0xFF] if (pos + length) & 0xFF >= pos else None
        visited.add(pos)
        pos = nxt
    return None


def _host_driver(cap: bytes) -> tuple[str, str] | None:
    """(version, branch) from the vGPU capability's host driver record (id 0; vgpu.go
    GetInfo): 10 bytes each, NUL padded. None when there is no such record."""
    try:
        pos = 5
        record = cap[pos]
        while record != 0 and pos < len(cap):
            if cap[pos + 1] == 0:  # a zero-length record: GFD would loop forever
                return None
            pos += cap[pos + 1]
            record = cap[pos]
    except IndexError:
        return None
    if record != 0 or pos + 22 > len(cap):
        return None
    text = cap[pos + 2:pos + 22].decode("latin-1")
    return text[:10].strip("\0"), text[10:].strip("\0")


def vgpu_labels(sysfs_root: str) -> dict[str, str]:
    """GFD's `vgpu.present` (lm/vgpu.go, vgpu/vgpu.go, vgpu/pciutil.go): "true" when an NVIDIA
    PCI function carries the vGPU capability signature ("VF"), with the host driver's version
    and branch; no label at all when the scan fails (unreadable devices, or a config space
    truncated to 64 bytes for a process without CAP_SYS_ADMIN)."""
    root = Path(sysfs_root) / "bus/pci/devices"
    try:
        names = sorted(os.listdir(root))
        vgpus: list[bytes] = []
        for name in names:
            dev = root / name
            if _read(dev / "vendor").strip() != "0x10de":
                continue
            _read(dev / "class")
            cap = _vendor_capability((dev / "config").read_bytes())
            if cap is not None and len(cap) >= 5 and cap[3:5] == b"VF":
                vgpus.append(cap)
    except (OSError, _NoVgpuLabels):
        return {}
    labels = {ln.VGPU_PRESENT: str(bool(vgpus)).lower()}
    for cap in vgpus:
        # GFD stops with an error when a vGPU has no host driver record; gpukit leaves out
        # the two labels it would have written.
        info = _host_driver(cap)
        if info is not None:
            labels[ln.VGPU_HOST_DRIVER_VERSION] = label_value(info[0])
            labels[ln.VGPU_HOST_DRIVER_BRANCH] = label_value(info[1])
    return labels


def clique_labels(gpus: Iterable[Gpu]) -> dict[str, str]:
    """GFD's `gpu.clique` (lm/imex.go): `<cluster UUID>.<clique id>` of the GPUs attached to an
    NVLink fabric (registration completed with success and a non-zero cluster UUID; the others
    are left out of the count). No label when none is attached, or when the attached ones name
    more than one cluster UUID or more than one clique id."""
    attached = [g.fabric for g in gpus if g.fabric is not None and g.fabric.attached]
    clusters = {f.cluster_uuid for f in attached}
    cliques = {f.clique_id for f in attached}
    if len(clusters) != 1 or len(cliques) != 1:
        return {}
    return {ln.GPU_CLIQUE: label_value(attached[0].clique)}


# -- resources --------------------------------------------------------------------------------


def _product(*parts: str, shared: bool = False) -> str:
    """lm/resource.go getProductName: each non-empty part sanitised, joined by '-'."""
    words = [gfd_sanitise(p) for p in parts if p]
    if shared:
        words.append("SHARED")
    return "-".join(words)


def _base_values(resource: str, config: Config | None, count: int, *parts: str
                 ) -> dict[str, object]:
    """lm/resource.go baseLabeler: product, count, replicas and sharing-strategy of a
    resource. Without a config (MIG-enabled GPUs' full-GPU labels) sharing is off: replicas
    0, strategy none. Otherwise replicas is the configured count (1 when not shared), and the
    strategy is the config's only where this resource has more than one replica."""
    replicas, renamed = 0, False
    strategy = "none"
    if config is not None:
        entries = [e for e in config.sharing.resources if e.name == resource]
        replicas = max((e.replicas for e in entries), default=1)
        renamed = bool(entries) and all(e.rename for e in entries)
        if replicas > 1:
            strategy = config.sharing_strategy
    return {
        ln.PRODUCT: _product(*parts, shared=replicas > 1 and not renamed),
        ln.COUNT: count,
        ln.REPLICAS: replicas,
        ln.SHARING: strategy,
    }


def _resource_labels(resource: str, values: Mapping[str, object]) -> dict[str, str]:
    return {ln.resource_label(resource, k): label_value(v) for k, v in values.items()}


def _full_gpu_labels(gpus: list[Gpu], count: int, config: Config | None) -> dict[str, str]:
    gpu = gpus[0]
    values = _base_values(ln.GPU_RESOURCE, config, count, gpu.name)
    if gpu.memory_mb:
        values[ln.MEMORY] = gpu.memory_mb
    if gpu.compute_major:
        values[ln.FAMILY] = gpu_architectures.gfd_family(gpu.compute_major, gpu.compute_minor)
        values[ln.COMPUTE_MAJOR] = gpu.compute_major
        values[ln.COMPUTE_MINOR] = gpu.compute_minor
    return _resource_labels(ln.GPU_RESOURCE, values)


def _mig_labels(resource: str, parent: Gpu, mig: MigDevice, count: int, config: Config
                ) -> dict[str, str]:
    # GFD names a MIG device by its profile with '+' as '.' (nvml-mig-device.go GetName)
    values = _base_values(resource, config, count, parent.name, "MIG",
                          mig.profile.replace("+", "."))
    values.update({
        ln.MEMORY: mig.memory_mb,
        ln.MULTIPROCESSORS: mig.multiprocessors,
        ln.SLICES_GI: mig.slices_gi,
        ln.SLICES_CI: mig.slices_ci,
        ln.ENGINES_COPY: mig.engines_copy,
        ln.ENGINES_DECODER: mig.engines_decoder,
        ln.ENGINES_ENCODER: mig.engines_encoder,
        ln.ENGINES_JPEG: mig.engines_jpeg,
        ln.ENGINES_OFA: mig.engines_ofa,
    })
    return _resource_labels(resource, values)


def _version_labels(node_devices: NodeDevices) -> dict[str, str]:
    out: dict[str, str] = {}
    parts = node_devices.driver_version.split(".")
    if 2 <= len(parts) <= 3:
        major, minor = parts[0], parts[1]
        rev = parts[2] if len(parts) == 3 else ""
        out.update({
            ln.CUDA_DRIVER_MAJOR: major, ln.CUDA_DRIVER_MINOR: minor,
            ln.CUDA_DRIVER_REVISION: rev, ln.CUDA_DRIVER_FULL: node_devices.driver_version,
            ln.CUDA_DRIVER_MAJOR_DEPRECATED: major, ln.CUDA_DRIVER_MINOR_DEPRECATED: minor,
            ln.CUDA_DRIVER_REV_DEPRECATED: rev,
        })
    if node_devices.cuda_driver_version:
        cmaj, cmin = node_devices.cuda_version
        out.update({
            ln.CUDA_RUNTIME_MAJOR: str(cmaj), ln.CUDA_RUNTIME_MINOR: str(cmin),
            ln.CUDA_RUNTIME_FULL: f"{cmaj}.{cmin}",
            ln.CUDA_RUNTIME_MAJOR_DEPRECATED: str(cmaj),
            ln.CUDA_RUNTIME_MINOR_DEPRECATED: str(cmin),
        })
    return {k: label_value(v) for k, v in out.items()}


def _most_common_model(gpus: list[Gpu]) -> list[Gpu]:
    counts = Counter(g.name for g in gpus)
    model = max(counts, key=lambda n: (counts[n], -min(g.index for g in gpus if g.name == n)))
    return [g for g in gpus if g.name == model]


def compute_labels(node_devices: NodeDevices, config: Config, sysfs_root: str | None = None
                   ) -> dict[str, str]:
    """All labels for a node. Without GPUs only the vGPU labels, as GFD (its vGPU labeler
    runs whether or not there are devices). `sysfs_root`: default `default_sysfs_root()`."""
    root = default_sysfs_root() if sysfs_root is None else sysfs_root
    labels = vgpu_labels(root)
    if not node_devices.gpus:
        return labels
    strategy = config.flags.mig_strategy
    labels.update({
        ln.GPU_MACHINE: label_value(machine_type(root)),
        ln.MIG_CAPABLE: str(any(g.mig_capable for g in node_devices.gpus)).lower(),
        # lm/nvml.go newSharingLabeler: true only while MPS shares and no GPU is in MIG mode.
        ln.MPS_CAPABLE: str(config.sharing_strategy == "mps"
                            and not any(g.mig_enabled for g in node_devices.gpus)).lower(),
        ln.GPU_MODE: gpu_mode(node_devices.gpus, root),
    })
    labels.update(clique_labels(node_devices.gpus))
    labels.update(_version_labels(node_devices))
    # lm/mig-strategy.go newGPULabelers: whatever the strategy, MIG-enabled GPUs get the
    # full-GPU labels without sharing (replicas 0); full GPUs of a model override them.
    full = [g for g in node_devices.gpus if not g.mig_enabled]
    migging = [g for g in node_devices.gpus if g.mig_enabled]
    if migging:
        model = _most_common_model(migging)
        same = sum(g.name == model[0].name for g in node_devices.gpus)
        labels.update(_full_gpu_labels(model, same, None))
    if full:
        model = _most_common_model(full)
        same = sum(g.name == model[0].name for g in node_devices.gpus)
        labels.update(_full_gpu_labels(model, same, config))
    if strategy != "none":
        labels[ln.MIG_STRATEGY] = strategy
        labels.update(_strategy_mig_labels(node_devices, config, migging))
    return labels


def _strategy_mig_labels(node_devices: NodeDevices, config: Config, migging: list[Gpu]
                         ) -> dict[str, str]:
    if not migging:
        return {}
    by_profile: dict[str, list[tuple[Gpu, MigDevice]]] = {}
    for gpu in migging:
        for mig in gpu.mig_devices:
            by_profile.setdefault(mig.profile, []).append((gpu, mig))
    if config.flags.mig_strategy == "single":
        invalid = (
            len(migging) != len(node_devices.gpus) or any(not g.mig_devices for g in migging)
            or len(by_profile) != 1
        )
        if invalid:  # lm/mig-strategy.go newInvalidMigStrategyLabeler
            return _resource_labels(ln.GPU_RESOURCE, {
                ln.PRODUCT: _product(migging[0].name, "MIG", "INVALID"),
                ln.COUNT: 0, ln.REPLICAS: 0, ln.SHARING: "", ln.MEMORY: 0,
            })
        (profile, devices), = by_profile.items()
        return _mig_labels(ln.GPU_RESOURCE, devices[0][0], devices[0][1], len(devices), config)
    out: dict[str, str] = {}
    for profile, devices in sorted(by_profile.items()):
        out.update(_mig_labels(mig_resource_name(profile), devices[0][0], devices[0][1],
                               len(devices), config))
    return out


def label_changes(current: Mapping[str, str], wanted: Mapping[str, str]
                  ) -> dict[str, str | None]:
    """Patch for the node's labels: set what differs, remove owned labels no longer wanted."""
    patch: dict[str, str | None] = {k: v for k, v in wanted.items() if current.get(k) != v}
    patch.update({k: None for k in current if owned(k) and k not in wanted})
    return patch


def write_labels_file(labels: Mapping[str, str], path: str) -> None:
    """GFD/NFD feature-file format (`key=value` lines), replaced atomically."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.writelines(f"{k}={v}\n" for k, v in sorted(labels.items()))
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
