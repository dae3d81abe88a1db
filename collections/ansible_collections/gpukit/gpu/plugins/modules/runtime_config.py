#!/usr/bin/python
# ruff: noqa: E402  (Ansible's layout: documentation strings before imports)
"""gpukit.gpu.runtime_config: containerd / CRI-O config for the nvidia runtime
(a thin adapter over gpukit.provision.runtime)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: runtime_config
short_description: Configure containerd or CRI-O for the NVIDIA container runtime
description:
  - containerd (config version 2 or 3), in place - the main file is edited with tomlkit,
    keeping the rest of it and its comments - or as a drop-in the main file imports.
  - CRI-O, as a drop-in under crio.conf.d.
  - Adds the runtime (runc v2 shim running nvidia-container-runtime, with runc's options),
    optionally makes it the default, enables CDI with its spec directories.
version_added: "0.1.0"
author: gpukit
options:
  runtime:
    description: The container runtime.
    type: str
    choices: [containerd, crio]
    default: containerd
  mode:
    description: Edit the main file in place, or write a drop-in (containerd).
    type: str
    choices: [in_place, drop_in]
    default: in_place
  config_path:
    description: containerd's main config file.
    type: path
    default: /etc/containerd/config.toml
  dropin_path:
    description: The drop-in file (containerd drop_in mode, CRI-O).
    type: path
  import_pattern:
    description: What the main file must import for the drop-in (containerd drop_in mode).
    type: str
    default: /etc/containerd/conf.d/*.toml
  runtime_name:
    description: Name of the runtime.
    type: str
    default: nvidia
  binary:
    description: The runtime binary.
    type: path
    default: /usr/bin/nvidia-container-runtime
  set_as_default:
    description: Make it the default runtime (false puts runc back when it was).
    type: bool
    default: false
  enable_cdi:
    description: Enable CDI.
    type: bool
    default: true
  cdi_spec_dirs:
    description: CDI spec directories (added to the ones configured).
    type: list
    elements: path
    default: [/etc/cdi, /var/run/cdi]
notes:
  - Supports check mode and diff mode.
"""

EXAMPLES = r"""
- name: Configure containerd for the nvidia runtime
  gpukit.gpu.runtime_config:
    runtime: containerd
    set_as_default: false
  notify: Restart containerd
"""

RETURN = r"""
changes:
  description: What changed, per setting.
  returned: always
  type: list
  elements: str
files:
  description: The files written (or that would be).
  returned: always
  type: list
  elements: str
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpukit.gpu.plugins.module_utils.gpukit_common import (
    read_text,
    require_gpukit,
    write_text,
)


def main():
    module = AnsibleModule(
        argument_spec={
            "runtime": {"type": "str", "choices": ["containerd", "crio"], "default": "containerd"},
            "mode": {"type": "str", "choices": ["in_place", "drop_in"], "default": "in_place"},
            "config_path": {"type": "path", "default": "/etc/containerd/config.toml"},
            "dropin_path": {"type": "path"},
            "import_pattern": {"type": "str", "default": "/etc/containerd/conf.d/*.toml"},
            "runtime_name": {"type": "str", "default": "nvidia"},
            "binary": {"type": "path", "default": "/usr/bin/nvidia-container-runtime"},
            "set_as_default": {"type": "bool", "default": False},
            "enable_cdi": {"type": "bool", "default": True},
            "cdi_spec_dirs": {
                "type": "list",
                "elements": "path",
                "default": ["/etc/cdi", "/var/run/cdi"],
            },
        },
        supports_check_mode=True,
    )
    require_gpukit(module)
    from gpukit.provision import runtime

    p = module.params
    settings = runtime.RuntimeSettings(
        runtime_name=p["runtime_name"],
        binary=p["binary"],
        set_as_default=p["set_as_default"],
        enable_cdi=p["enable_cdi"],
        cdi_spec_dirs=tuple(p["cdi_spec_dirs"]),
    )
    edits = []
    try:
        if p["runtime"] == "crio":
            path = p["dropin_path"] or "/etc/crio/crio.conf.d/99-gpukit-nvidia.conf"
            edits.append(runtime.with_current(runtime.crio_dropin(settings, path), read_text(path)))
        else:
            main_path = p["config_path"]
            main_text = read_text(main_path)
            if p["mode"] == "in_place":
                edits.append(runtime.configure_containerd(main_text, settings, main_path))
                # Switching from drop_in: gpukit's drop-in would override the main file.
                dropin = p["dropin_path"] or "/etc/containerd/conf.d/99-gpukit-nvidia.toml"
                old_dropin = read_text(dropin)
                if old_dropin is not None and old_dropin.startswith("# Managed by gpukit"):
                    edits.append(
                        runtime.Edit(
                            path=dropin,
                            before=old_dropin,
                            after=None,
                            changes=(f"{dropin}: removed (in_place mode)",),
                        )
                    )
            else:
                if main_text is None:
                    module.fail_json(
                        msg=f"{main_path} is missing: drop_in mode needs the main"
                        " file (it must import the drop-in directory)"
                    )
                path = p["dropin_path"] or "/etc/containerd/conf.d/99-gpukit-nvidia.toml"
                dropin = runtime.containerd_dropin(main_text, settings, main_path, path)
                edits.append(runtime.with_current(dropin, read_text(path)))
                edits.append(runtime.ensure_import(main_text, p["import_pattern"], main_path))
    except runtime.RuntimeConfigError as e:
        module.fail_json(msg=str(e))
    changed = [e for e in edits if e.changed]
    if changed and not module.check_mode:
        for e in changed:
            if e.after is None:
                os.unlink(e.path)
            else:
                write_text(module, e.path, e.after)
    result = {
        "changed": bool(changed),
        "changes": [c for e in edits for c in e.changes],
        "files": [e.path for e in changed],
    }
    if module._diff:
        result["diff"] = [e.ansible_diff() for e in changed]
    module.exit_json(**result)


if __name__ == "__main__":
    main()
