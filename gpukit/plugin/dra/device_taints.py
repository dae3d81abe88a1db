"""Device health as ResourceSlice device taints (resource.k8s.io/v1 Device.taints), under NVIDIA's
keys: `gpu.nvidia.com/xid` with the critical XID as value and `gpu.nvidia.com/gpu-lost`, both
NoSchedule (a new claim avoids the device; a claim holding it keeps running; a DeviceTaintRule
can evict with NoExecute, README). A MIG device carries its parent GPU's taints too.

Unlike NVIDIA's driver, whose taints stay until its plugin restarts, a taint goes as soon as the
health monitor calls the device healthy again (the recovery window after the XID, the GPU seen
again). `timeAdded` is when the plugin first saw the problem, kept while it lasts, so a
republish for another reason does not restart an eviction's clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

from gpukit.contracts.dra import TAINT_GPU_LOST, TAINT_XID

from ..resources import Unit

Problems = Callable[[str], tuple[int | None, str]]  # uuid -> (critical XID, lost reason)
EFFECT = "NoSchedule"


def wanted(unit: Unit, problems: Problems) -> list[tuple[str, str]]:
    """(key, value) of the taints `unit` must carry now: its own XID, else its GPU's; a lost
    GPU (a MIG device's parent included)."""
    xid, lost = problems(unit.uuid)
    gpu_xid, gpu_lost = problems(unit.gpu.uuid) if unit.mig is not None else (None, "")
    out: list[tuple[str, str]] = []
    if xid is not None or gpu_xid is not None:
        out.append((TAINT_XID, str(xid if xid is not None else gpu_xid)))
    if lost or gpu_lost:
        out.append((TAINT_GPU_LOST, ""))
    return out


class TaintClock:
    """When each (device, key, value) taint was first seen, while it lasts."""

    def __init__(self, now: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.now = now
        self._since: dict[tuple[str, str, str], str] = {}

    def taints(self, current: Iterable[tuple[str, list[tuple[str, str]]]]
               ) -> dict[str, list[dict[str, Any]]]:
        """device name -> its taints in the API's form, for (device, wanted) pairs; every
        taint no longer wanted is forgotten."""
        out: dict[str, list[dict[str, Any]]] = {}
        seen: dict[tuple[str, str, str], str] = {}
        for device, pairs in current:
            for key, value in pairs:
                ident = (device, key, value)
                since = self._since.get(ident) or self.now().strftime("%Y-%m-%dT%H:%M:%SZ")
                seen[ident] = since
                taint = {"key": key, "effect": EFFECT, "timeAdded": since}
                if value:
                    taint["value"] = value
                out.setdefault(device, []).append(taint)
        self._since = seen
        return out
