"""A node's sharing declarations, checked together before anything is applied.

The device plugin config a node selects must exist; a MIG layout must exist, be valid
mig-parted v1 (gpukit.contracts.mig_parted, the MIG manager's schema) and its devices must
be served (a MIG layout with `migStrategy: none` leaves MIG devices unused).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpukit.contracts import mig_parted
from gpukit.provision.agent import AgentSpecError, check_configs


@dataclass(frozen=True)
class SharingCheck:
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    time_slicing_replicas: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems


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
    try:  # the MIG manager's own schema reads the layout
        layout = mig_parted.parse({mig_config: mig_configs[mig_config]}).select(mig_config)
    except mig_parted.MigConfigError as e:
        out.problems.extend(f"gpukit_mig_configs{p.removeprefix(mig_parted.ROOT)}"
                            for p in e.problems)
        return out
    strategy = ((chosen.get("flags") or {}).get("migStrategy")) or "none"
    if any(e.mig_enabled for e in layout) and strategy == "none":
        out.warnings.append(
            f"gpukit_mig_config {mig_config!r} enables MIG but device plugin config"
            f" {plugin_config!r} has migStrategy none: the MIG devices are not served"
        )
    return out
