"""The node agent's DaemonSet mounts only what the agent touches, runs without capabilities,
and its RBAC allows what it does (nodes, events)."""

from __future__ import annotations

import posixpath
from typing import Any

import pytest
import yaml

from gpukit import agent_manifests as deploy
from gpukit.agent_manifests import AgentDeployment, HostMount

LIB = "/driver-root/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"


def pod_of(d: AgentDeployment) -> dict[str, Any]:
    spec: dict[str, Any] = deploy.daemonset(d)["spec"]["template"]["spec"]
    return spec


def container_of(d: AgentDeployment) -> dict[str, Any]:
    c: dict[str, Any] = pod_of(d)["containers"][0]
    return c


def env_of(d: AgentDeployment) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container_of(d)["env"]}


def mounts_of(d: AgentDeployment) -> dict[str, tuple[str, bool, str | None]]:
    """mountPath -> (what it is: host path, configMap:<name>; read-only; propagation)."""
    pod = pod_of(d)
    sources = {}
    for v in pod["volumes"]:
        if "hostPath" in v:
            sources[v["name"]] = v["hostPath"]["path"]
        else:
            sources[v["name"]] = f"configMap:{v['configMap']['name']}"
    out = {}
    for m in container_of(d)["volumeMounts"]:
        src = sources[m["name"]]
        if "subPath" in m:
            src = posixpath.join(src, m["subPath"])
        out[m["mountPath"]] = (src, bool(m.get("readOnly")), m.get("mountPropagation"))
    return out


def test_a_host_installed_driver_mounts_dev_and_the_library_dir_not_the_root() -> None:
    d = AgentDeployment(image="x")
    assert mounts_of(d) == {
        "/var/lib/kubelet/device-plugins": ("/var/lib/kubelet/device-plugins", False, None),
        "/driver-root/dev": ("/dev", True, None),
        "/driver-root/usr/lib/x86_64-linux-gnu": ("/usr/lib/x86_64-linux-gnu", True, None),
        "/etc/gpukit/configs": ("configMap:gpukit-node-agent-configs", True, None),
        # Each node's declaration, for served vs declared (issue 30).
        "/etc/gpukit/declarations": ("configMap:gpukit-node-agent-declarations", True, None),
        "/run/gpukit": ("/run/gpukit", False, None),
        "/tmp": ("/run/gpukit/tmp", False, None),
        "/var/run/cdi": ("/var/run/cdi", False, None),
        # The last good config record, kept across reboots (issue 14 point 1).
        "/var/lib/gpukit/agent": ("/var/lib/gpukit/agent", False, None),
        # PCI entries and DMI for GFD's gpu.mode, gpu.machine and vgpu labels.
        "/host/sys": ("/sys", True, None),
        # The kubelet's PodResources socket: which pod holds which device (GPU metrics).
        "/var/lib/kubelet/pod-resources": ("/var/lib/kubelet/pod-resources", True, None),
        # MPS daemons asked of gpukit's MPS control container, their pipes handed out.
        "/run/nvidia/mps": ("/run/nvidia/mps", False, None),
    }
    env = env_of(d)
    assert env["GPUKIT_MPS_DAEMONS"] == "delegate"
    assert env["GPUKIT_LAST_GOOD_CONFIG"] == "/var/lib/gpukit/agent/last-good-config.json"
    assert env["GPUKIT_SYSFS_ROOT"] == "/host/sys"
    # The agent sees the host's /dev/nvidia* at /driver-root/dev and hands out host paths.
    assert (env["GPUKIT_DEVICE_ROOT"], env["GPUKIT_DEVICE_ROOT_IN_PLUGIN"]) == ("/", "/driver-root")
    assert env["GPUKIT_NVML_LIB"] == LIB  # the default: a Debian/Ubuntu driver install
    # Read-only all the way down where the runtime can (/dev has /dev/shm, /dev/pts, ...).
    ro = {m["mountPath"]: m.get("recursiveReadOnly") for m in container_of(d)["volumeMounts"]}
    assert ro["/driver-root/dev"] == ro["/driver-root/usr/lib/x86_64-linux-gnu"] == "IfPossible"


@pytest.mark.parametrize("secret", [
    "/", "/etc/kubernetes/kubelet.conf", "/etc/kubernetes/pki/ca.key",
    "/var/lib/kubelet/kubeconfig", "/var/lib/kubelet/config.yaml", "/var/lib/kubelet/pki",
    "/etc/shadow", "/root/.ssh/id_ed25519",
])  # fmt: skip
def test_no_host_path_reaches_the_kubelets_credentials(secret: str) -> None:
    for d in (AgentDeployment(image="x"), AgentDeployment(image="x", nvml_library=LIB)):
        for v in pod_of(d)["volumes"]:
            if "hostPath" in v:
                path = v["hostPath"]["path"]
                assert path != "/" and not (secret + "/").startswith(path.rstrip("/") + "/"), (
                    f"volume {v['name']} ({path}) exposes {secret}"
                )


def test_a_containerised_driver_root_is_mounted_whole() -> None:
    d = AgentDeployment(image="x", driver_root="/run/nvidia/driver")
    mounts = mounts_of(d)
    assert mounts["/driver-root"] == ("/run/nvidia/driver", True, "HostToContainer")
    assert "/driver-root/dev" not in mounts and not any(p.startswith("/driver-root/") for p in mounts)
    env = env_of(d)
    assert (env["GPUKIT_DEVICE_ROOT"], env["NVIDIA_DRIVER_ROOT"]) == ("/run/nvidia/driver",) * 2
    assert env["GPUKIT_NVML_LIB"] == LIB


def test_the_library_directory_follows_the_named_library() -> None:
    d = AgentDeployment(image="x", nvml_library="/driver-root/usr/lib64/libnvidia-ml.so.1")
    mounts = mounts_of(d)
    assert mounts["/driver-root/usr/lib64"] == ("/usr/lib64", True, None)
    assert "/driver-root/usr/lib/x86_64-linux-gnu" not in mounts
    # The environment wins over the field (as GPUKIT_METRICS_ADDRESS does), mounts included.
    d = AgentDeployment(image="x", env={"GPUKIT_NVML_LIB": "/driver-root/opt/nv/libnvidia-ml.so.1"})
    assert mounts_of(d)["/driver-root/opt/nv"] == ("/opt/nv", True, None)
    # A library that is not under /driver-root (in the image) needs no driver library mount.
    d = AgentDeployment(image="x", nvml_library="/usr/local/lib/libnvidia-ml.so.1")
    assert not [p for p in mounts_of(d) if p.startswith("/driver-root/") and p != "/driver-root/dev"]
    assert env_of(d)["GPUKIT_NVML_LIB"] == "/usr/local/lib/libnvidia-ml.so.1"


@pytest.mark.parametrize("lib", ["/driver-root/libnvidia-ml.so.1",
                                 "/driver-root/usr/../libnvidia-ml.so.1"])
def test_a_library_at_the_top_of_the_root_is_refused_rather_than_mounting_the_root(lib: str) -> None:
    with pytest.raises(ValueError, match="whole root"):
        deploy.daemonset(AgentDeployment(image="x", nvml_library=lib))


def test_the_cdi_spec_dir_the_agent_writes_is_mounted() -> None:
    d = AgentDeployment(image="x", env={"GPUKIT_CDI_SPEC_DIR": "/etc/cdi"})
    mounts = mounts_of(d)
    assert mounts["/etc/cdi"] == ("/etc/cdi", False, None) and "/var/run/cdi" not in mounts
    cdi = next(v for v in pod_of(d)["volumes"] if v["name"] == "cdi-specs")
    assert cdi["hostPath"]["type"] == "DirectoryOrCreate"


def test_host_mounts_come_on_top() -> None:
    d = AgentDeployment(image="x", host_mounts=(
        HostMount("nvml-profile", "/etc/gpukit-lab/nvml", "/etc/gpukit-lab/nvml"),
        HostMount("nvml-state", "/var/lib/gpukit-lab/nvml", "/var/lib/gpukit-lab/nvml", False),
    ))  # fmt: skip
    mounts = mounts_of(d)
    assert mounts["/etc/gpukit-lab/nvml"] == ("/etc/gpukit-lab/nvml", True, None)
    assert mounts["/var/lib/gpukit-lab/nvml"] == ("/var/lib/gpukit-lab/nvml", False, None)
    names = [v["name"] for v in pod_of(d)["volumes"]]
    assert len(names) == len(set(names))
    assert {m["name"] for m in container_of(d)["volumeMounts"]} == set(names)


def test_the_agent_runs_as_root_without_any_capability() -> None:
    sc = container_of(AgentDeployment(image="x"))["securityContext"]
    assert sc == {
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsUser": 0,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def test_the_agent_may_record_events_cluster_wide() -> None:
    objs = {o["kind"]: o for o in deploy.rbac(AgentDeployment(image="x", namespace="gpu"))}
    role = objs["ClusterRole"]
    # A Node's events are recorded in namespace "default": a Role in "gpu" would not do.
    assert {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]} in role[
        "rules"
    ]
    nodes = [r for r in role["rules"] if r["resources"] == ["nodes"]]
    assert nodes == [{"apiGroups": [""], "resources": ["nodes"],
                      "verbs": ["get", "list", "watch", "patch"]}]  # fmt: skip
    # Its served-vs-declared condition: a status patch (own_node_condition_policy narrows it).
    assert {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]} in role[
        "rules"]
    binding = objs["ClusterRoleBinding"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gpukit-node-agent", "namespace": "gpu"}
    ]
    # Nothing else: no secrets, pods, or verbs beyond these.
    assert len(role["rules"]) == 3


def test_each_node_s_declaration_is_its_own_entry_and_a_bad_one_is_refused() -> None:
    d = AgentDeployment(image="x", declarations={
        "gpu-t4": {"version": "v1", "node": "gpu-t4", "devicePluginConfig": "ts",
                   "resources": {"nvidia.com/gpu": 8}}})
    cm = deploy.declarations_map(d)
    assert cm["metadata"]["name"] == "gpukit-node-agent-declarations"
    assert list(cm["data"]) == ["gpu-t4"]
    assert yaml.safe_load(cm["data"]["gpu-t4"])["resources"] == {"nvidia.com/gpu": 8}
    env = {e["name"]: e.get("value") for e in container_of(d)["env"]}
    assert env["GPUKIT_DECLARATION_DIR"] == "/etc/gpukit/declarations"
    bad = AgentDeployment(image="x", declarations={"n": {"version": "v1", "node": "n",
                                                         "resources": {"gpu": 1}}})
    with pytest.raises(ValueError, match=r"declarations\['n'\].resources: 'gpu' is not an "):
        deploy.declarations_map(bad)


def test_the_status_policy_admits_only_the_agent_s_condition_on_its_own_node() -> None:
    policy, binding = deploy.own_node_condition_policy(AgentDeployment(image="x", namespace="g"))
    spec = policy["spec"]
    assert spec["matchConstraints"]["resourceRules"][0]["resources"] == ["nodes/status"]
    assert spec["failurePolicy"] == "Fail"
    assert binding["spec"] == {"policyName": policy["metadata"]["name"],
                               "validationActions": ["Deny"]}
    rules = " ".join(v["expression"] for v in spec["validations"])
    assert "c.type != 'GpuDeclarationMismatch'" in rules
    assert "request.userInfo.extra['authentication.kubernetes.io/node-name'][0]" in rules
    for field in ("capacity", "allocatable", "nodeInfo", "labels", "annotations"):
        assert f".{field} == oldObject." in rules, field


MPS_CONFIG = {"version": "v1", "sharing": {"mps": {"resources": [
    {"name": "nvidia.com/gpu", "replicas": 2}]}}}


def kinds_of(d: AgentDeployment) -> list[tuple[str, str]]:
    return [(o["kind"], o["metadata"]["name"]) for o in deploy.manifests(d)]


def test_the_privileged_mps_container_exists_only_where_mps_is_served() -> None:
    assert ("DaemonSet", deploy.MPS_APP) not in kinds_of(AgentDeployment(image="x", dra=True))
    d = AgentDeployment(image="x", configs={"mps": MPS_CONFIG}, host_mounts=(
        HostMount("state", "/var/lib/state", "/var/lib/state", read_only=False),))
    assert ("DaemonSet", deploy.MPS_APP) in kinds_of(d)
    pod = deploy.mps_daemonset(d)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["securityContext"] == {"privileged": True} and pod["hostPID"] is True
    assert pod["automountServiceAccountToken"] is False and "serviceAccountName" not in pod
    # Only the nodes whose agent serves an MPS config (its GFD label), as NVIDIA's daemon.
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [
        {"key": "nvidia.com/mps.capable", "operator": "In", "values": ["true"]}]}]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["GPUKIT_MPS_CONTROL_BINARY"] == "/driver-root/usr/bin/nvidia-cuda-mps-control"
    assert env["LD_LIBRARY_PATH"] == "/driver-root/usr/lib/x86_64-linux-gnu"
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    mounts = {m["mountPath"]: (volumes[m["name"]], bool(m.get("readOnly")))
              for m in container["volumeMounts"]}
    assert mounts == {"/run/nvidia/mps": ("/run/nvidia/mps", False),
                      "/dev/shm": ("/run/nvidia/mps/shm", False),
                      "/driver-root": ("/", True),
                      "/var/lib/state": ("/var/lib/state", False)}


def test_mps_claims_under_dra_are_opt_in() -> None:
    def dra_env(d: AgentDeployment) -> dict[str, str]:
        (c,) = deploy.dra_daemonset(d)["spec"]["template"]["spec"]["containers"]
        return {e["name"]: e.get("value", "") for e in c["env"]}

    off = AgentDeployment(image="x", dra=True)
    assert dra_env(off)["GPUKIT_MPS_DAEMONS"] == "none"
    on = AgentDeployment(image="x", dra=True, dra_mps=True,
                         dra_node_selector={"gpukit.io/gpu.allocation": "dra"})
    assert dra_env(on)["GPUKIT_MPS_DAEMONS"] == "delegate"
    assert ("DaemonSet", deploy.MPS_APP) in kinds_of(on)
    terms = deploy.mps_node_affinity(on)["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms[1] == {"matchExpressions": [
        {"key": "gpukit.io/gpu.allocation", "operator": "In", "values": ["dra"]}]}


def test_metrics_auth_renders_none_by_default_and_kubernetes_adds_the_reviews() -> None:
    """Issue 30: AgentDeployment's own default is none (the lab's test agents, scraped from
    the node's loopback); the roles render gpukit_metrics_auth (default kubernetes)."""
    reviews = [
        {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"],
         "verbs": ["create"]},
        {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"],
         "verbs": ["create"]},
    ]

    def rules(d: AgentDeployment) -> list[dict[str, Any]]:
        role = {o["kind"]: o for o in deploy.rbac(d)}["ClusterRole"]
        got: list[dict[str, Any]] = role["rules"]
        return got

    plain = AgentDeployment(image="x")
    assert plain.metrics_auth == "none"
    assert env_of(plain)["GPUKIT_METRICS_AUTH"] == "none"
    assert not any(r in rules(plain) for r in reviews)
    auth = AgentDeployment(image="x", metrics_auth="kubernetes")
    assert env_of(auth)["GPUKIT_METRICS_AUTH"] == "kubernetes"
    assert rules(auth) == rules(plain) + reviews
    # The deployment's env wins, as for GPUKIT_METRICS_ADDRESS; the RBAC follows it.
    by_env = AgentDeployment(image="x", env={"GPUKIT_METRICS_AUTH": "kubernetes"})
    assert [e["value"] for e in container_of(by_env)["env"]
            if e["name"] == "GPUKIT_METRICS_AUTH"] == ["kubernetes", "kubernetes"]
    assert rules(by_env) == rules(auth)
    with pytest.raises(ValueError, match="metrics auth: 'tls' is not one of kubernetes, none"):
        deploy.daemonset(AgentDeployment(image="x", metrics_auth="tls"))
    # A DRA node's GPU metrics come from the DRA plugin: the same mode, the same reviews.
    for mode in ("none", "kubernetes"):
        d = AgentDeployment(image="x", dra=True, metrics_auth=mode)
        dra = deploy.dra_daemonset(d)
        assert {"name": "GPUKIT_METRICS_AUTH", "value": mode} in (
            dra["spec"]["template"]["spec"]["containers"][0]["env"])
        dra_rules = {o["kind"]: o for o in deploy.dra_rbac(d)}["ClusterRole"]["rules"]
        assert all((r in dra_rules) == (mode == "kubernetes") for r in reviews)
