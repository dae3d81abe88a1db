"""gpukit.gpu filters for switching a node between the device plugin and DRA
(gpukit.provision.dra_switch; role device_plugin's allocation_switch tasks, the preflight's
refusal, the rolling upgrade's plan). Documentation: <filter>.yml beside this file."""

from __future__ import annotations

from ansible_collections.gpukit.gpu.plugins.plugin_utils import gpukit_filters as gk

dra_switch = gk.library("gpukit.provision.dra_switch")


@gk.gpukit_filter
def allocation_change(node, declared):
    change = dra_switch.allocation_change(node or None, declared)
    return [change] if change else []


@gk.gpukit_filter
def allocation_switch_refusal(nodes, pods, declared, node_name):
    return dra_switch.switch_refusal(node_name, next(iter(nodes or []), None), declared,
                                     pods or [])


@gk.gpukit_filter
def allocation_switch_checkpoint(text):
    return dra_switch.checkpoint_holds_device_plugin_resources(text or "")


@gk.gpukit_filter
def allocation_switch_claims(texts, claims, node_name):
    if isinstance(texts, str) or texts is None:
        texts = [texts or ""]
    return dra_switch.claims_left([t or "" for t in texts], claims, node_name)


@gk.gpukit_filter
def allocation_switch_actions(declared, checkpoint=None, node=None, slices=None):
    return dra_switch.switch_actions(declared, checkpoint=checkpoint or [], node=node or {},
                                     slices=slices or [])


@gk.gpukit_filter
def allocation_switch_reported(node, since):
    return dra_switch.reported_since(node or {}, since)


class FilterModule:
    def filters(self):
        return gk.filter_map(allocation_change, allocation_switch_refusal,
                          allocation_switch_checkpoint, allocation_switch_claims,
                          allocation_switch_actions, allocation_switch_reported)
