# ruff: noqa: E402  (Ansible's layout: documentation strings before imports)
"""gpukit.gpu.agent_manifests: the node agent's objects, device plugin and DRA
(gpukit.agent_manifests), from the role's variables, checked by gpukit.provision.agent
(`gpukit manifests` renders the same from an inventory, through gpukit.manifests)."""

from __future__ import annotations

DOCUMENTATION = r"""
name: agent_manifests
author: gpukit
version_added: "0.1.0"
short_description: Kubernetes objects that run gpukit's device plugin and DRA plugin as DaemonSets
description:
  - Namespace, ServiceAccount, ClusterRole and binding (node labels, its node's
    C(GpuDeclarationMismatch) condition), the own-node admission policies, the ConfigMap of named
    device plugin configs (each validated), the nodes' declarations and the DaemonSet.
  - With O(dra), the DRA plugin's too - ServiceAccount, ClusterRole and binding (claims read,
    ResourceSlices written), the own-slices admission policy, NVIDIA's DeviceClasses
    C(gpu.nvidia.com) and C(mig.nvidia.com), and its DaemonSet on O(dra_node_selector).
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
  declarations:
    description:
      - What each node must serve, by node name (C(gpukit.gpu.merge_agent_declarations)); rendered
        as the ConfigMap C(gpukit-node-agent-declarations) its agent compares with what it serves.
    type: dict
    default: {}
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
  metrics_auth:
    description: >-
      Who may read the metrics, kubernetes (a bearer token the API server accepts and allows
      get nodes/metrics on the node) or none (anyone).
    type: str
    default: kubernetes
  image_pull_policy:
    description: Image pull policy.
    type: str
    default: IfNotPresent
  dra:
    description: The DRA plugin's objects too.
    type: bool
    default: false
  dra_node_selector:
    description: Nodes that run the DRA plugin (none given - C(gpukit.io/gpu.allocation=dra)).
    type: dict
  dra_extended_resource:
    description:
      - Whether DeviceClass C(gpu.nvidia.com) maps C(nvidia.com/gpu) (C(extendedResourceName)).
        Not given - where O(kubernetes_version) supports it (1.36 on; unknown - yes).
    type: bool
  kubernetes_version:
    description: The cluster's version (its C(gitVersion), e.g. C(v1.35.4)).
    type: str
  dra_mps:
    description: Serve claims sharing with MPS on the DRA nodes (gpukit's MPS control
      DaemonSet runs there too); without it the DRA plugin refuses such claims.
    type: bool
    default: false
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
        opts = {k: self.get_option(k)
                for k in ("configs", "declarations", *manifests.RENDER_ARGS)}
        # Plain Python values (Ansible's templated strings are tagged subclasses).
        opts = json.loads(json.dumps(opts))
        try:
            return agent.render(**opts)
        except agent.AgentSpecError as e:
            raise AnsibleLookupError(str(e)) from e
