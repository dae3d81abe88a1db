"""Allocate: check the requested device IDs and say how the container gets them.

The response forms follow NVIDIA's plugin so the NVIDIA container toolkit (or CDI) in the
runtime acts on them unchanged:
- envvar: NVIDIA_VISIBLE_DEVICES=<ids> (UUIDs or indices per deviceIDStrategy);
- volume-mounts: NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices plus one /dev/null
  mount per id under that directory;
- cdi-annotations: `<prefix>gpukit-device-plugin_<uuid>: nvidia.com/gpu=<id>,...`;
- cdi-cri: CDIDevice entries in the response;
- passDeviceSpecs: DeviceSpecs for the GPU's /dev nodes and the driver's control nodes, host
  paths under the configured device root; none when every strategy is a CDI one (as NVIDIA's
  plugin: the CDI spec carries the nodes).
"""

from __future__ import annotations

import os
import uuid as uuidlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gpukit.contracts import label_names
from gpukit.contracts.plugin_config import Config

from .mps import MpsLayout, MpsRequestError, mps_answer
from .resources import PluginDevice, Resource, units_of

VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"
VOLUME_MOUNTS_ROOT = "/var/run/nvidia-container-devices"
VOLUME_MOUNTS_HOST_PATH = "/dev/null"
CDI_KIND = label_names.CDI_KIND
CDI_STRATEGIES = frozenset({"cdi-annotations", "cdi-cri"})
CDI_ANNOTATION_PLUGIN = "gpukit-device-plugin"
# Driver nodes every GPU container needs; included only when present on the host (like NVIDIA).
CONTROL_NODES = (
    "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset",
)


class AllocationError(ValueError):
    """The kubelet asked for something this resource cannot give; maps to INVALID_ARGUMENT."""


@dataclass(frozen=True)
class Mount:
    container_path: str
    host_path: str
    read_only: bool = False


@dataclass(frozen=True)
class DeviceNode:
    container_path: str
    host_path: str
    permissions: str = "rw"


@dataclass
class ContainerAllocation:
    envs: dict[str, str] = field(default_factory=dict)
    mounts: list[Mount] = field(default_factory=list)
    devices: list[DeviceNode] = field(default_factory=list)
    annotations: dict[str, str] = field(default_factory=dict)
    cdi_devices: list[str] = field(default_factory=list)


def host_path(root: str, container_path: str) -> str:
    return os.path.join(root, container_path.lstrip("/"))


def cdi_name(device_name: str) -> str:
    return f"{CDI_KIND}={device_name}"


class Allocator:
    """Per-resource allocation logic; immutable, rebuilt when the resource or config changes."""

    def __init__(
        self,
        resource: Resource,
        config: Config,
        exists: Callable[[str], bool] = os.path.exists,
        response_id: Callable[[], str] = lambda: str(uuidlib.uuid4()),
        mps: MpsLayout | None = None,
    ) -> None:
        self.resource = resource
        self.mps = mps
        self.devices = resource.by_id()
        self.config = config
        self._response_id = response_id
        plugin = config.flags.plugin
        self.strategies = set(plugin.device_list_strategy)
        self.by_index = plugin.device_id_strategy == "index"
        # Under CDI only, the spec injects the nodes: NVIDIA's plugin passes no DeviceSpecs.
        self.pass_specs = plugin.pass_device_specs and not self.strategies <= CDI_STRATEGIES
        self.fail_gt_one = config.sharing.fail_requests_greater_than_one
        self.annotation_prefix = plugin.cdi_annotation_prefix
        root_seen = config.device_root_in_plugin
        # Checked once per resource build, not per Allocate: keeps Allocate fast.
        self.control_nodes = tuple(
            n for n in CONTROL_NODES if exists(host_path(root_seen, n))
        )
        self.device_root = config.device_root

    def validate(self, ids: Sequence[str]) -> list[PluginDevice]:
        name = self.resource.name
        if not ids:
            raise AllocationError(f"invalid allocation request for '{name}': no device IDs")
        devices: list[PluginDevice] = []
        seen: set[str] = set()
        for device_id in ids:
            device = self.devices.get(device_id)
            if device is None:
                raise AllocationError(
                    f"invalid allocation request for '{name}': unknown device: {device_id}"
                )
            if device_id in seen:
                raise AllocationError(
                    f"invalid allocation request for '{name}': device {device_id} requested twice"
                )
            seen.add(device_id)
            devices.append(device)
        if self.fail_gt_one and len(devices) > 1 and any(d.is_replica for d in devices):
            raise AllocationError(
                f"request for '{name}: {len(devices)}' too large: maximum request size for "
                "shared resources is 1"
            )
        return devices

    def allocate(self, ids: Sequence[str]) -> ContainerAllocation:
        devices = self.validate(ids)
        units = units_of(devices)
        visible = [u.index_id if self.by_index else u.uuid for u in units]
        out = ContainerAllocation()
        if "envvar" in self.strategies:
            out.envs[VISIBLE_DEVICES_ENV] = ",".join(visible)
        if "volume-mounts" in self.strategies:
            out.envs[VISIBLE_DEVICES_ENV] = VOLUME_MOUNTS_ROOT
            out.mounts = [
                Mount(f"{VOLUME_MOUNTS_ROOT}/{v}", VOLUME_MOUNTS_HOST_PATH, read_only=True)
                for v in visible
            ]
        cdi = [cdi_name(v) for v in visible]
        if "cdi-annotations" in self.strategies:
            key = f"{self.annotation_prefix}{CDI_ANNOTATION_PLUGIN}_{self._response_id()}"
            out.annotations[key] = ",".join(cdi)
        if "cdi-cri" in self.strategies:
            out.cdi_devices = cdi
        if self.pass_specs:
            nodes: dict[str, None] = {}
            for unit in units:
                nodes.update(dict.fromkeys(unit.device_nodes))
            nodes.update(dict.fromkeys(self.control_nodes))
            out.devices = [DeviceNode(p, host_path(self.device_root, p)) for p in nodes]
        if self.mps is not None:
            self._add_mps(out, devices)
        return out

    def _add_mps(self, out: ContainerAllocation, devices: list[PluginDevice]) -> None:
        assert self.mps is not None
        try:
            answer = mps_answer(self.mps, self.resource.name, devices)
        except MpsRequestError as exc:
            raise AllocationError(
                f"invalid allocation request for '{self.resource.name}': {exc}") from None
        if answer is not None:
            out.envs.update(answer.envs)
            out.mounts.extend(Mount(c, h) for c, h in answer.mounts)
