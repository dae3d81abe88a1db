"""NVIDIA's DRA driver contract (k8s-dra-driver-gpu, now the Go module
`sigs.k8s.io/dra-driver-nvidia-gpu`; driver `gpu.nvidia.com`): the names it uses, so claims and
DeviceClasses written for it work unchanged, its ResourceSlice device-name rule, and where the
kubelet looks for a DRA plugin. Its claim parameters (`resource.nvidia.com/v1beta1`) are
`gpukit.contracts.dra_claim_config`."""

from __future__ import annotations

import re
from dataclasses import dataclass

DRIVER = "gpu.nvidia.com"
# Device types (the `type` attribute) and NVIDIA's DeviceClasses.
TYPE_GPU = "gpu"
TYPE_MIG = "mig"
GPU_CLASS = "gpu.nvidia.com"
MIG_CLASS = "mig.nvidia.com"
# A prepared claim's CDI devices: `k8s.gpu.nvidia.com/claim=<claim uid>-<device>`, in a
# transient spec file per claim (CDI's GenerateTransientSpecName: <vendor>-<class>_<uid>).
CDI_VENDOR = f"k8s.{DRIVER}"
CDI_CLASS = "claim"
CDI_KIND = f"{CDI_VENDOR}/{CDI_CLASS}"
# Opaque parameters: NVIDIA's config API group.
CONFIG_API_VERSION = "resource.nvidia.com/v1beta1"
# NVLink fabric / IMEX clique: NVIDIA's driver publishes no attribute for it on GPU devices
# (checked: NVIDIA/k8s-dra-driver-gpu main of 2026-05-15 and kubernetes-sigs/dra-driver-nvidia-gpu
# of 2026-08-07, cmd/gpu-kubelet-plugin deviceinfo.go). Its compute-domain plugin reads the
# node's clique (<cluster UUID>.<clique id>) for ComputeDomains instead, and the newer
# gpuModuleID / partition<N> attributes come from Fabric Manager behind a feature gate, not NVML.
# gpukit publishes none either, so selectors match as on NVIDIA's driver; the clique is the node
# label nvidia.com/gpu.clique (gpukit.contracts.label_names.GPU_CLIQUE).
# The standard attribute Kubernetes defines for a device's PCI address
# (k8s.io/dynamic-resource-allocation/deviceattribute).
PCI_BUS_ID_ATTRIBUTE = "resource.kubernetes.io/pciBusID"
# The device's PCIe root complex, `pci<domain>:<bus>` (the same deviceattribute package,
# GetPCIeRootAttributeByPCIBusID): what DRA users match to align a GPU with a NIC. Read from
# sysfs: /sys/bus/pci/devices/<bus id> links to /sys/devices/pci<domain>:<bus>/.../<bus id>.
# NVIDIA's driver publishes it on a GPU and its MIG devices alike (the parent's), and nothing
# when sysfs cannot tell.
PCIE_ROOT_ATTRIBUTE = "resource.kubernetes.io/pcieRoot"

# Cross-pod sharing through consumable capacity (KEP-5075, resource.k8s.io/v1, DRAConsumableCapacity
# beta and on in 1.37): a shared device sets `allowMultipleAllocations: true` and every capacity
# of it gets a requestPolicy, so several claims land on it. `shares` counts them: a claim that
# asks nothing consumes one (capacity.requests.shares asks more), and `memory` an equal part
# (capacity.requests.memory asks a given amount). The allocation's results then carry a shareID
# and the consumedCapacity. NVIDIA's driver names its alpha counterpart ConsumableShares.
SHARES_CAPACITY = "shares"
MEMORY_CAPACITY = "memory"
MIN_SHARES, MAX_SHARES = 2, 64  # 1 is not sharing; more than 64 pods on one GPU is a typo

# Health as device taints (resource.k8s.io/v1 Device.taints: key, value, effect, timeAdded;
# DRADeviceTaints GA in 1.37), with NVIDIA's keys: `xid` with the XID as value, `gpu-lost`.
# gpukit removes them when the device recovers (NVIDIA's stay until its plugin restarts).
TAINT_XID = f"{DRIVER}/xid"
TAINT_GPU_LOST = f"{DRIVER}/gpu-lost"
TAINT_EFFECTS = ("None", "NoSchedule", "NoExecute")
MAX_TAINTED_DEVICES_PER_SLICE = 64  # the API's limit once any device of a slice has taints

# The kubelet: plugin registration sockets, and the DRA plugin's own directory.
KUBELET_DIR = "/var/lib/kubelet"
REGISTRY_DIR = f"{KUBELET_DIR}/plugins_registry"
PLUGIN_DIR = f"{KUBELET_DIR}/plugins/{DRIVER}"
REGISTRATION_SOCKET = f"{DRIVER}-reg.sock"
PLUGIN_SOCKET = "dra.sock"
# NVIDIA's plugin keeps its prepared claims in checkpoint.json (its format:
# gpukit.contracts.dra_checkpoint); gpukit's plugin keeps its own beside it, in a file NVIDIA's
# never reads, so either plugin starts on a node the other served. An earlier gpukit wrote its
# own format to checkpoint.json; the plugin moves such a file to its own name at start.
CHECKPOINT_FILE = "checkpoint.json"
GPUKIT_CHECKPOINT_FILE = "gpukit-checkpoint.json"
PLUGIN_TYPE = "DRAPlugin"
# The gRPC services a plugin lists as supported_versions; v1 is the kubelet's first choice.
SUPPORTED_SERVICES = ("v1.DRAPlugin",)
CDI_DIR = "/var/run/cdi"


# ResourceSlice device names, as NVIDIA's driver names its devices (selectors and claims' status
# name them): a whole GPU `gpu-<minor>`, a MIG device `gpu-<parent minor>-mig-<profile without
# dots, RFC 1123>-<GPU instance profile id>-<placement start>`. Built and parsed here only.
_DEVICE_NAME = re.compile(r"^gpu-(\d+)(?:-mig-([a-z0-9-]+?)-(\d+)-(\d+))?$")


@dataclass(frozen=True)
class DeviceName:
    minor: int  # the GPU's (a MIG device's parent's) /dev/nvidia<minor>
    profile_part: str = ""  # MIG only: the profile as it stands in the name (1g5gb)
    gi_profile_id: int | None = None  # MIG only: the driver's GPU instance profile id
    start: int | None = None  # MIG only: the placement's start slice

    @property
    def is_mig(self) -> bool:
        return self.gi_profile_id is not None


def mig_profile_part(profile: str) -> str:
    """A MIG profile as it stands in a device name: no dots, RFC 1123 (`1g.5gb+me` -> 1g5gb-me)."""
    return re.sub(r"[^a-z0-9-]", "-", profile.replace(".", "").lower()).strip("-")


def gpu_device_name(minor: int) -> str:
    return f"gpu-{minor}"


def mig_device_name(parent_minor: int, profile: str, gi_profile_id: int, start: int) -> str:
    return f"gpu-{parent_minor}-mig-{mig_profile_part(profile)}-{gi_profile_id}-{start}"


def parse_device_name(name: str) -> DeviceName | None:
    """The parts of a device name NVIDIA's driver (or gpukit's) published; None for others."""
    m = _DEVICE_NAME.match(name)
    if m is None:
        return None
    if m.group(2) is None:
        return DeviceName(int(m.group(1)))
    return DeviceName(int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4)))


def device_name_pattern(profile: str | None = None, gi_profile_id: int | None = None) -> str:
    """A regular expression for the names of a whole GPU (no profile) or of one MIG profile's
    devices on any GPU and placement (the suite's expectation, where minors are not declared)."""
    if profile is None:
        return r"gpu-\d+"
    return rf"gpu-\d+-mig-{re.escape(mig_profile_part(profile))}-{gi_profile_id}-\d+"
