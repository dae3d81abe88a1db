"""NVIDIA DRA driver checkpoints for tests, written from its schema
(gpukit/contracts/dra_checkpoint.py): the keys in the order Go's encoding/json writes its
structs, v1 derived from v2 as its plugin does (completed claims only, no name), both
checksums set. Build claims with `gpu`/`mig`/`group`/`claim`, the file with `render`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpukit.contracts import dra_checkpoint as nv

CDI_KIND = "k8s.gpu.nvidia.com/claim"


def kubelet_device(uid: str, device: str, pool: str, requests: Sequence[str],
                   share_id: str = "", cdi_ids: Sequence[str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"Requests": list(requests), "PoolName": pool, "DeviceName": device,
                           "CDIDeviceIDs": list(cdi_ids if cdi_ids is not None
                                                else [f"{CDI_KIND}={uid}-{device}"])}
    if share_id:
        out["ShareID"] = share_id
    return out


def gpu(uid: str, device: str, uuid: str, pool: str, requests: Sequence[str] = ("gpu",),
        **kw: Any) -> dict[str, Any]:
    return {"gpu": {"info": {"uuid": uuid},
                    "device": kubelet_device(uid, device, pool, requests, **kw)},
            "mig": None}


def mig(uid: str, device: str, uuid: str, parent_uuid: str, pool: str, parent_minor: int = 0,
        gi: int = 1, ci: int = 0, requests: Sequence[str] = ("mig",),
        **kw: Any) -> dict[str, Any]:
    return {"gpu": None,
            "mig": {"concrete": {"parentMinor": parent_minor, "giId": gi, "ciId": ci,
                                 "migUUID": uuid, "parentUUID": parent_uuid},
                    "device": kubelet_device(uid, device, pool, requests, **kw)}}


def group(*devices: dict[str, Any], mps_daemon: str = "") -> dict[str, Any]:
    return {"devices": list(devices), "configState": {"mpsControlDaemonID": mps_daemon}}


def allocation(pool: str, *devices: tuple[str, str],
               config: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """A ResourceClaimStatus allocating (request, device) pairs of driver gpu.nvidia.com."""
    results = [{"request": r, "driver": "gpu.nvidia.com", "pool": pool, "device": d}
               for r, d in devices]
    devs: dict[str, Any] = {"results": results}
    if config:
        devs["config"] = list(config)
    return {"allocation": {"devices": devs}}


def claim(groups: Sequence[dict[str, Any]], status: dict[str, Any], name: str = "c",
          namespace: str = "ns", state: str = nv.PREPARE_COMPLETED) -> dict[str, Any]:
    out: dict[str, Any] = {"checkpointState": state, "status": status}
    if groups:
        out["preparedDevices"] = list(groups)
    if name:
        out["name"] = name
    if namespace:
        out["namespace"] = namespace
    return out


def render(claims: Mapping[str, dict[str, Any]], boot_id: str = "", v1_only: bool = False
           ) -> str:
    """The file NVIDIA's plugin writes for these v2 claims (UID -> `claim(...)`), map keys
    sorted as Go sorts them."""
    ordered = {uid: claims[uid] for uid in sorted(claims)}
    v1_claims = {uid: {k: v for k, v in c.items() if k in ("status", "preparedDevices")}
                 for uid, c in ordered.items() if c["checkpointState"] == nv.PREPARE_COMPLETED}
    doc: dict[str, Any] = {"checksum": 0, "v1": {"preparedClaims": v1_claims} if v1_claims
                           else {}}
    if not v1_only:
        v2: dict[str, Any] = {"checksum": 0}
        if ordered:
            v2["preparedClaims"] = ordered
        if boot_id:
            v2["nodeBootID"] = boot_id
        v2["checksum"] = nv.v2_checksum(v2)
        doc["v2"] = v2
    doc["checksum"] = nv.v1_checksum(doc)
    return nv.go_json(doc).decode()
