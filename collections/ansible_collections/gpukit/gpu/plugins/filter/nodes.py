"""gpukit.gpu filters for a node's labels and taints (gpukit.provision.nodes).
Documentation: <filter>.yml beside this file (ansible-doc -t filter gpukit.gpu.<filter>)."""

from __future__ import annotations

from ansible_collections.gpukit.gpu.plugins.plugin_utils.gpukit_filters import (
    filter_map,
    gpukit_filter,
    library,
)

nodes = library("gpukit.provision.nodes")


@gpukit_filter
def node_labels(extra, device_plugin_config=None, mig_config=None, deploy_device_plugin=True):
    return nodes.declared_labels(extra, device_plugin_config or None, mig_config or None,
                                 deploy_device_plugin)


@gpukit_filter
def node_patch(node, labels, taints=None):
    p = nodes.plan(node, labels, nodes.parse_taints(taints, "gpukit_node_taints"))
    return {"patch": p.patch, "changes": list(p.changes), "needed": p.changed}


class FilterModule:
    def filters(self):
        return filter_map(node_labels, node_patch)
