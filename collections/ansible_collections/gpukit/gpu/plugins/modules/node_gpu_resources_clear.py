#!/usr/bin/python
# ruff: noqa: E402  (Ansible's layout: documentation strings before imports)
"""gpukit.gpu.node_gpu_resources_clear: remove the nvidia.com/ extended resources from a Node's
status (a node moving to DRA; gpukit.provision.dra_switch.clear_stale_resources)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: node_gpu_resources_clear
short_description: Remove the nvidia.com/ extended resources from a Node's status
description:
  - Removes every C(nvidia.com/) resource from the Node's C(status.capacity) and
    C(status.allocatable) with a JSON patch of its status subresource, as Kubernetes documents
    removing an extended resource. A node moving from the device plugin to DRA keeps them once
    the kubelet no longer manages them, and the scheduler would place pods on the stale count.
  - Runs where the Kubernetes API is reached (delegate it there), with the kubernetes client
    and gpukit importable. Check mode reports what it would remove.
version_added: "0.1.0"
author: gpukit
options:
  name:
    description: The Node's name.
    type: str
    required: true
  kubeconfig:
    description: The kubeconfig file; empty means C($KUBECONFIG), C(~/.kube/config), then the
      pod's ServiceAccount.
    type: str
    default: ""
"""

EXAMPLES = r"""
- name: Remove the device plugin's resources from the node's status
  gpukit.gpu.node_gpu_resources_clear:
    name: gpu-t4
  delegate_to: localhost
"""

RETURN = r"""
removed:
  description: The resources removed (in check mode, that would be removed).
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpukit.gpu.plugins.module_utils.gpukit_common import require_gpukit


def main():
    module = AnsibleModule(
        argument_spec={
            "name": {"type": "str", "required": True},
            "kubeconfig": {"type": "str", "default": ""},
        },
        supports_check_mode=True,
    )
    require_gpukit(module)
    from gpukit.k8s import connect
    from gpukit.provision import dra_switch

    try:
        core = connect.core(module.params["kubeconfig"] or None)
        removed = dra_switch.clear_stale_resources(core, module.params["name"],
                                                   dry_run=module.check_mode)
    except Exception as e:  # the API's answer, as the task's message
        module.fail_json(msg=f"node {module.params['name']}: {e}")
    module.exit_json(changed=bool(removed), removed=removed,
                     diff={"before": {"nvidia.com/": removed}, "after": {"nvidia.com/": []}})


if __name__ == "__main__":
    main()
