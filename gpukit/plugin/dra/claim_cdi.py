"""The CDI spec of one prepared claim, as NVIDIA's DRA driver writes it: kind
`k8s.gpu.nvidia.com/claim`, one device per allocated device named `<claim uid>-<device>`
(its /dev nodes, and the claim's sharing settings as env), the node's spec-wide edits (control
nodes, driver files; gpukit/plugin/cdi.py, shared with the device plugin's spec), in a transient
spec file of its own (`k8s.gpu.nvidia.com-claim_<uid>.json`) so unprepare removes exactly it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpukit.contracts.dra import CDI_CLASS, CDI_KIND, CDI_VENDOR

from .. import cdi
from ..resources import Unit


def spec_file(claim_uid: str) -> str:
    return f"{CDI_VENDOR}-{CDI_CLASS}_{claim_uid.replace('/', '_')}.json"


def device_id(claim_uid: str, device: str) -> str:
    """The fully qualified CDI device the runtime injects: vendor/class=name."""
    return f"{CDI_KIND}={claim_uid}-{device}"


def claim_spec(claim_uid: str, devices: Sequence[tuple[str, Unit, Mapping[str, Any]]],
               device_root: str, common: Mapping[str, Any]) -> dict[str, Any]:
    """`devices`: (device name, unit, extra container edits: env, mounts) per allocated
    device; `common`: the node's spec-wide edits (cdi.node_edits)."""
    out = []
    for name, unit, extra in devices:
        edits = cdi.unit_edits(unit, device_root)
        for key, values in extra.items():
            if values:
                edits[key] = [*edits.get(key, []), *values]
        out.append({"name": f"{claim_uid}-{name}", "containerEdits": edits})
    return {"cdiVersion": cdi.CDI_VERSION, "kind": CDI_KIND, "devices": out,
            "containerEdits": dict(common)}  # fmt: skip
