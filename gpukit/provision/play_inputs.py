"""The library's decisions fed from what an Ansible play holds: other hosts' facts in
`hostvars`, k8s_info results (a list of resources), slurp's base64 content.

The collection's filters (gpukit.gpu.*) call these with their arguments as the play has them;
everything here is plain Python so that it is tested without Ansible. Values coming from a
play may carry Ansible's data tags: `plain` strips them before the library compares them.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import Any

from gpukit import inventory
from gpukit.contracts.label_names import DEVICE_PLUGIN_CONFIG
from gpukit.provision import agent, declaration, sharing_rollout, upgrade

# Facts the rolling upgrade sets on each host it reaches (role rolling_upgrade).
UPGRADE_RESULT = "rolling_upgrade_result"
UPGRADE_FAILURE = "rolling_upgrade_failure"


def host_facts(hostvars: Mapping[str, Any], hosts: Sequence[str], fact: str) -> dict[str, Any]:
    """`fact` of each of `hosts` (None where the host or the fact is missing)."""
    out: dict[str, Any] = {}
    for host in hosts:
        try:
            out[host] = hostvars[host].get(fact, None)
        except KeyError:
            out[host] = None
    return out


def merged_plugin_configs(
    hosts: Sequence[str], hostvars: Mapping[str, Any], fact: str
) -> dict[str, Any]:
    """Every host's named device plugin configs (its `fact`) as the one cluster-wide mapping;
    hosts without the fact contribute nothing. AgentSpecError: a name means two configs."""
    per_host = {h: inventory.plain(hostvars[h][fact]) for h in hosts if fact in hostvars[h]}
    return agent.merge_configs(per_host)


def merged_declarations(
    hosts: Sequence[str], hostvars: Mapping[str, Any], fact: str
) -> dict[str, Any]:
    """Every host's node declaration (its `fact`, agent.node_declaration) by node name, for
    the agents' declarations ConfigMap; hosts without it contribute nothing."""
    per_host = {h: inventory.plain(hostvars[h][fact]) for h in hosts if fact in hostvars[h]}
    return agent.merge_declarations(per_host)


def declarations_kept(found: Sequence[Mapping[str, Any]], declarations: Mapping[str, Any],
                      play_nodes: Sequence[str]) -> dict[str, Any]:
    """The play's `declarations` plus the entries the cluster's declarations ConfigMap
    (`found`: k8s_info's resources) holds for nodes outside the play, so a run limited to
    some hosts leaves the other nodes' agents their declarations. Entries that no longer
    parse are dropped (the next full run writes them again)."""
    from gpukit.contracts import node_declaration as nd

    kept: dict[str, Any] = {}
    data = (found[0].get("data") or {}) if found else {}
    for node, text in data.items():
        if node in play_nodes or node in declarations:
            continue
        try:
            kept[str(node)] = nd.parse(str(text), f"declarations[{node!r}]").as_dict()
        except (nd.DeclarationError, ValueError):
            continue
    kept.update(declarations)
    return dict(sorted(kept.items()))


def declaration_update(found: Sequence[Mapping[str, Any]], node: str,
                       decl: Mapping[str, Any] | None, namespace: str) -> dict[str, Any] | None:
    """The agents' declarations ConfigMap with `node`'s entry set to `decl` (removed when
    None), for a rollout that changes what the node serves; the other
    nodes' entries as the cluster has them (`found`: k8s_info's resources). None: the
    cluster's ConfigMap already says so."""
    from gpukit import agent_manifests
    from gpukit.contracts import node_declaration as nd

    data = (found[0].get("data") or {}) if found else {}
    if decl is None and node not in data:
        return None
    want = inventory.plain(dict(decl)) if decl is not None else None
    if want is not None and node in data:
        try:
            if nd.parse(str(data[node]), f"declarations[{node!r}]") == nd.from_dict(want):
                return None
        except (nd.DeclarationError, ValueError):
            pass  # unusable: written again
    entries = declarations_kept(found, {} if want is None else {node: want}, [node])
    return agent_manifests.declarations_config_map(entries, namespace)


def node_declaration(host_vars: Mapping[str, Any], host: str,
                     known: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """What `host`'s node agent must serve (agent.node_declaration)."""
    return agent.node_declaration(known, host_vars, host)


def failed_hosts(hostvars: Mapping[str, Any], hosts: Sequence[str],
                 fact: str = UPGRADE_RESULT) -> list[str]:
    """Hosts of `hosts` whose rollout result (`fact`) says it failed or was interrupted."""
    return upgrade.failed_so_far(host_facts(hostvars, hosts, fact))


def upgrade_report(planned: Mapping[str, Any], hostvars: Mapping[str, Any],
                   check_mode: bool = False) -> dict[str, Any]:
    """Each planned node's outcome from the rollout's per-host facts (upgrade.report)."""
    order = list(planned.get("order") or [])
    results = {h: hostvars[h].get(UPGRADE_RESULT, None) for h in order}
    failures = {h: hostvars[h].get(UPGRADE_FAILURE, None) for h in order}
    return upgrade.report(planned, results, failures, bool(check_mode)).as_dict()


def live_configs(config_map: Any) -> dict[str, Any] | None:
    """The configs of the agents' ConfigMap, given as k8s_info's `resources` (a list: the
    first) or as the object; None: there is no ConfigMap."""
    if isinstance(config_map, list):
        config_map = config_map[0] if config_map else None
    return sharing_rollout.parse_data(inventory.plain(config_map) if config_map else None)


def sharing_node_plan(config_map: Any, configs: Mapping[str, Any] | None,
                      declared: str | None = None, default: str | None = None,
                      current_label: str | None = None) -> dict[str, Any]:
    """{changes, label, plan_label}: a node's device plugin config in a rollout."""
    return sharing_rollout.node_plan(
        live_configs(config_map), inventory.plain(configs or {}), declared or None,
        default or None, current_label or None,
    ).as_dict()  # fmt: skip


def sharing_publish(config_map: Any, configs: Mapping[str, Any] | None,
                    namespace: str) -> dict[str, Any] | None:
    """The ConfigMap to apply before a rollout, or None when it already carries the configs."""
    data = sharing_rollout.publish(live_configs(config_map), inventory.plain(configs or {}))
    return None if data is None else sharing_rollout.config_map(data, namespace)


def node_uses(node_objects: Sequence[Mapping[str, Any]] | None, hostvars: Mapping[str, Any],
              hosts: Sequence[str]) -> list[sharing_rollout.NodeUse]:
    """Each cluster node's config label, with the inventory host that is that node (its
    gpukit_node_name, else its name) and the config the host declares."""
    by_node: dict[str, tuple[str | None, Any]] = {}
    for h in hosts:
        hv = hostvars[h]
        by_node[str(hv.get("gpukit_node_name") or h)] = (h, hv.get("gpukit_device_plugin_config"))
    uses = []
    for obj in node_objects or []:
        meta = obj.get("metadata") or {}
        name = str(meta.get("name"))
        label = (meta.get("labels") or {}).get(DEVICE_PLUGIN_CONFIG)
        host, declared = by_node.get(name, (None, None))
        uses.append(sharing_rollout.NodeUse(name, label or None, host, declared or None))
    return uses


def sharing_finish(config_map: Any, configs: Mapping[str, Any] | None,
                   node_objects: Sequence[Mapping[str, Any]] | None, hostvars: Mapping[str, Any],
                   hosts: Sequence[str], default: str | None, complete: bool,
                   namespace: str) -> dict[str, Any]:
    """The finish step: {stage, relabel, final, lines, needed}, stage and final as the
    ConfigMaps to apply (or None)."""
    f = sharing_rollout.finish(live_configs(config_map), inventory.plain(configs or {}),
                               node_uses(node_objects, hostvars, hosts), default or None,
                               bool(complete))  # fmt: skip
    out = f.as_dict()
    for key in ("stage", "final"):
        if out[key] is not None:
            out[key] = sharing_rollout.config_map(out[key], namespace)
    return out


def sharing_mounted(slurped: str | None, content: Any) -> bool:
    """A node's mounted config file, as slurp returns it (base64), carries `content`."""
    try:
        text = base64.b64decode(slurped or "").decode()
    except ValueError:  # not base64, or not UTF-8 text
        return False
    return sharing_rollout.mounted(text, inventory.plain(content))


def expected_resources(host_vars: Mapping[str, Any], host: str,
                       known: Mapping[str, Any] | None = None) -> dict[str, int]:
    """What the device plugin must advertise on `host` (resource -> count) for the
    declaration in its variables: the preflight's (`known`, the host's gpukit_declaration)
    when it validated these very variables, else validated now. InventoryError: the
    declaration is invalid."""
    return declaration.expected_resources(known, host_vars, host)
