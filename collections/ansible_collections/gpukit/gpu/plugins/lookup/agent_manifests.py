# ruff: noqa: E402  (Ansible's layout: documentation strings before imports)
"""gpukit.gpu.agent_manifests: the device plugin DaemonSet's objects (gpukit.agent_manifests),
from the role's variables, checked by gpukit.provision.agent (`gpukit manifests` renders the
same from an inventory, through gpukit.manifests)."""

from __future__ import annotations

DOCUMENTATION = r"""
name: agent_manifests
author: gpukit
version_added: "0.1.0"
short_description: Kubernetes objects that run gpukit's device plugin as a DaemonSet
description:
  - Namespace, ServiceAccount, ClusterRole and binding (node labels), the own-node admission
    policy, the ConfigMap of named device plugin configs (each validated) and the DaemonSet.
  - Returns the list of objects, in apply order.
options:
  image:
    description: The node agent's image.
    type: str
    required: true
  configs:
    description: Named NVIDIA v1 device plugin configs (C(gpukit_device_plugin_configs)).
    type: dict
    required: true
  namespace:
    description: Namespace.
    type: str
    default: gpukit-system
  default_config:
    description: Config for nodes without the C(nvidia.com/device-plugin.config) label.
    type: str
  driver_root:
    description: Host directory of the driver (C(/) for a host install).
    type: str
    default: /
  nvml_library:
    description: NVML library the agent loads (path inside the container).
    type: str
  node_selector:
    description: Nodes that run the agent.
    type: dict
    default: {}
  env:
    description: Extra environment.
    type: dict
    default: {}
  host_mounts:
    description: Extra host paths (C(name), C(host_path), C(mount_path), C(read_only)).
    type: list
    elements: dict
    default: []
  metrics_address:
    description: host:port of the agent's metrics endpoint, '' for none.
    type: str
    default: "0.0.0.0:9402"
  image_pull_policy:
    description: Image pull policy.
    type: str
    default: IfNotPresent
"""

EXAMPLES = r"""
- name: Apply the device plugin
  kubernetes.core.k8s:
    definition: "{{ lookup('gpukit.gpu.agent_manifests', image=img, configs=cfgs) }}"
"""

RETURN = r"""
_raw:
  description: The objects, in apply order.
  type: list
  elements: dict
"""

import json

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        try:
            from gpukit import manifests
            from gpukit.provision import agent
        except ImportError as e:
            raise AnsibleLookupError(
                f"gpukit is not importable on the controller ({e}): run ansible-playbook from"
                " gpukit's environment (.venv)"
            ) from e
        # The same arguments `gpukit manifests` renders with (gpukit.manifests).
        opts = {k: self.get_option(k) for k in ("configs", *manifests.RENDER_ARGS)}
        # Plain Python values (Ansible's templated strings are tagged subclasses).
        opts = json.loads(json.dumps(opts))
        try:
            return agent.render(**opts)
        except agent.AgentSpecError as e:
            raise AnsibleLookupError(str(e)) from e
