"""A prepared claim's `status.devices` (ResourceClaim device status, KEP-4817, GA in 1.37):
one entry per allocated device of this driver (per shareID for a shared device), with the
device's facts in `data` (UUID, PCI bus id; parent, profile and memory-slice placement of a MIG
device; the claim's sharing settings) and no networkData (a GPU is no network device).

Written by server-side apply under the driver's own field manager, so the entries other
drivers own stay theirs and a second apply replaces only ours. The API server allows it when
the writer may `patch` resourceclaims/status and, for each driver whose entries change,
`associated-node:patch` on the synthetic resourceclaims/driver named after the driver (its
granular status authorization, on by default since 1.36; the DRA plugin's ClusterRole), and
only for devices the allocation lists. Unprepare does not clear them: the API server drops a
claim's device status when the claim is deallocated.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from gpukit.contracts import dra_claim_config as opaque
from gpukit.contracts.dra import DRIVER

from .checkpoint import PreparedClaim
from .slice_devices import SliceDevice

FIELD_MANAGER = DRIVER  # one manager per driver: its entries are its own
PCI_ATTRIBUTE = "resource.kubernetes.io/pciBusID"
_SLICE = re.compile(r"memorySlice(\d+)")


def device_data(device: SliceDevice, sharing: opaque.Sharing | None) -> dict[str, Any]:
    """The facts of one published device a claim holds, from what the node publishes."""
    attrs = device.body.get("attributes") or {}

    def attr(name: str) -> Any:
        value = attrs.get(name) or {}
        return next(iter(value.values()), None) if isinstance(value, dict) else None

    data: dict[str, Any] = {"type": attr("type"), "uuid": device.unit.uuid}
    if (pci := attr(PCI_ATTRIBUTE)) is not None:
        data["pciBusID"] = pci
    if device.unit.mig is not None:
        data["parentUUID"] = device.unit.gpu.uuid
        data["profile"] = attr("profile")
        slices = sorted(int(m.group(1)) for k in device.body.get("capacity") or {}
                        if (m := _SLICE.fullmatch(k)))
        if slices:
            data["placement"] = {"start": slices[0], "size": len(slices)}
    if sharing is not None:
        data["sharing"] = sharing_data(sharing)
    return {k: v for k, v in data.items() if v is not None}


def sharing_data(sharing: opaque.Sharing) -> dict[str, Any]:
    """The claim's sharing settings as NVIDIA's GpuConfig/MigDeviceConfig name them."""
    out: dict[str, Any] = {"strategy": sharing.strategy}
    if sharing.interval:
        out["timeSlicingConfig"] = {"interval": sharing.interval}
    mps: dict[str, Any] = {}
    if sharing.active_thread_percentage is not None:
        mps["defaultActiveThreadPercentage"] = sharing.active_thread_percentage
    if sharing.pinned_memory_limit:
        mps["defaultPinnedDeviceMemoryLimit"] = sharing.pinned_memory_limit
    if sharing.per_device_pinned_memory_limit:
        mps["defaultPerDevicePinnedMemoryLimit"] = dict(sharing.per_device_pinned_memory_limit)
    if mps:
        out["mpsConfig"] = mps
    return out


def entries(claim: PreparedClaim, published: Mapping[str, SliceDevice],
            sharing: Mapping[str, opaque.Sharing]) -> list[dict[str, Any]]:
    """The status.devices entries of a prepared claim: one per device and shareID."""
    out = []
    for d in claim.devices:
        device = published.get(d.device)
        data = device_data(device, sharing.get(d.device)) if device is not None else {}
        for share in d.share_ids or ("",):
            entry: dict[str, Any] = {"driver": DRIVER, "pool": d.pool, "device": d.device}
            if share:
                entry["shareID"] = share
            if data:
                entry["data"] = data
            out.append(entry)
    return out


def apply_body(namespace: str, name: str, uid: str, devices: list[dict[str, Any]]
               ) -> dict[str, Any]:
    """The server-side apply of the claim's status with these entries; the UID makes it fail
    rather than write a new claim of the same name."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "status": {"devices": devices}}
