"""gpukit.gpu filters for the rolling upgrade (gpukit.provision.upgrade; per-host facts read
by gpukit.provision.play_inputs). Documentation: <filter>.yml beside this file."""

from __future__ import annotations

from ansible_collections.gpukit.gpu.plugins.plugin_utils import gpukit_filters as gk

upgrade = gk.library("gpukit.provision.upgrade")
play_inputs = gk.library("gpukit.provision.play_inputs")


@gk.gpukit_filter
def upgrade_plan(states, max_failed=None):
    return upgrade.plan([upgrade.node_state(s) for s in states], max_failed).as_dict()


@gk.gpukit_filter
def upgrade_driver_changes(summary, target_version=None, running_version=None):
    return upgrade.driver_changes(summary or [], target_version or None, running_version or None)


@gk.gpukit_filter
def upgrade_label_changes(changes, watched):
    return upgrade.label_changes(changes or [], watched)


@gk.gpukit_filter
def upgrade_pods_to_wait_for(pods, resource_prefixes=None, owner_kinds=("Job",)):
    # No prefixes given: the library's default (every nvidia.com/ resource).
    if resource_prefixes is None:
        return upgrade.pods_to_wait_for(pods or [], owner_kinds=owner_kinds)
    return upgrade.pods_to_wait_for(pods or [], resource_prefixes, owner_kinds)


@gk.gpukit_filter
def upgrade_pods_left(pods):
    return upgrade.pods_left(pods or [])


@gk.gpukit_filter
def upgrade_node_serves(node, expected, driver=None):
    return upgrade.node_serves(node or {}, expected or {}, driver or None)


@gk.gpukit_filter
def upgrade_declaration_served(node, expected):
    return upgrade.declaration_served(node or {}, expected or {})


@gk.gpukit_filter
def upgrade_declarations(found, node, declaration, namespace):
    return play_inputs.declaration_update(found or [], node, declaration or None, namespace)


@gk.gpukit_filter
def upgrade_agent_started_since(pods, since):
    return upgrade.agent_started_since(pods or [], since)


@gk.gpukit_filter
def upgrade_failed_hosts(hostvars, hosts, fact="rolling_upgrade_result"):
    return play_inputs.failed_hosts(hostvars, hosts, fact)


@gk.gpukit_filter
def upgrade_report(planned, hostvars, check_mode=False):
    return play_inputs.upgrade_report(planned, hostvars, check_mode)


class FilterModule:
    def filters(self):
        return gk.filter_map(upgrade_plan, upgrade_driver_changes, upgrade_label_changes,
                          upgrade_pods_to_wait_for, upgrade_pods_left, upgrade_node_serves,
                          upgrade_agent_started_since, upgrade_failed_hosts, upgrade_report,
                          upgrade_declaration_served, upgrade_declarations)
