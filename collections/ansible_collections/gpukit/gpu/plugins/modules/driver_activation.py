#!/usr/bin/python
# ruff: noqa: E402  (Ansible's layout: documentation strings before imports)
"""gpukit.gpu.driver_activation: make the installed NVIDIA driver the running one without a
reboot where the driver allows (a thin adapter over gpukit.provision.driver_reload)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: driver_activation
short_description: Reload the NVIDIA kernel modules for the installed driver, or say why not
description:
  - Plans how the installed driver becomes the running one (C(none), C(reload), C(reboot), or
    C(fail) when the policy forbids the reboot that is due), from the versions NVML reports and
    the processes holding a C(/dev/nvidia*) file; those in O(stoppable_units) do not count (the
    role stops them first).
  - With O(reload=true) and a C(reload) plan (not in check mode), unloads the modules
    (C(modprobe -r nvidia_uvm nvidia_drm nvidia_modeset nvidia)), loads C(nvidia) and
    C(nvidia_uvm), and checks through NVML that the loaded driver is the installed one. When
    the unload is refused (a process holds a device) or the check fails, the result is a
    C(reboot) (or C(fail)) whose reason names the holders (pid, command).
version_added: "0.2.0"
author: gpukit
options:
  policy:
    description: C(reload), C(reboot) or C(reload-else-reboot) (role nvidia_driver_activation).
    type: str
    required: true
  target_version:
    description: The installed driver's version; empty when no driver is declared.
    type: str
    default: ""
  loaded_version:
    description: The version NVML reports; empty when NVML could not answer.
    type: str
    default: ""
  nvml_error:
    description: NVML's error when it could not answer.
    type: str
    default: ""
  nouveau_loaded:
    description: Whether nouveau is loaded.
    type: bool
    default: false
  stoppable_units:
    description: systemd units the role stops before unloading (their processes do not block).
    type: list
    elements: str
    default: []
  reload:
    description: Reload the modules when the plan says so (false, or check mode, plans only).
    type: bool
    default: false
notes:
  - Supports check mode (plans only).
"""

EXAMPLES = r"""
- name: Reload the driver's modules
  gpukit.gpu.driver_activation:
    policy: reload-else-reboot
    target_version: "570.86.15"
    nvml_error: Driver/library version mismatch
    reload: true
  vars:
    ansible_python_interpreter: /opt/gpukit/bin/python
"""

RETURN = r"""
activation:
  description: C(action) (none, reload, reboot, fail), C(reason), C(reloaded) (whether the
    modules were reloaded by this task), C(holders) (pid, comm, device, unit of each process
    holding a device file).
  returned: always
  type: dict
"""

from ansible_collections.gpukit.gpu.plugins.module_utils import gpukit_common as gk


def main():
    module = gk.ansible_module({
        "policy": {"type": "str", "required": True},
        "target_version": {"type": "str", "default": ""},
        "loaded_version": {"type": "str", "default": ""},
        "nvml_error": {"type": "str", "default": ""},
        "nouveau_loaded": {"type": "bool", "default": False},
        "stoppable_units": {"type": "list", "elements": "str", "default": []},
        "reload": {"type": "bool", "default": False},
    })
    from gpukit.provision import driver_reload, gpu_facts

    p = module.params

    def run(argv):
        rc, _out, err = module.run_command(argv)
        return rc, err

    try:
        result = driver_reload.activate(
            p["policy"], p["target_version"] or None, p["loaded_version"] or None,
            p["nvml_error"] or None, p["nouveau_loaded"], p["stoppable_units"],
            reload=p["reload"] and not module.check_mode, run=run,
            facts=lambda: gpu_facts.gather().as_dict())
    except ValueError as e:
        module.fail_json(msg=str(e))
    module.exit_json(changed=result["reloaded"], activation=result)


if __name__ == "__main__":
    main()
