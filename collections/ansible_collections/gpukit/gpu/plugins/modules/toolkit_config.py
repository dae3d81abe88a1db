#!/usr/bin/python
# ruff: noqa: E402  (Ansible's layout: documentation strings before imports)
"""gpukit.gpu.toolkit_config: the NVIDIA container runtime's hardening keys in its config.toml
(a thin adapter over gpukit.provision.toolkit_config)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: toolkit_config
short_description: Set the NVIDIA container runtime's device request hardening
description:
  - Edits C(/etc/nvidia-container-runtime/config.toml) in place so that
    C(accept-nvidia-visible-devices-envvar-when-unprivileged) and
    C(accept-nvidia-visible-devices-as-volume-mounts) have the wanted values; the rest of the
    file, its comments and layout stay as they are. A commented-out default line is replaced
    where it stands.
  - NVIDIA's hardening for Kubernetes is the default - unprivileged containers cannot ask for
    GPUs through C(NVIDIA_VISIBLE_DEVICES); the device plugin's list comes as volume mounts.
version_added: "0.1.0"
author: gpukit
options:
  path:
    description: The runtime's config file.
    type: path
    default: /etc/nvidia-container-runtime/config.toml
  accept_envvar_unprivileged:
    description: Value of C(accept-nvidia-visible-devices-envvar-when-unprivileged).
    type: bool
    default: false
  accept_volume_mounts:
    description: Value of C(accept-nvidia-visible-devices-as-volume-mounts).
    type: bool
    default: true
notes:
  - Supports check mode and diff mode.
"""

EXAMPLES = r"""
- name: Harden the NVIDIA container runtime
  gpukit.gpu.toolkit_config:
    accept_envvar_unprivileged: false
"""

RETURN = r"""
changes:
  description: What changed, in words.
  returned: always
  type: list
  elements: str
"""

from ansible_collections.gpukit.gpu.plugins.module_utils import gpukit_common as gk


def main():
    module = gk.ansible_module({
        "path": {"type": "path", "default": "/etc/nvidia-container-runtime/config.toml"},
        "accept_envvar_unprivileged": {"type": "bool", "default": False},
        "accept_volume_mounts": {"type": "bool", "default": True},
    })
    from gpukit.provision import toolkit_config

    path = module.params["path"]
    settings = toolkit_config.ToolkitSettings(
        accept_envvar_unprivileged=module.params["accept_envvar_unprivileged"],
        accept_volume_mounts=module.params["accept_volume_mounts"],
    )
    try:
        edit = toolkit_config.plan(gk.read_text(path), settings, path)
    except toolkit_config.ToolkitConfigError as e:
        module.fail_json(msg=str(e))
    if edit.changed and not module.check_mode:
        gk.write_text(module, path, edit.after)
    result = {"changed": edit.changed, "changes": list(edit.changes)}
    if module._diff and edit.changed:
        result["diff"] = edit.ansible_diff()
    module.exit_json(**result)


if __name__ == "__main__":
    main()
