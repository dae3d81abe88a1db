#!/usr/bin/python
# ruff: noqa: E402  (Ansible's layout: documentation strings before imports)
"""gpukit.gpu.inventory_check: documentation of the action plugin of the same name (it runs on
the controller, in Ansible's process; this module is never sent to a host)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: inventory_check
short_description: Validate every GPU node's declaration before any host is touched
description:
  - Reads the inventory with gpukit's inventory model (C(gpukit.inventory), the code behind
    C(gpukit inventory check)) and checks every host of C(gpu_nodes) - GPUs, driver branch and
    version, kernel modules, container runtime, device plugin configs, MIG layouts against the
    GPU model's MIG tables, labels, taints - and what each declaration implies (the resources
    and labels the node must serve). Also refused - a declaration variable that two groups of a
    host, neither inside the other, set to different values (Ansible would pick one by name).
  - Every problem at once, each naming host, variable and value; the task fails when there is
    any. Run it first, in a play of its own (the collection's C(gpukit.gpu.preflight) playbook),
    so a failure stops the playbook before any connection.
  - Declaration variables given with C(-e) count, as each node resolves them.
  - The agent image (C(gpukit_device_plugin_image)) must be of this collection's version - a
    tag that is a release version (C(1.2.3), C(v1.2.3)) other than the collection's is refused,
    one line naming the variable and both versions; with C(gpukit_device_plugin_image_pinned)
    true (another release on purpose) it is a warning. A tag that is no release version
    (C(dev), C(latest)) or an image by digest alone is a warning - its version is not known.
  - An action plugin; it opens no connection. Needs gpukit's Python package where
    C(ansible-playbook) runs.
version_added: "0.1.0"
author: gpukit
options:
  sources:
    description: Inventory sources to read; default C(ansible_inventory_sources) (the run's C(-i)).
    type: list
    elements: path
notes:
  - Read-only; supports check mode.
"""

EXAMPLES = r"""
- name: Check every GPU node's declaration before touching any host
  gpukit.gpu.inventory_check:
  run_once: true
  register: preflight

- name: Hand each host its validated declaration
  ansible.builtin.set_fact:
    gpukit_declaration: "{{ preflight.declarations[inventory_hostname] }}"
"""

RETURN = r"""
problems:
  description: "One line per problem: C(host <host>: <variable>: <value> <what is wrong>)."
  returned: always
  type: list
  elements: str
nodes:
  description: Per Kubernetes node name, the resources it must advertise (resource -> count).
  returned: always
  type: dict
declarations:
  description:
    - "Per inventory host, its declaration as the model validated it and what it implies
      (C(gpukit.provision.declaration)): C(inputs) (the declaration variables validated),
      C(node_name), C(device_plugin_config), C(mig_config), C(labels), C(taints),
      C(expected_resources), C(expected_labels), C(sharing). Empty when there is a problem."
    - The C(gpukit.gpu.preflight) playbook sets each host's C(gpukit_declaration) from it; the
      roles read that instead of validating the declaration again.
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule


def main():
    module = AnsibleModule(argument_spec={"sources": {"type": "list", "elements": "path"}})
    module.fail_json(msg="gpukit.gpu.inventory_check runs on the controller as an action plugin")


if __name__ == "__main__":
    main()
