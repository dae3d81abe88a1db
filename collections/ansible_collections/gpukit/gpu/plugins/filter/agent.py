"""gpukit.gpu filters for the node agent that role device_plugin deploys (gpukit.provision.agent).
Documentation: <filter>.yml beside this file (ansible-doc -t filter gpukit.gpu.<filter>)."""

from __future__ import annotations

from ansible_collections.gpukit.gpu.plugins.plugin_utils import gpukit_filters as gk

agent = gk.library("gpukit.provision.agent")
play_inputs = gk.library("gpukit.provision.play_inputs")


@gk.gpukit_filter
def merge_plugin_configs(hosts, hostvars, fact):
    return play_inputs.merged_plugin_configs(hosts, hostvars, fact)


@gk.gpukit_filter
def merge_agent_declarations(hosts, hostvars, fact):
    return play_inputs.merged_declarations(hosts, hostvars, fact)


@gk.gpukit_filter
def keep_other_declarations(found, declarations, play_nodes):
    return play_inputs.declarations_kept(found or [], declarations or {}, play_nodes or [])


@gk.gpukit_filter
def agent_declaration(hostvars, host, *, declaration=None):
    return play_inputs.node_declaration(hostvars, host, declaration)


@gk.gpukit_filter
def device_plugin_node_serves(node, expected, selector):
    return agent.node_serves_declared(node or {}, expected or {}, selector or {})


@gk.gpukit_filter
def dra_node_serves(slices, expected):
    return not agent.dra_slice_differences(slices or [], expected or [])


@gk.gpukit_filter
def dra_declaration_served(node, expected):
    return agent.dra_declaration_served(node or {}, expected or [])


@gk.gpukit_filter
def expected_dra_devices(hostvars, host, *, declaration=None):
    return agent.expected_dra_devices(declaration, hostvars, host)


class FilterModule:
    def filters(self):
        return gk.filter_map(merge_plugin_configs, merge_agent_declarations,
                             keep_other_declarations, agent_declaration,
                             device_plugin_node_serves, dra_node_serves, dra_declaration_served,
                             expected_dra_devices)
