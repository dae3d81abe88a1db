#!/usr/bin/python
# ruff: noqa: E402  (Ansible's layout: documentation strings before imports)
"""gpukit.gpu.node_device_plugin_clear: remove what the device plugin left on a Node moving to
DRA (gpukit.provision.dra_switch.clear_device_plugin)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: node_device_plugin_clear
short_description: Remove what the device plugin left on a Node moving to DRA
description:
  - Removes every C(nvidia.com/) resource from the Node's C(status.capacity) and
    C(status.allocatable) with a JSON patch of its status subresource, as Kubernetes documents
    removing an extended resource, and the node agent's labels (GFD's counts, replicas,
    product, driver versions). A node moving from the device plugin to DRA keeps both once the
    node agent has left: the scheduler would place pods on the stale count, and readers of the
    labels would take them for what the node serves.
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
- name: Remove what the device plugin left on the node
  gpukit.gpu.node_device_plugin_clear:
    name: gpu-t4
  delegate_to: localhost
"""

RETURN = r"""
resources:
  description: The resources removed from the status (in check mode, that would be).
  returned: always
  type: list
  elements: str
labels:
  description: The node agent's labels removed (in check mode, that would be).
  returned: always
  type: list
  elements: str
"""

from ansible_collections.gpukit.gpu.plugins.module_utils import gpukit_common as gk


def main():
    module = gk.ansible_module({
        "name": {"type": "str", "required": True},
        "kubeconfig": {"type": "str", "default": ""},
    })
    from gpukit.k8s import connect
    from gpukit.provision import dra_switch

    try:
        core = connect.core(module.params["kubeconfig"] or None)
        removed = dra_switch.clear_device_plugin(core, module.params["name"],
                                                 dry_run=module.check_mode)
    except Exception as e:  # the API's answer, as the task's message
        module.fail_json(msg=f"node {module.params['name']}: {e}")
    module.exit_json(changed=any(removed.values()), **removed,
                     diff={"before": removed, "after": {"resources": [], "labels": []}})


if __name__ == "__main__":
    main()
