"""gpukit.gpu filters over a host's declaration as its play resolved it (gpukit.inventory, read
by gpukit.provision.play_inputs; the preflight's gpukit_declaration when it validated these
very variables: gpukit.provision.declaration). Documentation: <filter>.yml beside this file."""

from __future__ import annotations

from ansible_collections.gpukit.gpu.plugins.plugin_utils import gpukit_filters as gk

inventory = gk.library("gpukit.inventory")
play_inputs = gk.library("gpukit.provision.play_inputs")


@gk.gpukit_filter
def expected_resources(hostvars, host, *, declaration=None):
    return play_inputs.expected_resources(hostvars, host, declaration)


@gk.gpukit_filter
def declared_vars(hostvars):
    return inventory.declared_vars(hostvars)


class FilterModule:
    def filters(self):
        return gk.filter_map(expected_resources, declared_vars)
