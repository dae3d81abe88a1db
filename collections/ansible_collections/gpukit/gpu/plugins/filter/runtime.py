"""gpukit.gpu filters for the container runtime's hardening (gpukit.provision.toolkit_config,
through gpukit.provision.declaration).
Documentation: <filter>.yml beside this file (ansible-doc -t filter gpukit.gpu.<filter>)."""

from __future__ import annotations

from ansible_collections.gpukit.gpu.plugins.plugin_utils import gpukit_filters as gk

declared = gk.library("gpukit.provision.declaration")


@gk.gpukit_filter
def runtime_hardening_problems(configs, accept_envvar_unprivileged=False, host="", *,
                               declaration=None):
    return declared.hardening_problems(declaration, configs or {},
                                       bool(accept_envvar_unprivileged), str(host))


class FilterModule:
    def filters(self):
        return gk.filter_map(runtime_hardening_problems)
