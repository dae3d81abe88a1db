#!/usr/bin/python
# ruff: noqa: E402  (Ansible's layout: documentation strings before imports)
"""gpukit.gpu.gpu_facts: GPU facts through NVML (a thin adapter over gpukit.provision.gpu_facts)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_facts
short_description: Driver version, GPUs and MIG mode of a node, through NVML
description:
  - Loads C(libnvidia-ml.so.1) (the real driver's, or the gpukit lab's mock) and reports what
    NVML says, as the fact C(gpukit_gpu_facts).
  - Never fails because NVML cannot answer (driver not loaded, version mismatch after an
    upgrade); it reports C(nvml=false) and the error instead, so a play can decide to reboot.
  - Runs on the node with gpukit importable (the gpukit_node role's venv).
version_added: "0.1.0"
author: gpukit
options:
  library:
    description: Path of the NVML library to load; default is the system's.
    type: str
notes:
  - Read-only; supports check mode.
"""

EXAMPLES = r"""
- name: Read the GPUs through NVML
  gpukit.gpu.gpu_facts:
  vars:
    ansible_python_interpreter: /opt/gpukit/bin/python
"""

RETURN = r"""
ansible_facts:
  description: C(gpukit_gpu_facts) with nvml, error, driver_version, cuda_driver_version, gpu_count,
    gpus (index, uuid, name, memory_mib, pci_bus_id, compute_capability, mig_capable,
    mig_mode_current, mig_mode_pending, mig_devices), products, mig_enabled_gpus,
    mig_pending_change_gpus, nouveau_loaded.
  returned: always
  type: dict
"""

from ansible_collections.gpukit.gpu.plugins.module_utils import gpukit_common as gk


def main():
    module = gk.ansible_module({"library": {"type": "str"}})
    from gpukit.provision import gpu_facts

    facts = gpu_facts.gather(library=module.params["library"])
    module.exit_json(changed=False, ansible_facts={"gpukit_gpu_facts": facts.as_dict()})


if __name__ == "__main__":
    main()
