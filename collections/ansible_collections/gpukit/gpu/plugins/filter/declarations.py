"""gpukit.gpu filters over a host's declaration as its play resolved it (gpukit.inventory, read
by gpukit.provision.play_inputs; the preflight's gpukit_declaration when it validated these
very variables: gpukit.provision.declaration). Documentation: <filter>.yml beside this file."""

from __future__ import annotations

from ansible_collections.gpukit.gpu.plugins.plugin_utils.gpukit_filters import (
    filter_map,
    gpukit_filter,
    library,
)

inventory = library("gpukit.inventory")
play_inputs = library("gpukit.provision.play_inputs")


@gpukit_filter
def expected_resources(hostvars, host, *, declaration=None):
    return play_inputs.expected_resources(hostvars, host, declaration)


@gpukit_filter
def declared_vars(hostvars):
    return inventory.declared_vars(hostvars)


class FilterModule:
    def filters(self):
        return filter_map(expected_resources, declared_vars)
