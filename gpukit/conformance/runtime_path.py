"""How the inventory says users' GPU pods reach the NVIDIA container runtime on each node: the
container_toolkit role's variables (containerd's default runtime, or the RuntimeClass it
creates). The suite runs its pods the same way, so the runtime's injection and NVIDIA's
hardening are what its checks meet.

The inventory model (gpukit.inventory) carries the node's declaration, not the role's
settings: they are read here, through Ansible as the role sees them, with the role's
defaults (tests/roles/test_role_contracts.py holds these equal to the role's).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpukit.inventory.model import GPU_GROUP

# The container_toolkit role's variables and defaults.
RUNTIME_NAME = "container_toolkit_runtime_name"
RUNTIME_CLASS = "container_toolkit_runtime_class"
SET_AS_DEFAULT = "container_toolkit_set_as_default"
DEFAULTS: Mapping[str, Any] = {RUNTIME_NAME: "nvidia", RUNTIME_CLASS: "nvidia",
                               SET_AS_DEFAULT: False}
_TRUE = frozenset(("true", "yes", "on", "1", "y", "t"))


@dataclass(frozen=True)
class RuntimePath:
    """One node's declared route to the NVIDIA runtime."""

    runtime_name: str = "nvidia"  # containerd's (or CRI-O's) runtime handler
    runtime_class: str = "nvidia"  # the RuntimeClass naming it ('' none)
    default: bool = False  # the runtime is the node's default

    @property
    def pod_class(self) -> str | None:
        """The runtimeClassName a user's GPU pod on this node carries (None: the default)."""
        return None if self.default else (self.runtime_class or None)

    def describe(self) -> str:
        if self.default:
            return f"runtime {self.runtime_name!r} as the node's default"
        if self.runtime_class:
            return f"RuntimeClass {self.runtime_class!r} (handler {self.runtime_name!r})"
        return f"runtime {self.runtime_name!r}, neither default nor named by a RuntimeClass"


def from_vars(raw: Mapping[str, Any]) -> RuntimePath:
    """A node's RuntimePath from its variables (absent ones: the role's defaults)."""
    values = {**DEFAULTS, **{k: v for k, v in raw.items() if k in DEFAULTS}}
    default = values[SET_AS_DEFAULT]
    if isinstance(default, str):
        default = default.strip().lower() in _TRUE
    return RuntimePath(runtime_name=str(values[RUNTIME_NAME] or ""),
                       runtime_class=str(values[RUNTIME_CLASS] or ""), default=bool(default))


def declared(sources: str | Sequence[str], nodes: Mapping[str, str],
             host_vars: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, RuntimePath]:
    """node name -> RuntimePath for the inventory's GPU hosts in `nodes` (host -> node name);
    `host_vars` win, as the suite's --host-vars do. The inventory was validated already."""
    from ansible.inventory.manager import InventoryManager  # type: ignore[import-untyped]
    from ansible.parsing.dataloader import DataLoader  # type: ignore[import-untyped]
    from ansible.template import Templar  # type: ignore[import-untyped]
    from ansible.vars.manager import VariableManager  # type: ignore[import-untyped]

    loader = DataLoader()
    inventory = InventoryManager(loader=loader,
                                 sources=[sources] if isinstance(sources, str) else list(sources))
    variables = VariableManager(loader=loader, inventory=inventory)
    out: dict[str, RuntimePath] = {}
    for host in inventory.get_hosts(GPU_GROUP):
        if host.name not in nodes:
            continue
        hv = variables.get_vars(host=host)
        templar = Templar(loader=loader, variables=hv)
        raw = {k: templar.template(hv[k]) for k in DEFAULTS if k in hv}
        raw.update({k: v for k, v in (host_vars or {}).get(host.name, {}).items()
                    if k in DEFAULTS})
        out[nodes[host.name]] = from_vars(raw)
    return out
