"""Moving a node between the device plugin and DRA (`gpukit_gpu_allocation`), with the node
drained of GPU pods: what the kubelet and the Node object keep of the device plugin, and how
it is cleared.

- The kubelet's device manager checkpoint keeps a gone plugin's allocations (pods long gone)
  and, while it does, takes nvidia.com/gpu for a device plugin resource: a pod DRA serves
  through the DeviceClass's extended resource fails ("endpoint not found in cache for a
  registered resource"), across kubelet restarts. It is removed with the kubelet stopped.
- The node's status keeps the nvidia.com/ extended resources (the kubelet no longer manages
  them once the checkpoint is gone): the scheduler would place pods through the stale count.
  They are removed from capacity and allocatable, as Kubernetes documents removing an
  extended resource (a JSON patch of the node's status).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gpukit.contracts.label_names import RESOURCE_PREFIX

KUBELET_DEVICE_PLUGIN_CHECKPOINT = "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"
PREFIX = RESOURCE_PREFIX


def checkpoint_holds_device_plugin_resources(text: str) -> list[str]:
    """The nvidia.com/ resources the kubelet's device manager checkpoint still allocates or
    registers ('' or a file that is not JSON: none, nothing to clear)."""
    try:
        doc = json.loads(text) if text.strip() else {}
    except ValueError:
        return []
    data = doc.get("Data") or {} if isinstance(doc, Mapping) else {}
    found = {str(e.get("ResourceName", "")) for e in data.get("PodDeviceEntries") or []
             if isinstance(e, Mapping)}
    found |= {str(r) for r in (data.get("RegisteredDevices") or {})}
    return sorted(r for r in found if r.startswith(PREFIX))


def stale_resources(status: Mapping[str, Any]) -> list[str]:
    """The nvidia.com/ extended resources a node's status still lists (capacity or
    allocatable): none may stay on a DRA node."""
    names = set(status.get("capacity") or {}) | set(status.get("allocatable") or {})
    return sorted(n for n in names if n.startswith(PREFIX))


def status_patch(status: Mapping[str, Any]) -> list[dict[str, str]]:
    """The JSON patch (RFC 6902, '/' escaped as '~1') removing every nvidia.com/ resource
    from the node's capacity and allocatable: empty when there is nothing to remove."""
    return [{"op": "remove", "path": f"/status/{field}/{_pointer(name)}"}
            for field in ("capacity", "allocatable")
            for name in sorted(status.get(field) or {}) if name.startswith(PREFIX)]


def _pointer(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")
