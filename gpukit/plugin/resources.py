"""From an inventory and a config to the resources the kubelet sees (NVIDIA's semantics).

- migStrategy none: every GPU is one `nvidia.com/gpu` (MIG mode is ignored).
- single: with any MIG-enabled GPU, all GPUs must be MIG-enabled, non-empty and of one profile;
  the MIG devices are then advertised as `nvidia.com/gpu`. Otherwise it is an error.
- mixed: MIG-disabled GPUs are `nvidia.com/gpu`, MIG devices `nvidia.com/mig-<profile>` with
  `+` replaced by `.`. (A MIG-enabled GPU with no MIG devices is skipped with a warning; NVIDIA
  refuses to start, but in gpukit that state is a MIG change in progress.)
- time-slicing and MPS: each selected device becomes `replicas` devices `<uuid>::<n>` under the
  resource's (re)name; devices not selected stay whole under the original name. MPS shares whole
  GPUs only (NVIDIA's rule), so MIG devices behind `nvidia.com/gpu` (migStrategy single) are an
  error there.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from gpukit.contracts.device_ids import mig_resource_name, replica_id
from gpukit.contracts.label_names import GPU_RESOURCE
from gpukit.contracts.plugin_config import Config, ReplicatedResource

from .devices import Gpu, MigDevice, NodeDevices

_CAP_MINOR = re.compile(r"DeviceFileMinor:\s*(\d+)")


class ResourceError(ValueError):
    """The node's devices cannot be served with this config; the message says why."""


@dataclass(frozen=True)
class Unit:
    """A physical device health is tracked for: a whole GPU or one MIG device."""

    uuid: str
    index_id: str  # "0" for a GPU, "0:1" for MIG device 1 on GPU 0
    gpu: Gpu  # the GPU itself, or the MIG device's parent
    mig: MigDevice | None = None
    device_nodes: tuple[str, ...] = ()  # container paths of its own /dev nodes

    @property
    def numa_node(self) -> int | None:
        return self.gpu.numa_node


@dataclass(frozen=True)
class PluginDevice:
    """One device ID as the kubelet sees it."""

    id: str
    unit: Unit
    replica: int | None = None  # replica number when time-sliced

    @property
    def is_replica(self) -> bool:
        return self.replica is not None


@dataclass(frozen=True)
class Resource:
    name: str
    devices: tuple[PluginDevice, ...]

    def by_id(self) -> dict[str, PluginDevice]:
        return {d.id: d for d in self.devices}

    @property
    def short_name(self) -> str:
        return self.name.partition("/")[2]


@dataclass(frozen=True)
class ResourceSet:
    resources: dict[str, Resource]
    warnings: tuple[str, ...] = ()

    def units(self) -> dict[str, Unit]:
        return {d.unit.uuid: d.unit for r in self.resources.values() for d in r.devices}


def mig_cap_nodes(gpu_minor: int, gi: int, ci: int, proc_root: str = "/") -> tuple[str, ...]:
    """/dev/nvidia-caps nodes granting access to a MIG device, as the driver lists them under
    /proc/driver/nvidia/capabilities. Empty where the driver has no such files (the lab)."""
    base = Path(proc_root) / f"proc/driver/nvidia/capabilities/gpu{gpu_minor}/mig"
    nodes: list[str] = []
    for access in (base / f"gi{gi}" / "access", base / f"gi{gi}" / f"ci{ci}" / "access"):
        try:
            m = _CAP_MINOR.search(access.read_text())
        except OSError:
            continue
        if m:
            nodes.append(f"/dev/nvidia-caps/nvidia-cap{m.group(1)}")
    return tuple(nodes)


def gpu_unit(gpu: Gpu) -> Unit:
    return Unit(uuid=gpu.uuid, index_id=str(gpu.index), gpu=gpu, device_nodes=(gpu.device_node,))


def mig_unit(gpu: Gpu, mig: MigDevice, proc_root: str = "/") -> Unit:
    nodes = (gpu.device_node, *mig_cap_nodes(gpu.minor, mig.gi, mig.ci, proc_root))
    return Unit(uuid=mig.uuid, index_id=mig.index_id, gpu=gpu, mig=mig, device_nodes=nodes)


def base_units(node_devices: NodeDevices, mig_strategy: str, proc_root: str = "/"
               ) -> tuple[dict[str, list[Unit]], list[str]]:
    """Resource name -> units, before time-slicing."""
    out: dict[str, list[Unit]] = {}
    warnings: list[str] = []
    if mig_strategy == "none" or not any(g.mig_enabled for g in node_devices.gpus):
        for gpu in node_devices.gpus:
            out.setdefault(GPU_RESOURCE, []).append(gpu_unit(gpu))
        return out, warnings
    if mig_strategy == "single":
        disabled = [g.index for g in node_devices.gpus if not g.mig_enabled]
        if disabled:
            raise ResourceError(
                "migStrategy single needs every GPU in MIG mode, but GPU(s) "
                f"{', '.join(map(str, disabled))} have MIG disabled (use mixed, or enable MIG)"
            )
        empty = [g.index for g in node_devices.gpus if not g.mig_devices]
        if empty:
            raise ResourceError(
                f"migStrategy single: MIG-enabled GPU(s) {', '.join(map(str, empty))} have no "
                "MIG devices (apply a MIG layout first)"
            )
        profiles = sorted({m.profile for m in node_devices.mig_devices()})
        if len(profiles) > 1:
            raise ResourceError(
                "migStrategy single needs one MIG profile on the node, found "
                f"{', '.join(profiles)} (use mixed, or a uniform layout)"
            )
        for gpu in node_devices.gpus:
            for mig in gpu.mig_devices:
                out.setdefault(GPU_RESOURCE, []).append(mig_unit(gpu, mig, proc_root))
        return out, warnings
    for gpu in node_devices.gpus:  # mixed
        if not gpu.mig_enabled:
            out.setdefault(GPU_RESOURCE, []).append(gpu_unit(gpu))
            continue
        if not gpu.mig_devices:
            warnings.append(f"GPU {gpu.index} ({gpu.uuid}) has MIG enabled but no MIG devices; "
                            "it serves nothing until a MIG layout is applied")
        for mig in gpu.mig_devices:
            out.setdefault(mig_resource_name(mig.profile), []).append(
                mig_unit(gpu, mig, proc_root)
            )
    return out, warnings


def _select(units: list[Unit], entry: ReplicatedResource, where: str) -> list[Unit]:
    if entry.devices.all:
        return list(units)
    if entry.devices.count:
        if entry.devices.count > len(units):
            raise ResourceError(
                f"{where}.devices: {entry.devices.count} devices of {entry.name} requested for "
                f"sharing, but the node has {len(units)}"
            )
        return units[: entry.devices.count]
    chosen: list[Unit] = []
    for ref in entry.devices.refs:
        unit = next((u for u in units if ref in (u.index_id, u.uuid)), None)
        if unit is None:
            known = ", ".join(u.index_id for u in units) or "none"
            raise ResourceError(
                f"{where}.devices: {ref!r} is not a {entry.name} device on this node "
                f"(indices: {known})"
            )
        chosen.append(unit)
    return chosen


def build_resources(node_devices: NodeDevices, config: Config, proc_root: str = "/") -> ResourceSet:
    """Raises ResourceError when the devices do not fit the strategy or the sharing config."""
    base, warnings = base_units(node_devices, config.flags.mig_strategy, proc_root)
    devices: dict[str, list[PluginDevice]] = {}
    shared_by: dict[str, str] = {}  # unit uuid -> config entry that replicated it
    replicated: dict[str, set[str]] = {}  # base resource -> uuids replicated
    mps = config.sharing_strategy == "mps"
    for i, entry in enumerate(config.sharing.resources):
        where = f"{config.sharing_path}.resources[{i}]"
        units = base.get(entry.name)
        if not units:
            continue  # like NVIDIA: sharing config for a resource this node does not have
        for unit in _select(units, entry, where):
            if mps and unit.mig is not None:
                raise ResourceError(
                    f"{where}: {entry.name} is served by MIG devices here ({unit.index_id}, "
                    f"migStrategy {config.flags.mig_strategy}); MIG devices cannot be shared "
                    "with MPS"
                )
            if unit.uuid in shared_by:
                raise ResourceError(
                    f"{where}.devices: {unit.index_id} ({unit.uuid}) is already shared by "
                    f"{shared_by[unit.uuid]}"
                )
            shared_by[unit.uuid] = where
            replicated.setdefault(entry.name, set()).add(unit.uuid)
            devices.setdefault(entry.shared_name, []).extend(
                PluginDevice(id=replica_id(unit.uuid, n), unit=unit, replica=n)
                for n in range(entry.replicas)
            )
    for name, units in base.items():
        whole = [u for u in units if u.uuid not in replicated.get(name, set())]
        if whole:
            devices.setdefault(name, [])[:0] = [PluginDevice(id=u.uuid, unit=u) for u in whole]
    resources = {
        name: Resource(name=name, devices=tuple(devs)) for name, devs in sorted(devices.items())
    }
    return ResourceSet(resources=resources, warnings=tuple(warnings))


def units_of(devices: Iterable[PluginDevice]) -> list[Unit]:
    """Distinct units behind some device IDs, in first-seen order."""
    seen: dict[str, Unit] = {}
    for d in devices:
        seen.setdefault(d.unit.uuid, d.unit)
    return list(seen.values())
