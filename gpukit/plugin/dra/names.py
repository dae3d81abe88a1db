"""Names NVIDIA's DRA driver (k8s-dra-driver-gpu) uses, so claims and DeviceClasses written for
it work unchanged, and where the kubelet looks for a DRA plugin."""

from __future__ import annotations

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
# The standard attribute Kubernetes defines for a device's PCI address
# (k8s.io/dynamic-resource-allocation/deviceattribute).
PCI_BUS_ID_ATTRIBUTE = "resource.kubernetes.io/pciBusID"

# The kubelet: plugin registration sockets, and the DRA plugin's own directory.
KUBELET_DIR = "/var/lib/kubelet"
REGISTRY_DIR = f"{KUBELET_DIR}/plugins_registry"
PLUGIN_DIR = f"{KUBELET_DIR}/plugins/{DRIVER}"
REGISTRATION_SOCKET = f"{DRIVER}-reg.sock"
PLUGIN_SOCKET = "dra.sock"
CHECKPOINT_FILE = "checkpoint.json"
PLUGIN_TYPE = "DRAPlugin"
# The gRPC services a plugin lists as supported_versions; v1 is the kubelet's first choice.
SUPPORTED_SERVICES = ("v1.DRAPlugin",)
CDI_DIR = "/var/run/cdi"
