"""The declarations: what the inventory says about each GPU node, typed and validated.

The choices a declaration is checked against live once: where the library applies them
(kernel module flavours: contracts.nvidia_driver) or here (runtimes, taint effects); the roles'
argument_specs are tested against these constants (tests/roles/test_role_contracts.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpukit.contracts import dra_dynamic_mig as dynamic_mig
from gpukit.contracts import label_names as ln
from gpukit.contracts import mig_profiles
from gpukit.contracts.mig_parted import MigConfigEntry
from gpukit.contracts.nvidia_driver import FLAVOURS
from gpukit.contracts.plugin_config import Config
from gpukit.contracts.runtime_hardening import OPT_OUT_VARIABLE
from gpukit.mig.declared import GpuMig as GpuMig  # what a declared layout means for one GPU

from . import metrics
from .quotas import Tenancy

GPU_GROUP = "gpu_nodes"
GPU_RESOURCE = ln.GPU_RESOURCE
RUNTIMES = ("containerd", "crio")
KERNEL_MODULES = FLAVOURS  # nvidia_driver_kernel_modules
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
DEVICE_PLUGIN_CONFIG_LABEL = ln.DEVICE_PLUGIN_CONFIG
MIG_CONFIG_LABEL = ln.MIG_CONFIG
# gpukit_gpu_allocation: which kubelet API serves a node's GPUs, the device plugin
# (nvidia.com/ extended resources) or DRA (ResourceSlices of driver gpu.nvidia.com); never both.
GPU_ALLOCATIONS = ("device-plugin", "dra")
DEFAULT_GPU_ALLOCATION = GPU_ALLOCATIONS[0]
# The variables a node's declaration is made of (inventories/README.md).
VARIABLES = (
    "gpukit_kubeconfig", "gpukit_node_name", "gpukit_gpu", "nvidia_driver_branch",
    "nvidia_driver_version", "nvidia_driver_kernel_modules", "gpukit_container_runtime",
    "gpukit_device_plugin_configs", "gpukit_device_plugin_config", "gpukit_mig_configs",
    "gpukit_mig_config", "gpukit_node_labels", "gpukit_node_taints", OPT_OUT_VARIABLE,
    "gpukit_gpu_allocation", "gpukit_dra_shares", dynamic_mig.VARIABLE, "gpukit_node_agent",
    *metrics.VARIABLES,
)


@dataclass(frozen=True)
class GpuDecl:
    """`gpukit_gpu`: the GPUs a node has."""

    product: str
    count: int
    memory_mib: int | None = None

    @property
    def mig_table(self) -> mig_profiles.MigGpu | None:
        return mig_profiles.for_product(self.product)


@dataclass(frozen=True)
class Taint:
    key: str
    effect: str
    value: str = ""

    @property
    def ident(self) -> str:
        """Key and effect: what names one taint on a node."""
        return f"{self.key}:{self.effect}"

    def as_dict(self) -> dict[str, str]:
        d = {"key": self.key, "effect": self.effect}
        if self.value:
            d["value"] = self.value
        return d


@dataclass(frozen=True)
class NodeDecl:
    """Everything the inventory declares about one GPU node."""

    host: str
    node_name: str
    gpu: GpuDecl
    address: str | None = None
    driver_branch: str | None = None
    driver_version: str | None = None  # nvidia_driver_version: pinned within the branch
    kernel_modules: str | None = None
    container_runtime: str = "containerd"
    plugin_config_name: str | None = None
    plugin_config: Config = field(default_factory=Config)
    plugin_configs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # as declared
    mig_config_name: str | None = None
    mig_layout: tuple[MigConfigEntry, ...] | None = None  # the selected layout, parsed
    mig_gpus: tuple[GpuMig, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    kubeconfig: str | None = None
    gpu_allocation: str = DEFAULT_GPU_ALLOCATION  # one of GPU_ALLOCATIONS
    # gpukit_dra_shares: a DRA node's devices are shared, by this many claims at most each
    # (consumable capacity, gpukit.contracts.dra.SHARES_CAPACITY); None: one claim a device.
    dra_shares: int | None = None
    # gpukit_dra_dynamic_mig: the GPUs the DRA plugin carves into MIG devices on demand, and
    # the profiles allowed on each (gpukit.contracts.dra_dynamic_mig); the MIG manager skips them.
    dra_dynamic_mig: tuple[dynamic_mig.DynamicGpu, ...] = ()
    metrics: metrics.MetricsDecl = field(default_factory=metrics.MetricsDecl)
    # gpukit_node_agent: gpukit's node agent serves the node's GPUs (true, the default), or
    # another device plugin does (false: NVIDIA's k8s-device-plugin and GFD, say). The roles
    # then leave the node to it (no agent pod there) and the suite checks what it serves, not
    # what only gpukit's agent reports (its config-state label, condition and metrics).
    node_agent: bool = True
    # The declaration variables as validated (plain values; absent ones left out): what a
    # role compares its own inputs with before it trusts this declaration.
    declared: Mapping[str, Any] = field(default_factory=dict)

    @property
    def mig_strategy(self) -> str:
        return self.plugin_config.flags.mig_strategy

    @property
    def dra(self) -> bool:
        """DRA serves this node's GPUs (`gpukit_gpu_allocation: dra`), not the device plugin."""
        return self.gpu_allocation == "dra"

    @property
    def mig_declared(self) -> bool:
        """The inventory manages MIG on this node (`gpukit_mig_config` is not null)."""
        return self.mig_layout is not None

    def selection_labels(self) -> dict[str, str]:
        """Node labels the inventory implies besides `gpukit_node_labels` (the config
        selectors the node agent and the MIG manager read)."""
        out: dict[str, str] = {}
        if self.plugin_config_name:
            out[DEVICE_PLUGIN_CONFIG_LABEL] = self.plugin_config_name
        if self.mig_config_name:
            out[MIG_CONFIG_LABEL] = self.mig_config_name
        return out


@dataclass(frozen=True)
class GpuInventory:
    """The GPU nodes of one inventory, in inventory order."""

    source: str
    nodes: tuple[NodeDecl, ...]
    tenancy: Tenancy = field(default_factory=Tenancy)  # cluster-wide: quotas.py

    def node(self, name: str) -> NodeDecl:
        """By Kubernetes node name or inventory host name."""
        for n in self.nodes:
            if name in (n.node_name, n.host):
                return n
        known = ", ".join(n.node_name for n in self.nodes) or "none"
        raise KeyError(f"{self.source}: no GPU node {name!r} (nodes: {known})")

    def node_names(self) -> list[str]:
        return [n.node_name for n in self.nodes]

    @property
    def kubeconfig(self) -> str | None:
        found = {n.kubeconfig for n in self.nodes if n.kubeconfig}
        return found.pop() if len(found) == 1 else None

