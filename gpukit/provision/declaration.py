"""A host's declaration as the roles read it: validated once per play, by the preflight.

The preflight (gpukit.gpu.inventory_check) validates every GPU node through the inventory model
and hands each host its result as the fact `gpukit_declaration` (`fact`): the declaration
variables the model validated (`inputs`) and what they imply (labels, taints, the selected
configs, the resources and labels the node must serve, the sharing summary). The roles' filters
read it instead of validating again.

A role trusts the fact only for the very values it was handed: a play may hand a role other
values than the inventory's (the rolling upgrade selects a versioned config name; a role run on
its own has no fact at all). Then the filter validates what it was handed through the same
model entries the preflight used (gpukit.inventory.validate, node_meta, the oracle).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpukit import inventory
from gpukit.contracts import dra_dynamic_mig
from gpukit.contracts import label_names as ln
from gpukit.inventory.model import NodeDecl, Taint
from gpukit.provision import nodes, sharing, toolkit_config

FACT = "gpukit_declaration"
_PREFIXES = ("gpukit_", "nvidia_driver_")  # what a host's declaration is read from
_EMPTY: tuple[object, ...] = (None, "", False)


def fact(decl: NodeDecl, resources: Mapping[str, int], labels: Mapping[str, str]
         ) -> dict[str, Any]:
    """The per-host result the preflight sets (plain values, as a fact travels)."""
    shares = sharing.declared(decl)
    return {
        "host": decl.host,
        "node_name": decl.node_name,
        "inputs": inventory.plain(dict(decl.declared)),
        "device_plugin_config": decl.plugin_config_name,
        "mig_config": decl.mig_config_name,
        "labels": dict(decl.labels),
        "taints": [t.as_dict() for t in decl.taints],
        "expected_resources": dict(resources),
        "expected_labels": dict(labels),
        "gpu_allocation": decl.gpu_allocation,
        "dra_shares": decl.dra_shares,
        "dra_dynamic_mig": dra_dynamic_mig.as_plain(decl.dra_dynamic_mig),
        "expected_dra_devices": inventory.expected_dra_devices(decl),
        "metrics": decl.metrics.as_dict(),
        "sharing": {"problems": shares.problems, "warnings": shares.warnings,
                    "shared_replicas": shares.shared_replicas, "strategy": shares.strategy},
    }


def facts(checked: inventory.CheckResult) -> dict[str, dict[str, Any]]:
    """Host -> `fact`, for every node of a check without problems (else nothing)."""
    if checked.problems or checked.inventory is None:
        return {}
    labels = checked.labels or {}
    return {d.host: fact(d, checked.resources[d.node_name], labels[d.node_name])
            for d in checked.inventory.nodes}


def for_vars(host: str, host_vars: Mapping[str, Any]) -> dict[str, Any]:
    """`fact` computed now from a host's variables, through the preflight's own entries
    (validate.node_from_vars, the oracle). InventoryError: the declaration is invalid."""
    raw = {k: inventory.plain(host_vars[k]) for k in host_vars
           if k.startswith(_PREFIXES) or k == "ansible_host"}  # fmt: skip
    decl = inventory.node_from_vars(host, raw)
    return fact(decl, inventory.expected_resources(decl), inventory.expected_labels(decl))


def _norm(value: Any) -> Any:
    value = inventory.plain(value)
    return None if value in _EMPTY or value == {} or value == [] else value


def matches(declaration: Any, **given: Any) -> bool:
    """The fact describes these values of its declaration variables (unset, null, empty and
    false alike: the roles' defaults)."""
    if not isinstance(declaration, Mapping) or not isinstance(declaration.get("inputs"), Mapping):
        return False
    inputs = declaration["inputs"]
    return all(_norm(value) == _norm(inputs.get(name)) for name, value in given.items())


# --- what each role reads -----------------------------------------------------------------


def sharing_check(declaration: Any, plugin_configs: Mapping[str, Any],
                  plugin_config: str | None, mig_configs: Mapping[str, Any] | None,
                  mig_config: str | None) -> sharing.SharingCheck:
    """Role gpu_sharing: its four variables checked (gpukit.provision.sharing.check)."""
    if matches(declaration, gpukit_device_plugin_configs=plugin_configs,
               gpukit_device_plugin_config=plugin_config, gpukit_mig_configs=mig_configs,
               gpukit_mig_config=mig_config):
        s = declaration["sharing"]
        return sharing.SharingCheck(list(s["problems"]), list(s["warnings"]),
                                    dict(s["shared_replicas"]), str(s.get("strategy", "none")))
    return sharing.check(plugin_configs, plugin_config, mig_configs, mig_config)


def hardening_problems(declaration: Any, configs: Mapping[str, Any] | None,
                       accept_envvar_unprivileged: bool, host: str) -> list[str]:
    """Roles container_toolkit and device_plugin: the configs against the runtime's hardening
    (none when the preflight validated these values: it refuses what this would)."""
    if matches(declaration, gpukit_device_plugin_configs=configs,
               **{toolkit_config.OPT_OUT_VARIABLE: accept_envvar_unprivileged}):
        return []
    return toolkit_config.hardening_problems(configs, accept_envvar_unprivileged, host)


def labels(declaration: Any, extra: Mapping[str, Any] | None, device_plugin_config: str | None,
           mig_config: str | None, deploy_device_plugin: bool = True) -> dict[str, str]:
    """Role node_labels: every label the node must carry (gpukit.provision.nodes)."""
    if not matches(declaration, gpukit_node_labels=extra,
                   gpukit_device_plugin_config=device_plugin_config,
                   gpukit_mig_config=mig_config):
        return nodes.declared_labels(extra, device_plugin_config, mig_config,
                                     deploy_device_plugin)
    out = dict(declaration["labels"])
    for label, name in ((ln.DEVICE_PLUGIN_CONFIG, device_plugin_config),
                        (ln.MIG_CONFIG, mig_config)):
        if name:
            out[label] = str(name)
    if deploy_device_plugin:
        out[ln.DEPLOY_DEVICE_PLUGIN] = "true"
    return out


def taints(declaration: Any, raw: Sequence[Mapping[str, Any]] | None) -> list[Taint]:
    """Role node_labels: the node's declared taints."""
    if matches(declaration, gpukit_node_taints=raw):
        return [Taint(key=t["key"], effect=t["effect"], value=t.get("value", ""))
                for t in declaration["taints"]]
    return nodes.parse_taints(raw, "gpukit_node_taints")


def expected_resources(declaration: Any, host_vars: Mapping[str, Any], host: str
                       ) -> dict[str, int]:
    """Roles device_plugin and rolling_upgrade: resource -> count the node must advertise for
    the declaration in its variables."""
    given = {k: host_vars[k] for k in inventory.DECLARED_VARIABLES if k in host_vars}
    if matches(declaration, **{k: given.get(k) for k in inventory.DECLARED_VARIABLES}):
        return dict(declaration["expected_resources"])
    return dict(for_vars(host, host_vars)["expected_resources"])
