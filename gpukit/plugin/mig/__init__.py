"""The MIG manager (gpukit's mig-parted): plan, validate, apply and converge MIG layouts.

Modules, one concept each (planning without NVML lives in ``gpukit.mig``: state, placement,
planner, shared with the inventory model and provisioning):

* (configs: ``gpukit.contracts.mig_parted``, mig-parted ``version: v1``, shared with provisioning)
* ``backend``   the GPU backend protocol (its pynvml implementation and the table-driver
  check: gpukit.plugin.nvml.mig)
* ``applier``   apply a plan: process check, pause, actions, reset, verify; converges on rerun
* ``hooks``     GPU reset, plugin pause (file protocol) and ``mig.config.state`` reporting
* ``pause``     the device plugin's side of the pause protocol
* ``export``    the current layout as a config
* ``report``, ``cli``  output and ``python -m gpukit.plugin.mig``

Library use::

    from gpukit.contracts import mig_parted as schema
    from gpukit.mig import planner
    from gpukit.plugin.mig import applier, hooks
    from gpukit.plugin.nvml import mig as device

    configs = schema.load_file("mig.yaml")
    with device.open_nvml() as gpus:
        print(planner.plan(configs, "all-3g.20gb", gpus.gpus()).changed)
        applier.apply(configs, "all-3g.20gb", gpus, hooks.command_reset(hooks.NVIDIA_SMI_RESET))
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpukit.contracts.mig_parted import MigConfigError, MigConfigs, load_file, load_text, parse
    from gpukit.mig.planner import Action, ActionKind, GpuPlan, LayoutError, Plan, plan

    from .applier import ApplyError, ApplyResult, ProcessesRunning, VerifyError, apply, verify
    from .export import export_config

# Imported on first use (PEP 562): the device plugin imports `mig.pause` on its way to
# registering with the kubelet and needs none of the planner, applier or YAML schema.
_FROM = {
    "gpukit.contracts.mig_parted": ("MigConfigError", "MigConfigs", "load_file", "load_text",
                                    "parse"),
    "gpukit.mig.planner": ("Action", "ActionKind", "GpuPlan", "LayoutError", "Plan", "plan"),
    "gpukit.plugin.mig.applier": ("ApplyError", "ApplyResult", "ProcessesRunning",
                                  "VerifyError", "apply", "verify"),
    "gpukit.plugin.mig.export": ("export_config",),
}
_MODULE_OF = {name: module for module, names in _FROM.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "Action", "ActionKind", "ApplyError", "ApplyResult", "GpuPlan", "LayoutError",
    "MigConfigError", "MigConfigs", "Plan", "ProcessesRunning", "VerifyError", "apply",
    "export_config", "load_file", "load_text", "parse", "plan", "verify",
]
