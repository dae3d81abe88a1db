#!/usr/bin/python
# ruff: noqa: E402  (Ansible's layout: documentation strings before imports)
"""gpukit.gpu.cdi_spec: the node's CDI spec from NVML (a thin adapter over gpukit.provision.cdi)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: cdi_spec
short_description: Write the node's CDI spec for its NVIDIA GPUs and MIG devices
description:
  - Discovers the GPUs and MIG devices through NVML and writes a CDI spec (kind
    C(nvidia.com/gpu)) naming each by index (C(<gpu>), C(<gpu>:<mig>)) and UUID, plus C(all).
  - Spec-wide edits as C(nvidia-ctk cdi generate) writes them, found under O(driver_root):
    the control nodes, C(NVIDIA_VISIBLE_DEVICES=void) and C(NVIDIA_CTK_LIBCUDA_DIR), the
    driver's C(*.so.<driver version>) libraries, binaries, IPC sockets and GSP firmware as
    read-only binds, and the C(nvidia-cdi-hook) hooks (create-symlinks, enable-cuda-compat,
    update-ldcache, disable-device-node-modification) when C(/usr/bin/nvidia-cdi-hook) is
    installed; without it the libraries' soname links are bound instead.
  - gpukit's replacement for C(nvidia-ctk cdi generate).
version_added: "0.1.0"
author: gpukit
options:
  path:
    description: The spec file.
    type: path
    default: /etc/cdi/nvidia.yaml
  library:
    description: NVML library to load (default the system's).
    type: str
  driver_root:
    description: Where the driver's files are installed (a driver container's root).
    type: path
    default: /
notes:
  - Supports check mode and diff mode.
"""

EXAMPLES = r"""
- name: Generate the CDI spec
  gpukit.gpu.cdi_spec:
    path: /etc/cdi/nvidia.yaml
"""

RETURN = r"""
devices:
  description: Number of GPUs and MIG devices in the spec.
  returned: always
  type: int
"""

from ansible_collections.gpukit.gpu.plugins.module_utils import gpukit_common as gk


def main():
    module = gk.ansible_module({
        "path": {"type": "path", "default": "/etc/cdi/nvidia.yaml"},
        "library": {"type": "str"},
        "driver_root": {"type": "path", "default": "/"},
    })
    from gpukit.plugin import nvml
    from gpukit.provision import cdi

    try:
        if module.params["library"]:
            nvml.load_library(module.params["library"])
        nvml.init()
        try:
            inv = nvml.discover(with_topology=False)
        finally:
            nvml.shutdown()
    except nvml.NvmlError as e:
        module.fail_json(msg=f"NVML cannot list the GPUs for the CDI spec: {e}")
    path = module.params["path"]
    edit = cdi.plan(inv, gk.read_text(path), path, driver_root=module.params["driver_root"])
    if edit.changed and not module.check_mode:
        gk.write_text(module, path, edit.after)
    result = {
        "changed": edit.changed,
        "changes": list(edit.changes),
        "devices": len(inv.gpus) + sum(len(g.mig_devices) for g in inv.gpus),
    }
    if module._diff and edit.changed:
        result["diff"] = edit.ansible_diff()
    module.exit_json(**result)


if __name__ == "__main__":
    main()
