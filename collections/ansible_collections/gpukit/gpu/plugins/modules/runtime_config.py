#!/usr/bin/python
# ruff: noqa: E402  (Ansible's layout: documentation strings before imports)
"""gpukit.gpu.runtime_config: containerd / CRI-O config for the nvidia runtime
(a thin adapter over gpukit.provision.runtime and runtime_plan)."""

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
  - containerd's own verdict decides (C(containerd config dump) of the files before and of a
    private copy of the planned files, where a containerd binary is found) - the plan is
    refused, nothing written, unless containerd would load it and run the runtime as asked;
    C(restart_needed) is true only when containerd's effective config changes, so a comment
    or layout edit needs no restart. Without a binary, gpukit reads the files itself.
  - A main file that is not valid TOML, not containerd's (a CRI-O config, unknown top-level
    keys), or of an unsupported version (1, or above 3) is refused and left as it was.
version_added: "0.1.0"
author: gpukit
options:
  runtime:
    description: The container runtime.
    type: str
    choices: [containerd, crio]
    default: containerd
  mode:
    description:
      - Edit the main file in place, or write a drop-in (containerd).
      - In place, another loaded file that defines the runtime too is reported as a warning.
      - As a drop-in, such a file (e.g. NVIDIA's own conf.d/99-nvidia.toml) is replaced when it
        holds only the NVIDIA runtime's settings, its text kept as C(<path>.replaced-by-gpukit);
        one holding other settings too is refused by name.
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
  containerd_binary:
    description:
      - The containerd binary that judges the config (C(containerd config dump)); it also
        decides the version of a new main file (3 for containerd 2, else 2).
      - Default - C(containerd) on PATH, /usr/local/bin or /usr/bin; none found - gpukit's
        own reading of the files. Given but missing - the module fails.
    type: path
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
restart_needed:
  description: containerd's effective config changes (restart it); CRI-O - any file changed.
  returned: always
  type: bool
effective_changes:
  description: What differs in the runtime's effective config, one dotted key per line.
  returned: always
  type: list
  elements: str
judge:
  description: What judged the effective config (containerd config dump, or gpukit's reading).
  returned: always
  type: str
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

from ansible_collections.gpukit.gpu.plugins.module_utils import gpukit_common as gk


def write_all(module, edits):
    """Write (or remove) every changed file; put back the ones done when one fails, so that
    nothing is half-applied."""
    done = []
    try:
        for e in edits:
            if e.after is None:
                os.unlink(e.path)
            else:
                gk.write_text(module, e.path, e.after)
            done.append(e)
    except OSError as err:
        for e in reversed(done):
            if e.before is None:
                os.unlink(e.path)
            else:
                gk.write_text(module, e.path, e.before)
        module.fail_json(msg=f"{e.path}: {err}; the files written before it were put back")


def main():
    module = gk.ansible_module({
        "runtime": {"type": "str", "choices": ["containerd", "crio"], "default": "containerd"},
        "mode": {"type": "str", "choices": ["in_place", "drop_in"], "default": "in_place"},
        "config_path": {"type": "path", "default": "/etc/containerd/config.toml"},
        "dropin_path": {"type": "path"},
        "import_pattern": {"type": "str", "default": "/etc/containerd/conf.d/*.toml"},
        "containerd_binary": {"type": "path"},
        "runtime_name": {"type": "str", "default": "nvidia"},
        "binary": {"type": "path", "default": "/usr/bin/nvidia-container-runtime"},
        "set_as_default": {"type": "bool", "default": False},
        "enable_cdi": {"type": "bool", "default": True},
        "cdi_spec_dirs": {
            "type": "list",
            "elements": "path",
            "default": ["/etc/cdi", "/var/run/cdi"],
        },
    })
    from gpukit.provision import runtime, runtime_plan

    p = module.params
    settings = runtime.RuntimeSettings(
        runtime_name=p["runtime_name"],
        binary=p["binary"],
        set_as_default=p["set_as_default"],
        enable_cdi=p["enable_cdi"],
        cdi_spec_dirs=tuple(p["cdi_spec_dirs"]),
    )
    try:
        if p["runtime"] == "crio":
            path = p["dropin_path"] or "/etc/crio/crio.conf.d/99-gpukit-nvidia.conf"
            edit = runtime.with_current(runtime.crio_dropin(settings, path), gk.read_text(path))
            edits, restart, effective, judge = [edit], edit.changed, [], "CRI-O: any change"
        else:
            ctd = p["containerd_binary"]
            if ctd and not os.access(ctd, os.X_OK):
                module.fail_json(msg=f"containerd_binary {ctd} is not an executable file")
            ctd = ctd or module.get_bin_path("containerd", opt_dirs=["/usr/local/bin", "/usr/bin"])
            plan = runtime_plan.plan_containerd(
                settings,
                mode=p["mode"],
                main_path=p["config_path"],
                dropin_path=p["dropin_path"] or runtime_plan.DEFAULT_DROPIN,
                import_pattern=p["import_pattern"],
                binary=ctd,
            )
            edits, restart = list(plan.edits), plan.restart_needed
            effective, judge = list(plan.effective_changes), plan.judge
            for warning in plan.warnings:
                module.warn(warning)
    except runtime.RuntimeConfigError as e:
        module.fail_json(msg=str(e))
    changed = [e for e in edits if e.changed]
    if changed and not module.check_mode:
        write_all(module, changed)
    result = {
        "changed": bool(changed),
        "restart_needed": restart,
        "effective_changes": effective,
        "judge": judge,
        "changes": [c for e in edits for c in e.changes],
        "files": [e.path for e in changed],
    }
    if module._diff:
        result["diff"] = [e.ansible_diff() for e in changed]
    module.exit_json(**result)


if __name__ == "__main__":
    main()
