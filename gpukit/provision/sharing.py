"""A node's sharing declarations, checked together before anything is applied.

The device plugin configs must be valid and the selected one must exist; the selected MIG
layout must exist and be valid mig-parted v1 (the MIG manager's schema). Those rules are the
inventory model's, the preflight's; this adds what the gpu_sharing role needs: the selected
config's time-slicing replicas, and a warning when MIG devices would go unserved
(`migStrategy: none`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpukit.contracts.mig_parted import MigConfigEntry
from gpukit.contracts.plugin_config import Config
from gpukit.inventory import validate
from gpukit.inventory.model import NodeDecl


@dataclass(frozen=True)
class SharingCheck:
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    shared_replicas: dict[str, int] = field(default_factory=dict)
    strategy: str = "none"  # GFD's sharing-strategy of the selected config

    @property
    def ok(self) -> bool:
        return not self.problems


NO_CONFIGS = "gpukit_device_plugin_configs: must map config names to device plugin configs"


def check(
    plugin_configs: Mapping[str, Any],
    plugin_config: str | None,
    mig_configs: Mapping[str, Any] | None,
    mig_config: str | None,
) -> SharingCheck:
    """The inventory model's checks of these declarations (gpukit.inventory.validate.sharing:
    what the preflight checked), the time-slicing replicas of the selected config, and a
    warning when the selected layout's MIG devices would not be served."""
    if not isinstance(plugin_configs, Mapping) or not plugin_configs:
        # The role deploys these configs; the model alone would accept a host without any.
        return SharingCheck(problems=[NO_CONFIGS])
    name, config, layout, problems = validate.sharing(plugin_configs, plugin_config,
                                                      mig_configs, mig_config)
    if problems:
        return SharingCheck(problems=[str(p) for p in problems])
    return summary(name, config, layout, mig_config)


def declared(decl: NodeDecl) -> SharingCheck:
    """`check` of a declaration the model validated already (the preflight's): no parse."""
    if not decl.plugin_configs:
        return SharingCheck(problems=[NO_CONFIGS])
    return summary(decl.plugin_config_name, decl.plugin_config, decl.mig_layout,
                   decl.mig_config_name)


def summary(name: str | None, config: Config, layout: Sequence[MigConfigEntry] | None,
            mig_config: str | None) -> SharingCheck:
    """What the gpu_sharing role reports of valid declarations: the selected config's
    shared replicas (time-slicing or MPS), and a warning when the layout's MIG devices go
    unserved."""
    out = SharingCheck(strategy=config.sharing_strategy)
    for r in config.sharing.resources:
        out.shared_replicas[r.name] = max(out.shared_replicas.get(r.name, 0),
                                                r.replicas)
    if layout and any(e.mig_enabled for e in layout) and config.flags.mig_strategy == "none":
        out.warnings.append(
            f"gpukit_mig_config {mig_config!r} enables MIG but device plugin config"
            f" {name!r} has migStrategy none: the MIG devices are not served"
        )
    return out
