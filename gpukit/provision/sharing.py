"""A node's sharing declarations, checked together before anything is applied.

The device plugin config a node selects must exist; a MIG layout must exist and its
devices must be served (a MIG layout with `migStrategy: none` leaves MIG devices unused).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpukit.provision.agent import AgentSpecError, check_configs


@dataclass(frozen=True)
class SharingCheck:
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    time_slicing_replicas: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems


def _mig_enabled(layout: Any) -> bool:
    return isinstance(layout, list) and any(
        isinstance(e, Mapping) and e.get("mig-enabled") for e in layout
    )


def check(
    plugin_configs: Mapping[str, Any],
    plugin_config: str | None,
    mig_configs: Mapping[str, Any] | None,
    mig_config: str | None,
) -> SharingCheck:
    out = SharingCheck()
    try:
        check_configs(plugin_configs)
    except AgentSpecError as e:
        out.problems.append(str(e))
        return out
    if plugin_config is not None and plugin_config not in plugin_configs:
        out.problems.append(
            f"gpukit_device_plugin_config: {plugin_config!r} is not one of"
            f" gpukit_device_plugin_configs ({', '.join(sorted(plugin_configs))})"
        )
        return out
    chosen = plugin_configs.get(plugin_config or "", {}) or {}
    for r in ((chosen.get("sharing") or {}).get("timeSlicing") or {}).get("resources") or []:
        name = str(r.get("name"))
        out.time_slicing_replicas[name] = max(out.time_slicing_replicas.get(name, 0),
                                              int(r.get("replicas", 0)))  # fmt: skip
    if mig_config is None:
        return out
    if not mig_configs or mig_config not in mig_configs:
        out.problems.append(
            f"gpukit_mig_config: {mig_config!r} is not one of gpukit_mig_configs"
            f" ({', '.join(sorted(mig_configs or {})) or 'none declared'})"
        )
        return out
    strategy = ((chosen.get("flags") or {}).get("migStrategy")) or "none"
    if _mig_enabled(mig_configs[mig_config]) and strategy == "none":
        out.warnings.append(
            f"gpukit_mig_config {mig_config!r} enables MIG but device plugin config"
            f" {plugin_config!r} has migStrategy none: the MIG devices are not served"
        )
    return out
