"""GFD-compatible node labels computed from the inventory, the config and the served resources.

Follows NVIDIA gpu-feature-discovery: full-GPU labels under `nvidia.com/gpu.*` (product with
spaces as dashes, `-SHARED` when time-sliced without rename, count, replicas, memory, family,
compute capability), MIG labels under the MIG resource (`nvidia.com/gpu.*` for strategy single,
`nvidia.com/mig-<profile>.*` for mixed, `+` as `.`), driver and CUDA versions, mig.capable,
mig.strategy and gpu.sharing-strategy. Values are made valid label values.

gpukit extension: with per-GPU replica counts, `<resource>.replicas` is the largest count.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

from . import label_names as ln
from .config import Config
from .inventory import Gpu, Inventory, MigDevice, arch_family
from .resources import mig_resource_name

_INVALID = re.compile(r"[^A-Za-z0-9_.-]+")
_OWNED = re.compile(
    r"^nvidia\.com/(gpu|mig-[A-Za-z0-9_.-]+)\.("
    + "|".join(re.escape(s) for s in (
        ln.PRODUCT, ln.COUNT, ln.REPLICAS, ln.FAMILY, ln.COMPUTE_MAJOR, ln.COMPUTE_MINOR,
        *ln.MIG_ATTRIBUTE_SUFFIXES))
    + r")$"
)
_OWNED_NODE_WIDE = {
    ln.MIG_CAPABLE, ln.MIG_STRATEGY, ln.MPS_CAPABLE, ln.SHARING_STRATEGY,
    ln.CUDA_DRIVER_MAJOR, ln.CUDA_DRIVER_MINOR, ln.CUDA_DRIVER_REVISION, ln.CUDA_DRIVER_FULL,
    ln.CUDA_RUNTIME_MAJOR, ln.CUDA_RUNTIME_MINOR, ln.CUDA_RUNTIME_FULL,
    ln.CUDA_DRIVER_MAJOR_DEPRECATED, ln.CUDA_DRIVER_MINOR_DEPRECATED,
    ln.CUDA_DRIVER_REV_DEPRECATED, ln.CUDA_RUNTIME_MAJOR_DEPRECATED,
    ln.CUDA_RUNTIME_MINOR_DEPRECATED,
}


def label_value(value: object) -> str:
    """A valid label value: at most 63 chars of [A-Za-z0-9_.-], alphanumeric at both ends."""
    text = _INVALID.sub("-", str(value))[:63]
    return text.strip("-_.")


def owned(name: str) -> bool:
    """Labels this labeler writes, and may therefore remove when they no longer apply."""
    return name in _OWNED_NODE_WIDE or bool(_OWNED.match(name))


def _product(*parts: str, shared: bool = False) -> str:
    words = [p.replace(" ", "-") for p in parts if p]
    if shared:
        words.append("SHARED")
    return "-".join(words)


def _sharing(config: Config, resource: str) -> tuple[int, bool]:
    """(replicas, renamed) for a resource under time-slicing; (1, False) when not shared."""
    entries = [e for e in config.time_slicing.resources if e.name == resource]
    if not entries:
        return 1, False
    return max(e.replicas for e in entries), all(e.rename for e in entries)


def _resource_labels(resource: str, values: Mapping[str, object]) -> dict[str, str]:
    return {ln.resource_label(resource, k): label_value(v) for k, v in values.items()}


def _full_gpu_labels(gpus: list[Gpu], count: int, config: Config | None) -> dict[str, str]:
    gpu = gpus[0]
    replicas, renamed = _sharing(config, ln.GPU_RESOURCE) if config else (0, False)
    shared = replicas > 1 and not renamed
    values: dict[str, object] = {
        ln.PRODUCT: _product(gpu.name, shared=shared),
        ln.COUNT: count,
        ln.REPLICAS: replicas,
    }
    if gpu.memory_mb:
        values[ln.MEMORY] = gpu.memory_mb
    if gpu.compute_major:
        values[ln.FAMILY] = arch_family(gpu.compute_major, gpu.compute_minor)
        values[ln.COMPUTE_MAJOR] = gpu.compute_major
        values[ln.COMPUTE_MINOR] = gpu.compute_minor
    return _resource_labels(ln.GPU_RESOURCE, values)


def _mig_labels(resource: str, parent: Gpu, mig: MigDevice, count: int, config: Config
                ) -> dict[str, str]:
    replicas, renamed = _sharing(config, resource)
    values: dict[str, object] = {
        ln.PRODUCT: _product(parent.name, "MIG", mig.profile, shared=replicas > 1 and not renamed),
        ln.COUNT: count,
        ln.REPLICAS: replicas,
        ln.MEMORY: mig.memory_mb,
        ln.MULTIPROCESSORS: mig.multiprocessors,
        ln.SLICES_GI: mig.slices_gi,
        ln.SLICES_CI: mig.slices_ci,
        ln.ENGINES_COPY: mig.engines_copy,
        ln.ENGINES_DECODER: mig.engines_decoder,
        ln.ENGINES_ENCODER: mig.engines_encoder,
        ln.ENGINES_JPEG: mig.engines_jpeg,
        ln.ENGINES_OFA: mig.engines_ofa,
    }
    return _resource_labels(resource, values)


def _version_labels(inv: Inventory) -> dict[str, str]:
    out: dict[str, str] = {}
    parts = inv.driver_version.split(".")
    if 2 <= len(parts) <= 3:
        major, minor = parts[0], parts[1]
        rev = parts[2] if len(parts) == 3 else ""
        out.update({
            ln.CUDA_DRIVER_MAJOR: major, ln.CUDA_DRIVER_MINOR: minor,
            ln.CUDA_DRIVER_REVISION: rev, ln.CUDA_DRIVER_FULL: inv.driver_version,
            ln.CUDA_DRIVER_MAJOR_DEPRECATED: major, ln.CUDA_DRIVER_MINOR_DEPRECATED: minor,
            ln.CUDA_DRIVER_REV_DEPRECATED: rev,
        })
    if inv.cuda_driver_version:
        cmaj, cmin = inv.cuda_version
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


def compute_labels(inv: Inventory, config: Config) -> dict[str, str]:
    """All labels for a node; empty when it has no GPUs (GFD writes none either)."""
    if not inv.gpus:
        return {}
    strategy = config.flags.mig_strategy
    labels: dict[str, str] = {
        ln.MIG_CAPABLE: str(any(g.mig_capable for g in inv.gpus)).lower(),
        ln.MPS_CAPABLE: "false",
        ln.SHARING_STRATEGY: config.sharing_strategy,
    }
    labels.update(_version_labels(inv))
    mig_mode = strategy != "none"
    full = [g for g in inv.gpus if not (mig_mode and g.mig_enabled)]
    migging = [g for g in inv.gpus if mig_mode and g.mig_enabled]
    if migging:  # MIG-enabled GPUs are labelled without sharing; full GPUs override below
        model = _most_common_model(migging)
        labels.update(_full_gpu_labels(model, sum(g.name == model[0].name for g in inv.gpus),
                                       None))
    if full:
        model = _most_common_model(full)
        labels.update(_full_gpu_labels(model, sum(g.name == model[0].name for g in inv.gpus),
                                       config))
    if mig_mode:
        labels[ln.MIG_STRATEGY] = strategy
        labels.update(_strategy_mig_labels(inv, config, migging))
    return labels


def _strategy_mig_labels(inv: Inventory, config: Config, migging: list[Gpu]) -> dict[str, str]:
    if not migging:
        return {}
    by_profile: dict[str, list[tuple[Gpu, MigDevice]]] = {}
    for gpu in migging:
        for mig in gpu.mig_devices:
            by_profile.setdefault(mig.profile, []).append((gpu, mig))
    if config.flags.mig_strategy == "single":
        invalid = (
            len(migging) != len(inv.gpus) or any(not g.mig_devices for g in migging)
            or len(by_profile) != 1
        )
        if invalid:
            return _resource_labels(ln.GPU_RESOURCE, {
                ln.PRODUCT: _product(migging[0].name, "MIG", "INVALID"),
                ln.COUNT: 0, ln.REPLICAS: 0, ln.MEMORY: 0,
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
