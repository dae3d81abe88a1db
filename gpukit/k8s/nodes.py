"""What gpukit reads of Node objects."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpukit.contracts import label_names

GPU_PREFIX = label_names.RESOURCE_PREFIX


def allocatable(node: Any, prefix: str = GPU_PREFIX) -> dict[str, int]:
    """The node's allocatable extended resources under `prefix`, as integers."""
    return resource_counts(node.status.allocatable if node and node.status else None, prefix)


def capacity(node: Any, prefix: str = GPU_PREFIX) -> dict[str, int]:
    return resource_counts(node.status.capacity if node and node.status else None, prefix)


def resource_counts(values: Mapping[str, Any] | None, prefix: str) -> dict[str, int]:
    """Counts of the resources named `prefix…`, sorted by name. Extended resources are whole
    numbers; one that is not reads -1, so a report shows it instead of hiding it."""
    out: dict[str, int] = {}
    for name, qty in (values or {}).items():
        if name.startswith(prefix):
            try:
                out[name] = int(str(qty))
            except ValueError:
                out[name] = -1
    return dict(sorted(out.items()))


def ready(node: Any) -> tuple[bool, str]:
    """(Ready condition is True, the condition's reason/message for a report)."""
    for cond in (node.status.conditions if node and node.status else None) or []:
        if cond.type == "Ready":
            return cond.status == "True", f"{cond.reason or ''} {cond.message or ''}".strip()
    return False, "no Ready condition"


def reported_after(node: Any, since: Any) -> bool:
    """The node object carries a status the kubelet reported after `since` (a UTC datetime):
    its resources are the kubelet's view since then, not an older report's."""
    for cond in node.status.conditions or []:
        if cond.type == "Ready" and cond.last_heartbeat_time is not None:
            return bool(cond.last_heartbeat_time > since)
    return False
