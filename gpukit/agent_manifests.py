"""Kubernetes objects that run the node agent as a DaemonSet.

One place for the manifests: the device_plugin role renders them, the lab and the
tests apply them. The agent runs unprivileged with a read-only root filesystem; its
ServiceAccount may patch nodes, and an admission policy narrows that to the
`nvidia.com/` labels of the node its own pod runs on; it may patch nodes/status, narrowed by a
second policy to its own node's `GpuDeclarationMismatch` condition (served vs declared); with
`metrics_auth: kubernetes` it may create TokenReviews and SubjectAccessReviews, to check who
scrapes its metrics (gpukit/plugin/metrics_auth.py), the DRA plugin's too.

The pod mounts only what the agent reads or writes (see `agent_mounts`): with the driver
installed on the host (driver root `/`) that is the host's /dev and the NVML library's
directory, read-only, never the host's root, so the kubelet's kubeconfig, keys and
/etc stay out of its reach; a containerised driver root (e.g. /run/nvidia/driver) holds
only the driver and is mounted whole.

The DRA side (`dra_manifests`, in `manifests` when `AgentDeployment.dra` is set) runs the
DRA kubelet plugin (`python -m gpukit.plugin.dra`) as its own DaemonSet on the nodes of
`dra_node_selector`, hardened like the agent, with its own ServiceAccount: it may read
ResourceClaims and write ResourceSlices, and an admission policy narrows the latter to slices
of its own node, driver gpu.nvidia.com, pool named after the node. NVIDIA's DeviceClasses
(gpu.nvidia.com, mig.nvidia.com) come with it, the first with `extendedResourceName:
nvidia.com/gpu` (DRAExtendedResource, GA and locked on in Kubernetes 1.37) so pods asking for
nvidia.com/gpu are served by DRA on nodes without the device plugin (`dra_extended_resource`:
the device_plugin role leaves it out on clusters before 1.36, whose apiservers drop the field,
gpukit.provision.agent.extended_resource_supported). The role applies the DRA objects always,
its DaemonSet on the nodes labelled gpukit.io/gpu.allocation=dra (gpukit_gpu_allocation).
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from gpukit.contracts import dra as dra_names
from gpukit.contracts import label_names
from gpukit.contracts import metrics_auth as scrape_auth
from gpukit.contracts import node_declaration as nd
from gpukit.contracts.plugin_config import (
    DEFAULT_CDI_DIR,
    DEFAULT_KUBELET_DIR,
    DEFAULT_MPS_ROOT,
    parse_host_port,
)
from gpukit.plugin.metrics import READY_PATH

APP = "gpukit-node-agent"
DRA_APP = "gpukit-dra-plugin"
MPS_APP = "gpukit-mps-control"

# Where the container sees the driver root (GPUKIT_DEVICE_ROOT_IN_PLUGIN).
DRIVER_ROOT_IN_CONTAINER = "/driver-root"
# Where the driver's programs and nvidia-cdi-hook are on a host that has the driver installed
# (NVIDIA's packages, Debian/Ubuntu and RPM alike): the DRA plugin sees it, read-only.
BINARY_DIR = "/usr/bin"
# The NVML library when the deployment names none: where Debian/Ubuntu driver packages and
# NVIDIA's driver containers put it. Other layouts (e.g. /usr/lib64 on RPM distributions)
# set AgentDeployment.nvml_library (gpukit_device_plugin_nvml_library).
DEFAULT_NVML_LIBRARY = f"{DRIVER_ROOT_IN_CONTAINER}/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
STATE_DIR = "/var/lib/gpukit/agent"  # on the host and in the container
LAST_GOOD_CONFIG = f"{STATE_DIR}/last-good-config.json"
SYSFS_IN_CONTAINER = "/host/sys"
# Each node's declaration (gpukit.contracts.node_declaration), one ConfigMap entry per node.
DECLARATIONS = f"{APP}-declarations"
DECLARATION_DIR = "/etc/gpukit/declarations"
# The kubelet's PodResources socket's directory (beside device-plugins), host and container.
POD_RESOURCES_DIR = posixpath.join(posixpath.dirname(DEFAULT_KUBELET_DIR.rstrip("/")),
                                   "pod-resources")


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
    # Node name -> what it must serve (NodeDeclaration.as_dict()): the agents' served-vs-
    # declared watchdog (gpukit/plugin/served.py); a node without an entry is not compared.
    declarations: dict[str, dict[str, Any]] = field(default_factory=dict)
    default_config: str | None = None
    driver_root: str = "/"
    nvml_library: str | None = None  # path in the container; None: DEFAULT_NVML_LIBRARY
    # Every interface of the node (hostNetwork): a Prometheus off the node scrapes it; the
    # readiness probe still asks 127.0.0.1 (gpukit_metrics_listen_address narrows it).
    metrics_address: str = "0.0.0.0:9402"
    # Who may scrape it (GPUKIT_METRICS_AUTH, gpukit/plugin/metrics_auth.py): "kubernetes" each
    # scrape's bearer token reviewed by the API (get nodes/metrics on the node, as the
    # kubelet's /metrics; the ClusterRole then may create token and access reviews), "none"
    # anyone (the roles render gpukit_metrics_auth, default "kubernetes"; the lab's own
    # agents for tests keep "none", scraped from the node's loopback).
    metrics_auth: str = scrape_auth.AUTH_NONE
    node_labels: bool = True
    node_selector: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    host_mounts: tuple[HostMount, ...] = ()
    image_pull_policy: str = "IfNotPresent"
    # The DRA kubelet plugin: its DaemonSet, RBAC, policy and DeviceClasses.
    dra: bool = False
    dra_node_selector: dict[str, str] = field(default_factory=dict)
    dra_extended_resource: bool = True  # DeviceClass gpu.nvidia.com maps nvidia.com/gpu
    # Claims sharing with MPS served on the DRA nodes (gpukit_dra_mps): the MPS control
    # DaemonSet runs there too; without it the DRA plugin refuses such claims.
    dra_mps: bool = False

    @property
    def service_account(self) -> str:
        return APP



# Fields server-side apply treats as one value (atomic) are spelt out as the API server defaults
# them, so a GitOps tool applying the printed objects after site.yml (or site.yml after it)
# declares the same value as the live object and meets no conflict.
NODE_NAME_FIELD: dict[str, str] = {"apiVersion": "v1", "fieldPath": "spec.nodeName"}


def _match_constraints(*rules: dict[str, Any]) -> dict[str, Any]:
    return {"matchPolicy": "Equivalent", "namespaceSelector": {}, "objectSelector": {},
            "resourceRules": [{**r, "scope": "*"} for r in rules]}

def _labels(app: str = APP) -> dict[str, str]:
    return {"app.kubernetes.io/name": app, "app.kubernetes.io/part-of": "gpukit"}


def namespace(d: AgentDeployment) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": d.namespace}}


def metrics_auth(d: AgentDeployment) -> str:
    """The agent's GPUKIT_METRICS_AUTH (env: the later wins), checked."""
    mode = d.env.get(scrape_auth.ENV, d.metrics_auth)
    if mode not in scrape_auth.MODES:
        raise ValueError(f"metrics auth: {mode!r} is not one of {', '.join(scrape_auth.MODES)}")
    return mode


def scrape_review_rules(d: AgentDeployment) -> list[dict[str, Any]]:
    """With metrics auth `kubernetes`: each scrape's token and its right to get nodes/metrics
    (kube-rbac-proxy's, and the kubelet's with its delegated authentication:
    system:auth-delegator's two rules); none otherwise."""
    if metrics_auth(d) != scrape_auth.AUTH_KUBERNETES:
        return []
    return [
        {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"],
         "verbs": ["create"]},
        {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"],
         "verbs": ["create"]},
    ]


def rbac(d: AgentDeployment) -> list[dict[str, Any]]:
    sa = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": d.service_account, "namespace": d.namespace, "labels": _labels()},
    }
    rules: list[dict[str, list[str]]] = [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]},
        # Its served-vs-declared condition (own_node_condition_policy narrows it).
        {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
        # Events about its node (e.g. an invalid selected config); a Node's events live in
        # the "default" namespace, so a Role in the agent's namespace would not do.
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
    ]
    rules += scrape_review_rules(d)
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": APP, "labels": _labels()},
        "rules": rules,
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
    old = "(has(oldObject.metadata.labels) ? oldObject.metadata.labels : {})"
    new = "(has(object.metadata.labels) ? object.metadata.labels : {})"

    def unchanged(field: str, empty: str) -> str:
        # An absent field and an empty one are the same to the API: compare with defaults.
        return (f"(has(object.metadata.{field}) ? object.metadata.{field} : {empty}) == "
                f"(has(oldObject.metadata.{field}) ? oldObject.metadata.{field} : {empty})")

    return _node_agent_policy(d, f"{APP}-own-node", "nodes", [
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
    ])


def _node_agent_policy(d: AgentDeployment, name: str, resource: str,
                       validations: list[dict[str, str]],
                       accounts: Sequence[str] = ()) -> list[dict[str, Any]]:
    """A ValidatingAdmissionPolicy and its binding on the node agent's UPDATEs of `resource`
    (and those of the ServiceAccounts `accounts` of its namespace): only the node its pod runs
    on (the pod-bound token's `authentication.kubernetes.io/node-name`), then `validations`."""
    users = [f"system:serviceaccount:{d.namespace}:{a}"
             for a in (d.service_account, *accounts)]
    who = (f"request.userInfo.username == '{users[0]}'" if len(users) == 1 else
           "request.userInfo.username in [" + ", ".join(f"'{u}'" for u in users) + "]")
    node_key = "authentication.kubernetes.io/node-name"
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name, "labels": _labels()},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": _match_constraints({
                "apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"],
                "resources": [resource]}),
            "matchConditions": [
                {"name": "is-node-agent", "expression": who}
            ],
            "validations": [
                {
                    "expression": f"'{node_key}' in request.userInfo.extra && "
                    f"request.userInfo.extra['{node_key}'][0] == object.metadata.name",
                    "message": "the gpukit node agent may change only the node its pod runs on",
                },
                *validations,
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


# Node status fields the agent may not change (every field of NodeStatus in Kubernetes 1.35 to
# 1.37 but conditions): CEL cannot compare "all but one field" of a typed object, so they are
# named; a field a later release adds is guarded by RBAC alone (status patch only).
_STATUS_FIELDS = ("capacity", "allocatable", "phase", "addresses", "daemonEndpoints",
                  "nodeInfo", "images", "volumesInUse", "volumesAttached", "config",
                  "runtimeHandlers", "features")


def own_node_condition_policy(d: AgentDeployment) -> list[dict[str, Any]]:
    """The agent's status patches (nodes/status, which own_node_policy does not match), and
    the DRA plugin's where it is deployed (it reports served vs declared on a DRA node): only
    its own node, and only the condition `GpuDeclarationMismatch` (served vs declared):
    every other condition, every other status field and the node's metadata stay as they
    were."""
    ours = nd.CONDITION_TYPE

    def others(obj: str) -> str:
        return (f"(has({obj}.status.conditions) ? {obj}.status.conditions : [])"
                f".filter(c, c.type != '{ours}')")

    def same(path: str) -> str:
        return (f"has(object.{path}) == has(oldObject.{path}) && "
                f"(!has(object.{path}) || object.{path} == oldObject.{path})")

    return _node_agent_policy(d, f"{APP}-own-node-condition", "nodes/status", [
        {"expression": f"{others('object')} == {others('oldObject')}",
         "message": f"the gpukit node agent may change only the {ours} condition"},
        {"expression": " && ".join(same(f"status.{f}") for f in _STATUS_FIELDS)
                       + " && " + " && ".join(same(f"metadata.{f}") for f in (
                           "labels", "annotations", "finalizers", "ownerReferences")),
         "message": "the gpukit node agent may change nothing of a node's status "
                    f"but its {ours} condition"},
    ], accounts=(DRA_APP,) if d.dra else ())


def declarations_map(d: AgentDeployment) -> dict[str, Any]:
    """Each node's declaration, key = node name (the agent reads its own entry)."""
    return declarations_config_map(d.declarations, d.namespace)


def declarations_config_map(declarations: Mapping[str, Any], namespace: str) -> dict[str, Any]:
    """The declarations ConfigMap of node name -> declaration entry (as a dict)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": DECLARATIONS, "namespace": namespace, "labels": _labels()},
        "data": {node: nd.render(nd.from_dict(decl, f"declarations[{node!r}]"))
                 for node, decl in sorted(declarations.items())},
    }


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


def metrics_port(d: AgentDeployment) -> dict[str, Any]:
    """The container port a PodMonitor scrapes by name (`metrics`); on the host's network
    the host port is the same port."""
    _, port = parse_host_port(d.env.get("GPUKIT_METRICS_ADDRESS", d.metrics_address))
    return {"name": "metrics", "containerPort": port, "hostPort": port, "protocol": "TCP"}


def _is_host_root(path: str) -> bool:
    return posixpath.normpath(path or "/") == "/"


def nvml_library_path(d: AgentDeployment) -> str:
    """The NVML library the agent loads (GPUKIT_NVML_LIB), as the container sees it."""
    return d.env.get("GPUKIT_NVML_LIB") or d.nvml_library or DEFAULT_NVML_LIBRARY  # env wins


def _library_dir(d: AgentDeployment) -> str | None:
    """The host directory (under the driver root) holding the NVML library, or None when the
    library is not under /driver-root (in the image, or put there by a container runtime)."""
    lib = posixpath.normpath(nvml_library_path(d))
    if not lib.startswith(DRIVER_ROOT_IN_CONTAINER + "/"):
        return None
    directory = posixpath.dirname(lib[len(DRIVER_ROOT_IN_CONTAINER):])
    if directory == "/":
        raise ValueError(
            f"nvml library {nvml_library_path(d)!r}: with the host's root as driver root the"
            " agent mounts the library's directory, and that would be the whole root: name"
            f" the library in its own directory, e.g. {DEFAULT_NVML_LIBRARY}"
        )
    return directory


def _host_path(name: str, path: str, kind: str) -> dict[str, Any]:
    return {"name": name, "hostPath": {"path": path, "type": kind}}


def agent_mounts(d: AgentDeployment) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The container's volumeMounts and the pod's volumes: only what the agent touches.

    - the kubelet's device-plugins directory (its sockets, the kubelet's socket), read-write;
    - the driver: with driver root `/` (the driver installed on the host) the host's /dev (the
      agent checks which /dev/nvidia* control nodes exist; the device cgroup still refuses to
      open them) and the NVML library's directory, read-only at the same paths under
      /driver-root; any other driver root (a driver container's, e.g. /run/nvidia/driver)
      holds only the driver and is mounted whole, following the mounts the driver container
      makes after the agent started;
    - its named configs (the ConfigMap) and the nodes' declarations (another ConfigMap, one
      entry per node: served vs declared), its state on the host's /run/gpukit (the MIG
      manager's pause file; /tmp), and the CDI spec directory it writes;
    - its record of the last good config on the host's /var/lib/gpukit/agent (kept across
      reboots: a restart into an invalid config serves it, see gpukit/plugin/last_good.py);
    - the host's /sys, read-only at /host/sys: GFD's gpu.mode, gpu.machine and vgpu labels
      read each GPU's PCI entry and the DMI product name (a container's own /sys shows
      neither the node's PCI tree nor, in the lab, the node's stand-in entries);
    - the kubelet's pod-resources directory, read-only at the same path: the GPU metrics
      name the pod, namespace and container using each device (PodResources API);
    - the deployment's own host_mounts (the lab's simulated GPU state).
    The agent reads /proc/driver/nvidia from its own /proc (the kernel's, not a mount).
    """
    ro = {"readOnly": True, "recursiveReadOnly": "IfPossible"}
    cdi_dir = d.env.get("GPUKIT_CDI_SPEC_DIR") or DEFAULT_CDI_DIR
    mounts: list[dict[str, Any]] = [{"name": "device-plugins", "mountPath": DEFAULT_KUBELET_DIR}]
    volumes = [_host_path("device-plugins", DEFAULT_KUBELET_DIR, "Directory")]
    driver_mounts, driver_volumes = _driver_mounts(d)
    mounts += driver_mounts
    volumes += driver_volumes
    mounts += [
        {"name": "configs", "mountPath": "/etc/gpukit/configs", "readOnly": True},
        {"name": "declarations", "mountPath": DECLARATION_DIR, "readOnly": True},
        # The MIG manager pauses the plugin through a file here (see gpukit/plugin/mig/pause.py).
        {"name": "run-gpukit", "mountPath": "/run/gpukit"},
        # A writable /tmp on the host's /run, not an emptyDir: kubernetes.core's k8s_drain
        # deletes every pod with an emptyDir, DaemonSet pods too (kubernetes.core#622), so
        # each drain of a rolling upgrade would restart the agent and zero the node's GPUs.
        {"name": "run-gpukit", "mountPath": "/tmp", "subPath": "tmp"},
        # The CDI spec the agent writes for the cdi-annotations / cdi-cri strategies.
        {"name": "cdi-specs", "mountPath": cdi_dir},
        {"name": "agent-state", "mountPath": STATE_DIR},
        {"name": "host-sys", "mountPath": SYSFS_IN_CONTAINER, **ro},
        {"name": "pod-resources", "mountPath": POD_RESOURCES_DIR, "readOnly": True},
        # MPS: the agent asks gpukit's MPS control container for its daemons here and hands
        # their pipe directories to containers (gpukit.plugin.mps_requests).
        _mps_root_mount(),
    ]  # fmt: skip
    volumes += [
        {"name": "configs", "configMap": {"name": f"{APP}-configs"}},
        {"name": "declarations", "configMap": {"name": DECLARATIONS}},
        _host_path("run-gpukit", "/run/gpukit", "DirectoryOrCreate"),
        _host_path("cdi-specs", cdi_dir, "DirectoryOrCreate"),
        _host_path("agent-state", STATE_DIR, "DirectoryOrCreate"),
        _host_path("host-sys", "/sys", "Directory"),
        _host_path("pod-resources", POD_RESOURCES_DIR, "DirectoryOrCreate"),
        _mps_root_volume(),
    ]
    host_mounts, host_volumes = _deployment_host_mounts(d)
    return mounts + host_mounts, volumes + host_volumes


def _mps_root_mount() -> dict[str, Any]:
    return {"name": "mps-root", "mountPath": DEFAULT_MPS_ROOT}


def _mps_root_volume() -> dict[str, Any]:
    return _host_path("mps-root", DEFAULT_MPS_ROOT, "DirectoryOrCreate")


def _deployment_host_mounts(d: AgentDeployment
                            ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    # readOnly only when true: the API leaves a false one out, and a printed false would then
    # differ from the live object for a GitOps apply.
    mounts = [{"name": m.name, "mountPath": m.mount_path,
               **({"readOnly": True} if m.read_only else {})}
              for m in d.host_mounts]  # fmt: skip
    volumes = [_host_path(m.name, m.host_path, "DirectoryOrCreate") for m in d.host_mounts]
    return mounts, volumes


def _driver_mounts(d: AgentDeployment, binaries: bool = False
                   ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The driver as the agent and the DRA plugin see it (see agent_mounts). `binaries`: with
    the host's root as driver root, its BINARY_DIR too (the DRA plugin: a claim's CDI spec
    binds the driver's programs and runs nvidia-cdi-hook, as NVIDIA's; gpukit.plugin.cdi finds
    them there)."""
    ro = {"readOnly": True, "recursiveReadOnly": "IfPossible"}
    mounts: list[dict[str, Any]] = []
    volumes: list[dict[str, Any]] = []
    if _is_host_root(d.driver_root):
        mounts.append({"name": "driver-dev", "mountPath": f"{DRIVER_ROOT_IN_CONTAINER}/dev", **ro})
        volumes.append(_host_path("driver-dev", "/dev", "Directory"))
        lib_dir = _library_dir(d)
        if lib_dir is not None:
            mounts.append({"name": "driver-lib",
                           "mountPath": f"{DRIVER_ROOT_IN_CONTAINER}{lib_dir}", **ro})
            volumes.append(_host_path("driver-lib", lib_dir, "Directory"))
        if binaries:
            mounts.append({"name": "driver-bin",
                           "mountPath": f"{DRIVER_ROOT_IN_CONTAINER}{BINARY_DIR}", **ro})
            volumes.append(_host_path("driver-bin", BINARY_DIR, "Directory"))
    else:
        # HostToContainer: the driver container may mount its root after the agent started
        # (recursiveReadOnly would need mountPropagation None).
        mounts.append({"name": "driver-root", "mountPath": DRIVER_ROOT_IN_CONTAINER,
                       "readOnly": True, "mountPropagation": "HostToContainer"})
        volumes.append(_host_path("driver-root", d.driver_root, "Directory"))
    return mounts, volumes


def _security_context() -> dict[str, Any]:
    """The node agent's and the DRA plugin's container: uid 0, but no capabilities. They must
    create sockets in the kubelet's directories (root's, 0750 or 0755) and connect to the
    kubelet's sockets there (root's, 0755: connect needs write permission on the socket).
    Another uid would need CAP_DAC_OVERRIDE, which a non-root process loses at exec (no ambient
    capabilities; no_new_privs ignores file capabilities), and a user namespace (hostUsers:
    false) rules out hostNetwork. Root's own files are what this uid could read, hence the
    narrow mounts (see gpukit/plugin/README.md, Deployment)."""
    return {
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsUser": 0,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def daemonset(d: AgentDeployment) -> dict[str, Any]:
    env: list[dict[str, Any]] = [
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": dict(NODE_NAME_FIELD)}},
        {"name": "GPUKIT_CONFIG_DIR", "value": "/etc/gpukit/configs"},
        {"name": "NVIDIA_DRIVER_ROOT", "value": d.driver_root},
        {"name": "GPUKIT_DEVICE_ROOT", "value": d.driver_root},
        {"name": "GPUKIT_DEVICE_ROOT_IN_PLUGIN", "value": DRIVER_ROOT_IN_CONTAINER},
        {"name": "GPUKIT_METRICS_ADDRESS", "value": d.metrics_address},
        {"name": scrape_auth.ENV, "value": metrics_auth(d)},
        {"name": "GPUKIT_NODE_LABELS", "value": "true" if d.node_labels else "false"},
        {"name": "GPUKIT_LAST_GOOD_CONFIG", "value": LAST_GOOD_CONFIG},
        {"name": "GPUKIT_DECLARATION_DIR", "value": DECLARATION_DIR},
        {"name": "GPUKIT_SYSFS_ROOT", "value": SYSFS_IN_CONTAINER},
        {"name": "GPUKIT_NVML_LIB", "value": nvml_library_path(d)},
        # This hardened container cannot open the GPUs an MPS daemon needs.
        {"name": "GPUKIT_MPS_DAEMONS", "value": "delegate"},
    ]
    if d.default_config:
        env.append({"name": "DEFAULT_CONFIG", "value": d.default_config})
    env += [{"name": k, "value": v} for k, v in sorted(d.env.items())]
    mounts, volumes = agent_mounts(d)
    container = {
        "name": "device-plugin",
        "image": d.image,
        "imagePullPolicy": d.image_pull_policy,
        "args": ["--log-level=INFO"],
        "env": env,
        "volumeMounts": mounts,
    }
    return _node_daemonset(d, APP, d.service_account, d.node_selector, container, volumes)


def _node_daemonset(d: AgentDeployment, app: str, service_account: str,
                    node_selector: Mapping[str, str], container: dict[str, Any],
                    volumes: list[dict[str, Any]]) -> dict[str, Any]:
    """A DaemonSet of one of gpukit's node agents (the device plugin agent, the DRA plugin):
    root for the kubelet's root-owned directories, no capabilities, nothing writable but its
    mounts; ready when its metrics endpoint answers /readyz."""
    container = {**container, "securityContext": _security_context(),
                 "resources": {"requests": {"cpu": "10m", "memory": "64Mi"},
                               "limits": {"memory": "256Mi"}}}
    probe = readiness_probe(d)
    if probe is not None:
        container["readinessProbe"] = probe
        container["ports"] = [metrics_port(d)]
    return _daemonset_object(d, app, {
        "serviceAccountName": service_account,
        "priorityClassName": "system-node-critical",
        # The agents talk to the API; host networking keeps that working on clusters (like
        # the lab) whose pod network is not the way out.
        "hostNetwork": True,
        "dnsPolicy": "ClusterFirstWithHostNet",
        "nodeSelector": dict(node_selector),
        "tolerations": [{"operator": "Exists"}],
        "containers": [container],
        "volumes": volumes,
    })


def _daemonset_object(d: AgentDeployment, app: str, pod_spec: dict[str, Any]
                      ) -> dict[str, Any]:
    """One of gpukit's DaemonSets: `pod_spec` on every node it selects, rolled by update."""
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": app, "namespace": d.namespace, "labels": _labels(app)},
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/name": app}},
            "updateStrategy": {"type": "RollingUpdate"},
            "template": {"metadata": {"labels": _labels(app)}, "spec": pod_spec},
        },
    }


# -- the DRA kubelet plugin -------------------------------------------------------------------

RESOURCE_API = "resource.k8s.io/v1"


def device_classes(d: AgentDeployment) -> list[dict[str, Any]]:
    """NVIDIA's DeviceClasses, with its CEL selectors: claims written for NVIDIA's driver name
    them unchanged."""
    driver = dra_names.DRIVER
    out = []
    for name, kind in ((dra_names.GPU_CLASS, dra_names.TYPE_GPU),
                       (dra_names.MIG_CLASS, dra_names.TYPE_MIG)):
        spec: dict[str, Any] = {"selectors": [{"cel": {"expression": (
            f"device.driver == '{driver}' && "
            f"device.attributes['{driver}'].type == '{kind}'")}}]}
        if kind == dra_names.TYPE_GPU and d.dra_extended_resource:
            spec["extendedResourceName"] = label_names.GPU_RESOURCE
        out.append({"apiVersion": RESOURCE_API, "kind": "DeviceClass",
                    "metadata": {"name": name, "labels": _labels(DRA_APP)}, "spec": spec})
    return out


def dra_rbac(d: AgentDeployment) -> list[dict[str, Any]]:
    """Read the claims it prepares and its node (the label gpukit.io/dra.shares), write those
    claims' device status (its driver's entries), write its node's ResourceSlices (the policy
    below narrows that to its own node), record Events on its node (claims of NVIDIA's DRA
    driver taken over or not, served vs declared), patch its node's status (its
    GpuDeclarationMismatch condition: own_node_condition_policy narrows that as for the
    agent)."""
    sa = {"apiVersion": "v1", "kind": "ServiceAccount",
          "metadata": {"name": DRA_APP, "namespace": d.namespace, "labels": _labels(DRA_APP)}}
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": DRA_APP, "labels": _labels(DRA_APP)},
        "rules": [
            {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"],
             "verbs": ["get"]},
            # A prepared claim's status.devices (gpukit/plugin/dra/claim_status.py). The API
            # server's granular status authorization (1.36+) lets that touch only entries of
            # driver gpu.nvidia.com, on claims allocated on the token's own node
            # (associated-node:), and no allocation or reservation (resourceclaims/binding).
            {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/status"],
             "verbs": ["patch", "update"]},
            {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/driver"],
             "resourceNames": [dra_names.DRIVER],
             "verbs": ["associated-node:patch", "associated-node:update"]},
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
            {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
            {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"],
             "verbs": ["get", "list", "watch", "create", "update", "delete"]},
            # A Node's events live in namespace default (gpukit.plugin.node_api.node_event).
            {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
            # Who scrapes the GPU metrics it serves on a DRA node.
            *scrape_review_rules(d),
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": DRA_APP, "labels": _labels(DRA_APP)},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": DRA_APP},
        "subjects": [{"kind": "ServiceAccount", "name": DRA_APP, "namespace": d.namespace}],
    }
    return [sa, role, binding]


def own_slices_policy(d: AgentDeployment) -> list[dict[str, Any]]:
    """RBAC cannot say "only your own node's ResourceSlices": as own_node_policy, the
    pod-bound token's node name (`authentication.kubernetes.io/node-name`) must be the
    slice's nodeName before (update, delete) and after (create, update), its driver
    gpu.nvidia.com and its pool named after the node."""
    user = f"system:serviceaccount:{d.namespace}:{DRA_APP}"
    key = "authentication.kubernetes.io/node-name"
    node = f"request.userInfo.extra['{key}'][0]"
    name = f"{DRA_APP}-own-slices"

    def on(obj: str) -> str:
        return f"has({obj}.spec.nodeName) && {obj}.spec.nodeName == {node}"

    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name, "labels": _labels(DRA_APP)},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": _match_constraints({
                "apiGroups": ["resource.k8s.io"], "apiVersions": ["*"],
                "operations": ["CREATE", "UPDATE", "DELETE"], "resources": ["resourceslices"]}),
            "matchConditions": [
                {"name": "is-dra-plugin", "expression": f"request.userInfo.username == '{user}'"}
            ],
            "validations": [
                {"expression": f"'{key}' in request.userInfo.extra",
                 "message": "the gpukit DRA plugin must use its pod's token (it names the node)",
                 "reason": "Forbidden"},
                {"expression": f"request.operation == 'CREATE' || ({on('oldObject')})",
                 "message": "the gpukit DRA plugin may change only its own node's "
                            "ResourceSlices",
                 "reason": "Forbidden"},
                {"expression": f"request.operation == 'DELETE' || ({on('object')} && "
                               f"object.spec.driver == '{dra_names.DRIVER}' && "
                               f"object.spec.pool.name == {node})",
                 "message": "the gpukit DRA plugin may write only ResourceSlices of its own "
                            f"node, driver {dra_names.DRIVER}, pool named after the node",
                 "reason": "Forbidden"},
            ],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name, "labels": _labels(DRA_APP)},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    }
    return [policy, binding]


def dra_daemonset(d: AgentDeployment) -> dict[str, Any]:
    """The DRA plugin on the nodes of `dra_node_selector`: the kubelet's plugins_registry/
    and plugins/gpu.nvidia.com/ (sockets, checkpoints), the CDI spec directory containerd
    reads, the host's /sys read-only (the GPUs' PCIe root), the driver as the agent mounts it
    and, with the host's root as driver root, the host's /usr/bin read-only (the driver's
    programs and nvidia-cdi-hook, which a claim's CDI spec binds and runs, as NVIDIA's);
    nothing else of the host. And the nodes' declarations ConfigMap, as the agent's (served vs
    declared)."""
    env: list[dict[str, Any]] = [
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": dict(NODE_NAME_FIELD)}},
        {"name": "GPUKIT_DEVICE_ROOT", "value": d.driver_root},
        {"name": "GPUKIT_DEVICE_ROOT_IN_PLUGIN", "value": DRIVER_ROOT_IN_CONTAINER},
        {"name": "GPUKIT_NVML_LIB", "value": nvml_library_path(d)},
        {"name": "GPUKIT_CDI_SPEC_DIR", "value": dra_names.CDI_DIR},
        # The node agent's GPU metrics and /readyz: a DRA node runs no agent (env: the later
        # wins, as readiness_probe reads it).
        {"name": "GPUKIT_METRICS_ADDRESS",
         "value": d.env.get("GPUKIT_METRICS_ADDRESS", d.metrics_address)},
        {"name": scrape_auth.ENV, "value": metrics_auth(d)},
        {"name": "GPUKIT_MPS_DAEMONS", "value": "delegate" if d.dra_mps else "none"},
        # Served vs declared: its node's entry of the declarations ConfigMap.
        {"name": "GPUKIT_DECLARATION_DIR", "value": DECLARATION_DIR},
        # resource.kubernetes.io/pcieRoot: the GPUs' links in the host's sysfs.
        {"name": "GPUKIT_SYSFS_ROOT", "value": SYSFS_IN_CONTAINER},
    ]
    env += [{"name": k, "value": v} for k, v in sorted(d.env.items())
            if k not in {e["name"] for e in env}]
    mounts: list[dict[str, Any]] = [
        {"name": "plugins-registry", "mountPath": dra_names.REGISTRY_DIR},
        {"name": "plugin-dir", "mountPath": dra_names.PLUGIN_DIR},
        {"name": "cdi-specs", "mountPath": dra_names.CDI_DIR},
        {"name": "run-gpukit", "mountPath": "/tmp", "subPath": "dra-tmp"},
        # The GPU metrics' pod attribution (PodResources), as the agent's.
        {"name": "pod-resources", "mountPath": POD_RESOURCES_DIR, "readOnly": True},
        {"name": "declarations", "mountPath": DECLARATION_DIR, "readOnly": True},
        # The host's /sys as the agent reads it (the lab's nodes show their own PCI tree there,
        # not in a container's fresh sysfs).
        {"name": "host-sys", "mountPath": SYSFS_IN_CONTAINER, "readOnly": True,
         "recursiveReadOnly": "IfPossible"},
    ]
    volumes = [
        _host_path("plugins-registry", dra_names.REGISTRY_DIR, "DirectoryOrCreate"),
        _host_path("host-sys", "/sys", "Directory"),
        _host_path("plugin-dir", dra_names.PLUGIN_DIR, "DirectoryOrCreate"),
        _host_path("cdi-specs", dra_names.CDI_DIR, "DirectoryOrCreate"),
        _host_path("run-gpukit", "/run/gpukit", "DirectoryOrCreate"),
        _host_path("pod-resources", POD_RESOURCES_DIR, "DirectoryOrCreate"),
        # Optional: the plugin serves claims without it (no entry: nothing compared), and
        # dra_manifests, applied alone, does not carry it.
        {"name": "declarations", "configMap": {"name": DECLARATIONS, "optional": True}},
    ]
    if d.dra_mps:
        mounts.append(_mps_root_mount())
        volumes.append(_mps_root_volume())
    for part in (_driver_mounts(d, binaries=True), _deployment_host_mounts(d)):
        mounts += part[0]
        volumes += part[1]
    container = {
        "name": "dra-plugin",
        "image": d.image,
        "imagePullPolicy": d.image_pull_policy,
        "command": ["python3", "-m", "gpukit.plugin.dra"],
        "args": ["--log-level=INFO"],
        "env": env,
        "volumeMounts": mounts,
    }
    return _node_daemonset(d, DRA_APP, DRA_APP, d.dra_node_selector, container, volumes)


def dra_manifests(d: AgentDeployment) -> list[dict[str, Any]]:
    """The DRA plugin's objects, in apply order (the namespace is the agent's)."""
    return [*dra_rbac(d), *own_slices_policy(d), *device_classes(d), dra_daemonset(d)]


# -- the MPS control daemons ------------------------------------------------------------------

MPS_CONTROL_BINARY = f"{DRIVER_ROOT_IN_CONTAINER}/usr/bin/nvidia-cuda-mps-control"


def mps_node_affinity(d: AgentDeployment) -> dict[str, Any]:
    """Where MPS daemons may be asked for: nodes whose agent serves a config sharing with MPS
    (it labels them nvidia.com/mps.capable=true, as GFD does; NVIDIA's mps-control-daemon
    selects the same label) and, with dra_mps, the DRA nodes."""
    terms = [{"matchExpressions": [
        {"key": label_names.MPS_CAPABLE, "operator": "In", "values": ["true"]}]}]
    if d.dra and d.dra_mps:
        # An empty term matches no node; the DRA DaemonSet without a selector runs on all.
        terms.append({"matchExpressions": [
            {"key": k, "operator": "In", "values": [v]}
            for k, v in sorted(d.dra_node_selector.items())]
            or [{"key": "kubernetes.io/hostname", "operator": "Exists"}]})
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": terms}}}


def mps_daemonset(d: AgentDeployment) -> dict[str, Any]:
    """gpukit's MPS control container (gpukit.plugin.mps_control): runs the MPS daemons the
    agent and the DRA plugin ask for. It is the one privileged container of gpukit, and only
    on nodes that share GPUs through MPS: an MPS daemon holds a context on its GPUs and sets
    their compute mode, which needs the devices and root in the host's sense, as NVIDIA's
    mps-control-daemon has. Host PIDs: the daemon sees its clients' processes as NVML lists
    them. The driver (its nvidia-cuda-mps-control and libraries) comes from the driver root,
    read-only; the MPS root's shm is its /dev/shm, as each client's. No Kubernetes API."""
    lib = nvml_library_path(d)
    env: list[dict[str, Any]] = [
        {"name": "GPUKIT_MPS_ROOT", "value": DEFAULT_MPS_ROOT},
        {"name": "GPUKIT_MPS_CONTROL_BINARY", "value": MPS_CONTROL_BINARY},
        {"name": "GPUKIT_NVML_LIB", "value": lib},
        {"name": "LD_LIBRARY_PATH", "value": posixpath.dirname(lib)},
    ]
    env += [{"name": k, "value": v} for k, v in sorted(d.env.items())
            if k not in {e["name"] for e in env}]
    mounts: list[dict[str, Any]] = [
        _mps_root_mount(),
        {"name": "mps-shm", "mountPath": "/dev/shm"},
        {"name": "driver-root", "mountPath": DRIVER_ROOT_IN_CONTAINER, "readOnly": True,
         "mountPropagation": "HostToContainer"},
    ]
    volumes = [
        _mps_root_volume(),
        _host_path("mps-shm", posixpath.join(DEFAULT_MPS_ROOT, "shm"), "DirectoryOrCreate"),
        _host_path("driver-root", d.driver_root, "Directory"),
    ]
    host_mounts, host_volumes = _deployment_host_mounts(d)
    container = {
        "name": "mps-control",
        "image": d.image,
        "imagePullPolicy": d.image_pull_policy,
        "command": ["python3", "-m", "gpukit.plugin.mps_control"],
        "args": ["--log-level=INFO"],
        "env": env,
        "volumeMounts": mounts + host_mounts,
        "securityContext": {"privileged": True},
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"},
                      "limits": {"memory": "256Mi"}},
    }
    return _daemonset_object(d, MPS_APP, {
        "automountServiceAccountToken": False,
        "priorityClassName": "system-node-critical",
        "hostPID": True,
        "affinity": mps_node_affinity(d),
        "tolerations": [{"operator": "Exists"}],
        "containers": [container],
        "volumes": volumes + host_volumes,
    })


def serves_mps(d: AgentDeployment) -> bool:
    """Whether any node may ask for MPS daemons: a named config shares with MPS, or the DRA
    nodes serve MPS claims. Only then is the privileged MPS control DaemonSet deployed."""
    return (d.dra and d.dra_mps) or any(
        isinstance(c.get("sharing"), Mapping) and "mps" in c["sharing"]
        for c in d.configs.values())


def manifests(d: AgentDeployment) -> list[dict[str, Any]]:
    """Every object, in apply order."""
    out = [namespace(d), *rbac(d), *own_node_policy(d), *own_node_condition_policy(d),
           config_map(d), declarations_map(d), daemonset(d)]
    if serves_mps(d):
        out.append(mps_daemonset(d))
    return out + dra_manifests(d) if d.dra else out
