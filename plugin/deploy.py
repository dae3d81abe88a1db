"""Kubernetes objects that run the node agent as a DaemonSet.

One place for the manifests: the device_plugin role renders them, the lab and the
tests apply them. The agent runs unprivileged with a read-only root filesystem; its
ServiceAccount may patch nodes, and an admission policy narrows that to the
`nvidia.com/` labels of the node its own pod runs on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from .config import parse_host_port
from .metrics import READY_PATH

APP = "gpukit-node-agent"


@dataclass(frozen=True)
class HostMount:
    """A host path the agent needs (e.g. the lab's simulated GPU state)."""

    name: str
    host_path: str
    mount_path: str
    read_only: bool = True


@dataclass(frozen=True)
class AgentDeployment:
    image: str
    namespace: str = "gpukit-system"
    configs: dict[str, dict[str, Any]] = field(default_factory=dict)
    default_config: str | None = None
    driver_root: str = "/"
    nvml_library: str | None = None
    metrics_address: str = "127.0.0.1:9402"
    node_labels: bool = True
    node_selector: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    host_mounts: tuple[HostMount, ...] = ()
    image_pull_policy: str = "IfNotPresent"

    @property
    def service_account(self) -> str:
        return APP


def _labels() -> dict[str, str]:
    return {"app.kubernetes.io/name": APP, "app.kubernetes.io/part-of": "gpukit"}


def namespace(d: AgentDeployment) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": d.namespace}}


def rbac(d: AgentDeployment) -> list[dict[str, Any]]:
    sa = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": d.service_account, "namespace": d.namespace, "labels": _labels()},
    }
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": APP, "labels": _labels()},
        "rules": [
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]}
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": APP, "labels": _labels()},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": APP},
        "subjects": [
            {"kind": "ServiceAccount", "name": d.service_account, "namespace": d.namespace}
        ],
    }
    return [sa, role, binding]


def own_node_policy(d: AgentDeployment) -> list[dict[str, Any]]:
    """RBAC cannot say "only your own node": a ValidatingAdmissionPolicy can.

    A pod-bound ServiceAccount token carries the node the pod runs on
    (`authentication.kubernetes.io/node-name`); updates must target that node and
    change only `nvidia.com/` labels: its spec (taints included), annotations,
    finalizers, owner references and other labels stay as they were.
    """
    user = f"system:serviceaccount:{d.namespace}:{d.service_account}"
    node_key = "authentication.kubernetes.io/node-name"
    old = "(has(oldObject.metadata.labels) ? oldObject.metadata.labels : {})"
    new = "(has(object.metadata.labels) ? object.metadata.labels : {})"
    name = f"{APP}-own-node"

    def unchanged(field: str, empty: str) -> str:
        # An absent field and an empty one are the same to the API: compare with defaults.
        return (f"(has(object.metadata.{field}) ? object.metadata.{field} : {empty}) == "
                f"(has(oldObject.metadata.{field}) ? oldObject.metadata.{field} : {empty})")

    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name, "labels": _labels()},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["UPDATE"],
                        "resources": ["nodes"],
                    }
                ]
            },
            "matchConditions": [
                {"name": "is-node-agent", "expression": f"request.userInfo.username == '{user}'"}
            ],
            "validations": [
                {
                    "expression": f"'{node_key}' in request.userInfo.extra && "
                    f"request.userInfo.extra['{node_key}'][0] == object.metadata.name",
                    "message": "the gpukit node agent may change only the node its pod runs on",
                },
                {
                    "expression": "object.spec == oldObject.spec",
                    "message": "the gpukit node agent may not change a node's spec",
                },
                {
                    "expression": f"{new}.all(k, k.startsWith('nvidia.com/') || "
                    f"(k in {old} && {old}[k] == {new}[k])) && "
                    f"{old}.all(k, k.startsWith('nvidia.com/') || k in {new})",
                    "message": "the gpukit node agent may change only nvidia.com/ labels",
                },
                *(
                    {"expression": unchanged(field, empty),
                     "message": f"the gpukit node agent may not change a node's {what}"}
                    for field, empty, what in (
                        ("annotations", "{}", "annotations"),
                        ("finalizers", "[]", "finalizers"),
                        ("ownerReferences", "[]", "owner references"),
                    )
                ),
            ],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name, "labels": _labels()},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    }
    return [policy, binding]


def config_text(cfg: Any) -> str:
    """A named config as the ConfigMap carries it."""
    return yaml.safe_dump(cfg, sort_keys=False)


def config_map(d: AgentDeployment) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"{APP}-configs", "namespace": d.namespace, "labels": _labels()},
        "data": {
            name: config_text(cfg) for name, cfg in sorted(d.configs.items())
        },
    }


def readiness_probe(d: AgentDeployment) -> dict[str, Any] | None:
    """The agent's /readyz: Ready once every resource is registered with the kubelet (see
    PluginManager.readiness). It is served on the metrics endpoint; the pod shares the host's
    network, so the kubelet reaches a loopback address too. None when metrics are off."""
    address = d.env.get("GPUKIT_METRICS_ADDRESS", d.metrics_address)  # env: the later wins
    if not address:
        return None
    try:
        host, port = parse_host_port(address)
    except ValueError as exc:
        raise ValueError(f"metrics address: {exc} (use host:port, or '' to disable)") from exc
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return {
        "httpGet": {"host": host, "port": port, "path": READY_PATH, "scheme": "HTTP"},
        "periodSeconds": 5,
        "timeoutSeconds": 3,
        "failureThreshold": 2,
    }


def daemonset(d: AgentDeployment) -> dict[str, Any]:
    env: list[dict[str, Any]] = [
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "GPUKIT_CONFIG_DIR", "value": "/etc/gpukit/configs"},
        {"name": "NVIDIA_DRIVER_ROOT", "value": d.driver_root},
        {"name": "GPUKIT_DEVICE_ROOT", "value": d.driver_root},
        {"name": "GPUKIT_DEVICE_ROOT_IN_PLUGIN", "value": "/driver-root"},
        {"name": "GPUKIT_METRICS_ADDRESS", "value": d.metrics_address},
        {"name": "GPUKIT_NODE_LABELS", "value": "true" if d.node_labels else "false"},
    ]
    if d.default_config:
        env.append({"name": "DEFAULT_CONFIG", "value": d.default_config})
    if d.nvml_library:
        env.append({"name": "GPUKIT_NVML_LIB", "value": d.nvml_library})
    env += [{"name": k, "value": v} for k, v in sorted(d.env.items())]
    mounts: list[dict[str, Any]] = [
        {"name": "device-plugins", "mountPath": "/var/lib/kubelet/device-plugins"},
        {"name": "driver-root", "mountPath": "/driver-root", "readOnly": True,
         "mountPropagation": "HostToContainer"},
        {"name": "configs", "mountPath": "/etc/gpukit/configs", "readOnly": True},
        # The MIG manager pauses the plugin through a file here (see plugin/mig/pause.py).
        {"name": "run-gpukit", "mountPath": "/run/gpukit"},
        # A writable /tmp on the host's /run, not an emptyDir: kubernetes.core's k8s_drain
        # deletes every pod with an emptyDir, DaemonSet pods too (kubernetes.core#622), so
        # each drain of a rolling upgrade would restart the agent and zero the node's GPUs.
        {"name": "run-gpukit", "mountPath": "/tmp", "subPath": "tmp"},
    ]  # fmt: skip
    volumes: list[dict[str, Any]] = [
        {"name": "device-plugins",
         "hostPath": {"path": "/var/lib/kubelet/device-plugins", "type": "Directory"}},
        {"name": "driver-root", "hostPath": {"path": d.driver_root, "type": "Directory"}},
        {"name": "configs", "configMap": {"name": f"{APP}-configs"}},
        {"name": "run-gpukit", "hostPath": {"path": "/run/gpukit", "type": "DirectoryOrCreate"}},
    ]  # fmt: skip
    for m in d.host_mounts:
        mounts.append({"name": m.name, "mountPath": m.mount_path, "readOnly": m.read_only})
        volumes.append(
            {"name": m.name, "hostPath": {"path": m.host_path, "type": "DirectoryOrCreate"}}
        )
    container = {
        "name": "device-plugin",
        "image": d.image,
        "imagePullPolicy": d.image_pull_policy,
        "args": ["--log-level=INFO"],
        "env": env,
        "volumeMounts": mounts,
        "securityContext": {
            "privileged": False,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsUser": 0,  # the kubelet's device-plugin directory is root's
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
    }
    probe = readiness_probe(d)
    if probe is not None:
        container["readinessProbe"] = probe
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": APP, "namespace": d.namespace, "labels": _labels()},
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/name": APP}},
            "updateStrategy": {"type": "RollingUpdate"},
            "template": {
                "metadata": {"labels": _labels()},
                "spec": {
                    "serviceAccountName": d.service_account,
                    "priorityClassName": "system-node-critical",
                    # The agent talks to the API; host networking keeps that working on
                    # clusters (like the lab) whose pod network is not the way out.
                    "hostNetwork": True,
                    "dnsPolicy": "ClusterFirstWithHostNet",
                    "nodeSelector": dict(d.node_selector),
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [container],
                    "volumes": volumes,
                },
            },
        },
    }


def manifests(d: AgentDeployment) -> list[dict[str, Any]]:
    """Every object, in apply order."""
    return [namespace(d), *rbac(d), *own_node_policy(d), config_map(d), daemonset(d)]
