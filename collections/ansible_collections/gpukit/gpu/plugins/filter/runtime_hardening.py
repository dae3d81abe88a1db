"""gpukit.gpu filters for the runtime's hardening: thin adapters over
gpukit.provision.toolkit_config, run on the controller."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

try:
    from gpukit.provision import toolkit_config

    HAS_GPUKIT = True
except ImportError as e:  # pragma: no cover - reported when a filter is used
    HAS_GPUKIT = False
    IMPORT_ERROR = e


def _need():
    if not HAS_GPUKIT:
        raise AnsibleFilterError(
            f"gpukit is not importable on the controller ({IMPORT_ERROR}): run ansible-playbook"
            " from gpukit's environment (.venv)"
        )


def runtime_hardening_problems(configs, accept_envvar_unprivileged=False, host=""):
    """`gpukit_device_plugin_configs | gpukit.gpu.runtime_hardening_problems(...)`: one line per
    named config that cannot serve unprivileged pods under the runtime's settings."""
    _need()
    return toolkit_config.hardening_problems(configs or {}, bool(accept_envvar_unprivileged),
                                             str(host))


class FilterModule:
    def filters(self):
        return {"runtime_hardening_problems": runtime_hardening_problems}
