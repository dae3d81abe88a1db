"""Every label, annotation and resource name gpukit reads or writes, in one place:
GFD-compatible `nvidia.com/*` node labels, and gpukit's own `gpukit.io/*`.

Imported by the plugin, the labeler, the Ansible modules and the conformance suite, so a name
is spelled once. Per-resource labels are built with `resource_label(resource, suffix)`.
"""

from __future__ import annotations

PREFIX = "nvidia.com"
# Every extended resource and label of NVIDIA's GPUs starts with this.
RESOURCE_PREFIX = "nvidia.com/"
# The kind of gpukit's and NVIDIA's CDI specs (devices `nvidia.com/gpu=<name>`).
CDI_KIND = "nvidia.com/gpu"

# Selection labels (read)
DEVICE_PLUGIN_CONFIG = "nvidia.com/device-plugin.config"
MIG_CONFIG = "nvidia.com/mig.config"
MIG_CONFIG_STATE = "nvidia.com/mig.config.state"
# Written by the node agent: whether the config the node label selects is the one served
# ("failed": it was refused and the last good one is served; the reason is in an Event).
DEVICE_PLUGIN_CONFIG_STATE = "nvidia.com/device-plugin.config.state"
CONFIG_STATE_SUCCESS = "success"
CONFIG_STATE_FAILED = "failed"

# Node-wide labels (written)
GPU_PRESENT = "nvidia.com/gpu.present"
MIG_CAPABLE = "nvidia.com/mig.capable"
MIG_STRATEGY = "nvidia.com/mig.strategy"
MPS_CAPABLE = "nvidia.com/mps.capable"
GPU_MODE = "nvidia.com/gpu.mode"  # PCI class of the GPUs: compute, graphics or unknown
GPU_MACHINE = "nvidia.com/gpu.machine"  # DMI product name
# The NVLink (IMEX) clique of the node's GPUs: `<cluster UUID>.<clique id>` (GFD's IMEX labeler)
GPU_CLIQUE = "nvidia.com/gpu.clique"
VGPU_PRESENT = "nvidia.com/vgpu.present"
VGPU_HOST_DRIVER_VERSION = "nvidia.com/vgpu.host-driver-version"
VGPU_HOST_DRIVER_BRANCH = "nvidia.com/vgpu.host-driver-branch"

CUDA_DRIVER_MAJOR = "nvidia.com/cuda.driver-version.major"
CUDA_DRIVER_MINOR = "nvidia.com/cuda.driver-version.minor"
CUDA_DRIVER_REVISION = "nvidia.com/cuda.driver-version.revision"
CUDA_DRIVER_FULL = "nvidia.com/cuda.driver-version.full"
CUDA_RUNTIME_MAJOR = "nvidia.com/cuda.runtime-version.major"
CUDA_RUNTIME_MINOR = "nvidia.com/cuda.runtime-version.minor"
CUDA_RUNTIME_FULL = "nvidia.com/cuda.runtime-version.full"
# GFD still writes these deprecated spellings; tools in the wild read them.
CUDA_DRIVER_MAJOR_DEPRECATED = "nvidia.com/cuda.driver.major"
CUDA_DRIVER_MINOR_DEPRECATED = "nvidia.com/cuda.driver.minor"
CUDA_DRIVER_REV_DEPRECATED = "nvidia.com/cuda.driver.rev"
CUDA_RUNTIME_MAJOR_DEPRECATED = "nvidia.com/cuda.runtime.major"
CUDA_RUNTIME_MINOR_DEPRECATED = "nvidia.com/cuda.runtime.minor"

# Per-resource label suffixes: "<resource>.<suffix>", e.g. nvidia.com/gpu.product
PRODUCT = "product"
COUNT = "count"
REPLICAS = "replicas"
SHARING = "sharing-strategy"  # per resource, as GFD writes it (none, time-slicing, mps)
MEMORY = "memory"
FAMILY = "family"
COMPUTE_MAJOR = "compute.major"
COMPUTE_MINOR = "compute.minor"
MULTIPROCESSORS = "multiprocessors"
SLICES_GI = "slices.gi"
SLICES_CI = "slices.ci"
ENGINES_COPY = "engines.copy"
ENGINES_DECODER = "engines.decoder"
ENGINES_ENCODER = "engines.encoder"
ENGINES_JPEG = "engines.jpeg"
ENGINES_OFA = "engines.ofa"
MIG_ATTRIBUTE_SUFFIXES = (
    MEMORY, MULTIPROCESSORS, SLICES_GI, SLICES_CI,
    ENGINES_COPY, ENGINES_DECODER, ENGINES_ENCODER, ENGINES_JPEG, ENGINES_OFA,
)

GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"  # + profile: see gpukit.contracts.device_ids
# The full-GPU resource's sharing label (not node-wide: each resource has its own).
SHARING_STRATEGY = "nvidia.com/gpu.sharing-strategy"
# The full-GPU resource's labels, as GFD spells them.
GPU_PRODUCT = "nvidia.com/gpu.product"
GPU_COUNT = "nvidia.com/gpu.count"
GPU_REPLICAS = "nvidia.com/gpu.replicas"
GPU_MEMORY = "nvidia.com/gpu.memory"


def resource_label(resource: str, suffix: str) -> str:
    """`resource_label("nvidia.com/mig-1g.5gb", "count")` -> `nvidia.com/mig-1g.5gb.count`."""
    return f"{resource}.{suffix}"


def is_gpukit_label(name: str) -> bool:
    """Labels the labeler owns (and may remove when they no longer apply)."""
    return name.startswith(PREFIX + "/") and name not in (
        DEVICE_PLUGIN_CONFIG, MIG_CONFIG, MIG_CONFIG_STATE, GPU_PRESENT,
    )


# Scheduling gate of the node agent's DaemonSet, as the GPU Operator names it.
DEPLOY_DEVICE_PLUGIN = "nvidia.com/gpu.deploy.device-plugin"

# gpukit's own names.
GPUKIT_PREFIX = "gpukit.io"
# A rolling upgrade's progress on a node (playbooks/upgrade.yml).
UPGRADE = "gpukit.io/upgrade"
UPGRADE_STATE = "gpukit.io/upgrade-state"
UPGRADE_MESSAGE = "gpukit.io/upgrade-message"
# Which kubelet API serves the node's GPUs, as declared (gpukit_gpu_allocation: device-plugin or
# dra; set by the node_labels role): the DRA plugin's DaemonSet selects `dra`, and a change of
# it is a switch that upgrade.yml rolls (a node is never served by both).
GPU_ALLOCATION = "gpukit.io/gpu.allocation"
# A DRA node's devices shared between claims, and into how many shares (gpukit_dra_shares; set
# by the node_labels role): the DRA plugin reads it from its node (gpukit.contracts.dra).
DRA_SHARES = "gpukit.io/dra.shares"
# The conformance suite's objects: its run, a pod's role and node, the namespace's expiry.
CONFORMANCE_RUN = "gpukit.io/conformance-run"
CONFORMANCE_ROLE = "gpukit.io/role"
CONFORMANCE_NODE = "gpukit.io/node"
CONFORMANCE_EXPIRES = "gpukit.io/expires"
