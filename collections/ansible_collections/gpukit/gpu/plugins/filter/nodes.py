"""gpukit.gpu filters for a node's labels and taints (gpukit.provision.nodes, or the
preflight's result: gpukit.provision.declaration).
Documentation: <filter>.yml beside this file (ansible-doc -t filter gpukit.gpu.<filter>)."""

from __future__ import annotations

from collections.abc import Mapping

from ansible_collections.gpukit.gpu.plugins.plugin_utils import gpukit_filters as gk

nodes = gk.library("gpukit.provision.nodes")
declared = gk.library("gpukit.provision.declaration")


@gk.gpukit_filter
def node_labels(extra, device_plugin_config=None, mig_config=None, deploy_device_plugin=True, *,
                declaration=None, gpu_allocation=None, dra_shares=None):
    labels = declared.labels(declaration, extra, device_plugin_config or None, mig_config or None,
                             deploy_device_plugin)
    # Not given (the rolling upgrade's plan): the declaration's, as the preflight validated it.
    if not gpu_allocation and isinstance(declaration, Mapping):
        gpu_allocation = declaration.get("gpu_allocation")
        dra_shares = dra_shares or declaration.get("dra_shares")
    return nodes.with_allocation(labels, gpu_allocation or None,
                                 None if dra_shares in (None, "") else dra_shares)


@gk.gpukit_filter
def node_patch(node, labels, taints=None, *, declaration=None):
    p = nodes.plan(node, labels, declared.taints(declaration, taints))
    return {"patch": p.patch, "changes": list(p.changes), "needed": p.changed}


class FilterModule:
    def filters(self):
        return gk.filter_map(node_labels, node_patch)
