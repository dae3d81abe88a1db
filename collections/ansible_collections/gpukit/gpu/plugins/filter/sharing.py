"""gpukit.gpu filters for GPU sharing: a node's sharing declarations (gpukit.provision.sharing,
or the preflight's result: gpukit.provision.declaration)
and rolling a device plugin config's new content out (gpukit.provision.sharing_rollout, fed
by gpukit.provision.play_inputs). Documentation: <filter>.yml beside this file."""

from __future__ import annotations

from ansible_collections.gpukit.gpu.plugins.plugin_utils import gpukit_filters as gk

declared = gk.library("gpukit.provision.declaration")
play_inputs = gk.library("gpukit.provision.play_inputs")


@gk.gpukit_filter
def sharing_check(plugin_configs, plugin_config=None, mig_configs=None, mig_config=None, *,
                  declaration=None):
    c = declared.sharing_check(declaration, plugin_configs or {}, plugin_config or None,
                               mig_configs or {}, mig_config or None)
    return {"ok": c.ok, "problems": c.problems, "warnings": c.warnings,
            "shared_replicas": c.shared_replicas, "strategy": c.strategy}


@gk.gpukit_filter
def sharing_node_plan(config_map, configs, declared=None, default=None, current_label=None):
    return play_inputs.sharing_node_plan(config_map, configs, declared, default, current_label)


@gk.gpukit_filter
def sharing_publish(config_map, configs, namespace):
    return play_inputs.sharing_publish(config_map, configs, namespace)


@gk.gpukit_filter
def sharing_finish(config_map, configs, node_objects, hostvars, hosts, default, complete,
                   namespace):
    return play_inputs.sharing_finish(config_map, configs, node_objects, hostvars, hosts,
                                      default, complete, namespace)


@gk.gpukit_filter
def sharing_mounted(slurped, content):
    return play_inputs.sharing_mounted(slurped, content)


class FilterModule:
    def filters(self):
        return gk.filter_map(sharing_check, sharing_node_plan, sharing_publish, sharing_finish,
                          sharing_mounted)
