"""The suite's oracle: what a node must serve, computed from its declaration alone.

The device plugin config is the model's parse (`gpukit.contracts.plugin_config`), the MIG
geometry comes from `gpukit.contracts.mig_profiles`; deliberately not the agent's resource or
label builders (gpukit.plugin), because the suite checks what those produce:

    from gpukit import inventory
    from gpukit.conformance import expect

    node = inventory.load("inventories/lab").node("gpu-t4")
    expect.expected_resources(node)   # {"nvidia.com/gpu": 8}
    expect.expected_labels(node)      # {"nvidia.com/gpu.product": "Tesla-T4-SHARED", ...}

A declaration the agent could not serve as declared (migStrategy single over mixed profiles,
time-slicing a device the node lacks) raises InventoryError naming host, variable and value.
Imports only the declaration model's types (gpukit.inventory.model, .problems) and gpukit.contracts;
only the suite and the declaration check (gpukit.inventory.check) import it
(tests/unit/test_import_direction.py).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from gpukit.contracts import dra
from gpukit.contracts import label_names as ln
from gpukit.contracts.device_ids import mig_resource_name
from gpukit.inventory.model import GPU_RESOURCE, GpuMig, NodeDecl
from gpukit.inventory.problems import InventoryError, Problem

_INVALID_LABEL_CHARS = re.compile(r"[^A-Za-z0-9_.-]+")
_INVALID_PRODUCT_CHARS = re.compile(r"[^A-Za-z0-9_. -]+")
_UUID_REF = re.compile(r"^(GPU|MIG)-")
# Below this a replica's MPS memory share holds little beyond a CUDA context (a few hundred
# MiB of the client's own); such a layout is a slip (replicas meant for a bigger GPU).
MPS_MIN_SHARE_MIB = 1024


@dataclass(frozen=True)
class ExpectedUnit:
    """One physical device (a whole GPU or a MIG device) as the node must advertise it."""

    resource: str  # the advertised resource name (after time-slicing rename)
    base_resource: str  # before time-slicing
    gpu_index: int | None  # None: selected by UUID, not knowable from the inventory
    mig_profile: str | None = None
    replicas: int = 1  # > 1: time-sliced into this many device IDs


def _qualify(name: str) -> str:
    return name if "/" in name else f"{ln.RESOURCE_PREFIX}{name}"


def _declaration_error(decl: NodeDecl, variable: str, value: object, message: str
                       ) -> InventoryError:
    return InventoryError([Problem(decl.host, variable, value, message)])


def _base_units(decl: NodeDecl) -> list[ExpectedUnit]:
    strategy = decl.mig_strategy
    gpus = decl.mig_gpus or tuple(GpuMig(i, False) for i in range(decl.gpu.count))
    whole = [ExpectedUnit(GPU_RESOURCE, GPU_RESOURCE, g.index) for g in gpus]
    if strategy == "none" or not any(g.mig_enabled for g in gpus):
        return whole
    if strategy == "single":
        disabled = [g.index for g in gpus if not g.mig_enabled]
        empty = [g.index for g in gpus if g.mig_enabled and not g.profiles]
        kinds = sorted({p for g in gpus for p in g.profiles})
        problem = ""
        if disabled:
            problem = f"leaves MIG disabled on GPU(s) {disabled}"
        elif empty:
            problem = f"enables MIG without MIG devices on GPU(s) {empty}"
        elif len(kinds) != 1:
            problem = f"mixes MIG profiles {kinds}"
        if problem:
            raise _declaration_error(
                decl, "gpukit_mig_config", decl.mig_config_name,
                f"{problem}, but device plugin config {decl.plugin_config_name!r} uses "
                "migStrategy single (every GPU in MIG mode with one profile; use mixed)")
        return [ExpectedUnit(GPU_RESOURCE, GPU_RESOURCE, g.index, p)
                for g in gpus for p in g.profiles]
    out: list[ExpectedUnit] = []
    for g in gpus:  # mixed
        if not g.mig_enabled:
            out.append(ExpectedUnit(GPU_RESOURCE, GPU_RESOURCE, g.index))
            continue
        for p in g.profiles:
            out.append(ExpectedUnit(mig_resource_name(p), mig_resource_name(p), g.index, p))
    return out


def expected_units(decl: NodeDecl) -> list[ExpectedUnit]:
    """Every device the node must serve, with its resource and time-slicing replicas."""
    base = _base_units(decl)
    ts = decl.plugin_config.sharing
    taken: set[int] = set()  # positions in `base` already shared
    out = list(base)
    var = (f"gpukit_device_plugin_configs.{decl.plugin_config_name}."
           f"{decl.plugin_config.sharing_path}")
    for i, entry in enumerate(ts.resources):
        name = _qualify(entry.name)
        positions = [j for j, u in enumerate(base) if u.base_resource == name]
        if not positions:
            continue  # like NVIDIA's plugin: sharing for a resource the node does not have
        where = f"{var}.resources[{i}].devices"
        if entry.devices.all:
            chosen = positions
        elif entry.devices.count:
            if entry.devices.count > len(positions):
                raise _declaration_error(decl, where, entry.devices.count,
                                         f"shares more {name} devices than the node has "
                                         f"({len(positions)})")
            chosen = positions[: entry.devices.count]
        else:
            chosen = []
            for ref in entry.devices.refs:
                pick = _pick(base, positions, chosen, ref)
                if pick is None:
                    raise _declaration_error(decl, where, ref,
                                             f"is not a {name} device of this node")
                chosen.append(pick)
        if decl.plugin_config.sharing_strategy == "mps":
            _check_mps_share(decl, f"{var}.resources[{i}]", entry.replicas,
                             [base[j] for j in chosen])
        rename = entry.rename or (f"{name}.shared" if ts.rename_by_default else name)
        for j in chosen:
            if j in taken:
                raise _declaration_error(decl, where, list(entry.devices.refs),
                                         "shares a device that another entry already shares")
            taken.add(j)
            u = base[j]
            gpu_index = None if _UUID_REF.match(_ref_of(entry.devices.refs, j, chosen)) else (
                u.gpu_index)
            out[j] = ExpectedUnit(_qualify(rename), name, gpu_index, u.mig_profile,
                                  entry.replicas)
    return out


def _check_mps_share(decl: NodeDecl, where: str, replicas: int, units: list[ExpectedUnit]
                     ) -> None:
    """MPS shares whole GPUs only (NVIDIA's rule), each replica a real share of memory."""
    migs = [u for u in units if u.mig_profile]
    if migs:
        raise _declaration_error(
            decl, f"{where}.name", migs[0].base_resource,
            f"is served by MIG devices on this node ({migs[0].mig_profile}, migStrategy "
            f"{decl.mig_strategy}); MIG devices cannot be shared with MPS")
    memory = decl.gpu.memory_mib
    if memory and memory // replicas < MPS_MIN_SHARE_MIB:
        raise _declaration_error(
            decl, f"{where}.replicas", replicas,
            f"leaves each MPS client {memory // replicas} MiB of the {memory} MiB of "
            f"{decl.gpu.product}, below the {MPS_MIN_SHARE_MIB} MiB floor")


def _ref_of(refs: Sequence[str], j: int, chosen: list[int]) -> str:
    if not refs or j not in chosen:
        return ""
    pos = chosen.index(j)
    return refs[pos] if pos < len(refs) else ""


def _pick(base: list[ExpectedUnit], positions: list[int], chosen: list[int], ref: str
          ) -> int | None:
    free = [j for j in positions if j not in chosen]
    if ref.isdigit():
        return next((j for j in free if base[j].gpu_index == int(ref)
                     and base[j].mig_profile is None), None)
    if ":" in ref and not _UUID_REF.match(ref):
        gpu_index = int(ref.split(":", 1)[0])
        return next((j for j in free if base[j].gpu_index == gpu_index
                     and base[j].mig_profile is not None), None)
    return free[0] if free else None  # a UUID: which device is unknowable, the count is not


def expected_resources(decl: NodeDecl) -> dict[str, int]:
    """Resource name -> count the node's capacity and allocatable must show (none on a DRA
    node: its GPUs are ResourceSlice devices, `expected_dra_devices`)."""
    if decl.dra:
        return {}
    out: dict[str, int] = {}
    for u in expected_units(decl):
        out[u.resource] = out.get(u.resource, 0) + u.replicas
    return dict(sorted(out.items()))


def shared_resources(decl: NodeDecl) -> dict[str, tuple[int, ...]]:
    """Time-sliced resource -> replicas of each of its devices (for spread checks); none on a
    DRA node (the device plugin's time-slicing does not apply: a claim shares a GPU)."""
    if decl.dra:
        return {}
    out: dict[str, list[int]] = {}
    for u in expected_units(decl):
        if u.replicas > 1:
            out.setdefault(u.resource, []).append(u.replicas)
    return {k: tuple(v) for k, v in sorted(out.items())}


def replicas_per_gpu(decl: NodeDecl, resource: str) -> dict[int, int]:
    """GPU index -> device IDs of `resource` that live on it (replicas summed)."""
    out: dict[int, int] = {}
    for u in expected_units(decl):
        if u.resource == resource and u.gpu_index is not None:
            out[u.gpu_index] = out.get(u.gpu_index, 0) + u.replicas
    return dict(sorted(out.items()))


def mps_gpu_indexes(decl: NodeDecl) -> list[int]:
    """The GPUs a node shares through MPS (each has its MPS daemon, in EXCLUSIVE_PROCESS
    compute mode while it serves); none unless the node's config shares with MPS."""
    if decl.dra or decl.plugin_config.sharing_strategy != "mps":
        return []
    return sorted({u.gpu_index for u in expected_units(decl)
                   if u.replicas > 1 and u.gpu_index is not None})


@dataclass(frozen=True)
class MpsShare:
    """What a container holding one MPS replica of `resource` is given, as NVIDIA's device
    plugin sets it: its GPU's memory and threads divided by the replicas."""

    replicas: int

    def memory_limit(self, gpu_memory_mib: int) -> str:
        """CUDA_MPS_PINNED_DEVICE_MEM_LIMIT for a GPU of `gpu_memory_mib` (the client's
        device 0)."""
        return f"0={gpu_memory_mib // self.replicas}M"

    @property
    def thread_percentage(self) -> str:
        """CUDA_MPS_ACTIVE_THREAD_PERCENTAGE."""
        return str(max(1, 100 // self.replicas))


def mps_share(decl: NodeDecl, resource: str) -> MpsShare | None:
    """None: a container of `resource` on this node is no MPS client."""
    if decl.dra or decl.plugin_config.sharing_strategy != "mps":
        return None
    replicas, _ = _sharing_of(decl, resource)
    return MpsShare(replicas) if replicas > 1 else None


def label_value(value: object) -> str:
    """A label value as GFD writes it: invalid characters as '-', <= 63 chars."""
    return _INVALID_LABEL_CHARS.sub("-", str(value))[:63].strip("-_.")


def product_value(*parts: str, shared: bool = False) -> str:
    """A product label as GFD writes it (lm/resource.go): each part's invalid characters
    dropped, words joined by '-', then '-SHARED' when time-sliced without rename."""
    words = ["-".join(_INVALID_PRODUCT_CHARS.sub("", p).split()) for p in parts if p]
    return label_value("-".join(words + (["SHARED"] if shared else [])))


def _sharing_of(decl: NodeDecl, resource: str) -> tuple[int, bool]:
    sharing = decl.plugin_config.sharing
    entries = [e for e in sharing.resources if _qualify(e.name) == resource]
    if not entries:
        return 1, False
    renamed = all(e.rename or sharing.rename_by_default for e in entries)
    return max(e.replicas for e in entries), renamed


def expected_labels(decl: NodeDecl) -> dict[str, str]:
    """GFD labels the node must carry (those the declaration determines), name -> value."""
    gpu = decl.gpu
    if gpu.count == 0 or decl.dra:  # DRA: the device plugin's GFD labels are not served
        return {}
    strategy = decl.mig_strategy
    units = _base_units(decl)  # raises for inconsistent declarations
    table = gpu.mig_table
    labels: dict[str, str] = {
        ln.MIG_CAPABLE: "true" if table is not None else "false",
    }
    mig_on = strategy != "none" and any(g.mig_enabled for g in decl.mig_gpus)
    # GFD's sharing labeler: MPS-capable only while MPS shares and no GPU is in MIG mode.
    labels[ln.MPS_CAPABLE] = str(decl.plugin_config.sharing_strategy == "mps"
                                 and not any(g.mig_enabled for g in decl.mig_gpus)).lower()
    if decl.driver_branch:
        labels[ln.CUDA_DRIVER_MAJOR] = decl.driver_branch
    if strategy != "none":
        labels[ln.MIG_STRATEGY] = strategy
    # GFD labels MIG-enabled GPUs as whole GPUs without sharing (replicas 0, strategy none,
    # under every migStrategy); a GPU with MIG disabled overrides that with its own sharing.
    gpus = decl.mig_gpus or tuple(GpuMig(i, False) for i in range(gpu.count))
    replicas, renamed = (_sharing_of(decl, GPU_RESOURCE)
                         if any(not g.mig_enabled for g in gpus) else (0, False))
    if strategy == "single" and mig_on:
        profile = units[0].mig_profile
        assert profile is not None and table is not None
        labels.update(_mig_labels(decl, GPU_RESOURCE, profile, len(units)))
        return labels
    labels[ln.GPU_COUNT] = str(gpu.count)
    labels[ln.GPU_PRODUCT] = product_value(
        gpu.product, shared=replicas > 1 and not renamed)
    labels[ln.GPU_REPLICAS] = str(replicas)
    labels[ln.SHARING_STRATEGY] = _sharing_strategy(decl, replicas)
    if gpu.memory_mib:
        labels[ln.GPU_MEMORY] = str(gpu.memory_mib)
    if mig_on:
        counts = Counter(u.mig_profile for u in units if u.mig_profile)
        for profile, n in sorted(counts.items()):
            assert profile is not None
            labels.update(_mig_labels(decl, mig_resource_name(profile), profile, n))
    return labels


def _sharing_strategy(decl: NodeDecl, replicas: int) -> str:
    """Per resource, as GFD: the config's strategy only where that resource has several
    replicas."""
    return decl.plugin_config.sharing_strategy if replicas > 1 else "none"


def _mig_labels(decl: NodeDecl, resource: str, profile: str, count: int) -> dict[str, str]:
    table = decl.gpu.mig_table
    assert table is not None
    p = table.gpu_instance_profile(profile)
    replicas, renamed = _sharing_of(decl, resource)
    values = {
        # GFD names the profile with '+' as '.' (1g.5gb+me -> 1g.5gb.me).
        "product": product_value(decl.gpu.product, "MIG", p.name.replace("+", "."),
                                 shared=replicas > 1 and not renamed),
        "count": str(count),
        "replicas": str(replicas),
        "sharing-strategy": _sharing_strategy(decl, replicas),
        "memory": str(p.memory_mb),
        "multiprocessors": str(p.multiprocessors),
        "slices.gi": str(p.compute_slices),
        "slices.ci": str(p.compute_slices),
    }
    return {f"{resource}.{k}": v for k, v in values.items()}


# -- DRA: the node's ResourceSlice devices (driver gpu.nvidia.com) ---------------------------

DRA_DRIVER = dra.DRIVER


@dataclass(frozen=True)
class ExpectedDraDevice:
    """One device a DRA node's ResourceSlices must publish, as NVIDIA's driver describes it:
    a whole GPU (`gpu-<minor>`) or a MIG device of the declared layout
    (`gpu-<minor>-mig-<profile without dots>-<GI profile id>-<placement start>`). The minor
    and the placement are the node's; the rest follows from the declaration."""

    type: str  # "gpu" | "mig"
    gpu_index: int  # the GPU, or the MIG device's parent
    product: str
    profile: str | None = None
    memory_mib: int | None = None  # capacity `memory`, when the declaration implies it
    multiprocessors: int | None = None
    name_pattern: str = ""  # a regular expression the device's name must match
    shares: int | None = None  # gpukit_dra_shares: claims that may share it (capacity `shares`)

    def attributes(self) -> dict[str, dict[str, object]]:
        """Attributes the device must carry, in the ResourceSlice's form."""
        out: dict[str, dict[str, object]] = {"type": {"string": self.type},
                                             "productName": {"string": self.product}}
        if self.type == "gpu":
            out["index"] = {"int": self.gpu_index}
        else:
            out["parentIndex"] = {"int": self.gpu_index}
            out["profile"] = {"string": self.profile}
        return out

    def capacity(self) -> dict[str, str]:
        """Capacity values (BinarySI quantities as the API writes them) it must carry."""
        out: dict[str, str] = {}
        if self.memory_mib:
            out["memory"] = (f"{self.memory_mib // 1024}Gi" if self.memory_mib % 1024 == 0
                             else f"{self.memory_mib}Mi")
        if self.multiprocessors is not None:
            out["multiprocessors"] = str(self.multiprocessors)
        if self.shares:
            out[dra.SHARES_CAPACITY] = str(self.shares)
        return out

    def describe(self) -> str:
        return (f"GPU {self.gpu_index} ({self.product})" if self.type == "gpu"
                else f"MIG {self.profile} on GPU {self.gpu_index}")


def expected_dra_devices(decl: NodeDecl) -> list[ExpectedDraDevice]:
    """The devices a DRA node's ResourceSlices must publish: each GPU whole, a MIG-enabled
    GPU's MIG devices of the declared layout instead (the device plugin config's migStrategy
    does not apply), each with a `shares` capacity when the node is declared shared. None for a
    device plugin node."""
    if not decl.dra:
        return []
    gpu = decl.gpu
    gpus = decl.mig_gpus or tuple(GpuMig(i, False) for i in range(gpu.count))
    table = gpu.mig_table
    out: list[ExpectedDraDevice] = []
    for g in gpus:
        if not g.mig_enabled:
            out.append(ExpectedDraDevice("gpu", g.index, gpu.product, None, gpu.memory_mib,
                                         None, dra.device_name_pattern(), decl.dra_shares))
            continue
        assert table is not None  # the model refuses MIG on a product without a table
        for name in g.profiles:
            p = table.gpu_instance_profile(name)
            out.append(ExpectedDraDevice("mig", g.index, gpu.product, name, p.memory_mb,
                                         p.multiprocessors,
                                         dra.device_name_pattern(name, p.driver_id),
                                         decl.dra_shares))
    return out
