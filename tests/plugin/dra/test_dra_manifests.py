"""The DRA plugin's objects: NVIDIA's DeviceClasses, narrow RBAC, its own-slices policy, a
DaemonSet hardened like the agent's with only the kubelet's DRA paths and the CDI dir."""

from __future__ import annotations

from typing import Any

from gpukit import agent_manifests as deploy


def objects(**kw: Any) -> dict[tuple[str, str], dict[str, Any]]:
    d = deploy.AgentDeployment(image="img:1", dra=True, dra_node_selector={"dra": "yes"}, **kw)
    return {(o["kind"], o["metadata"]["name"]): o for o in deploy.manifests(d)}


def test_dra_objects_come_only_when_asked() -> None:
    plain = deploy.manifests(deploy.AgentDeployment(image="img:1"))
    assert not [o for o in plain if o["kind"] in ("DeviceClass", "ResourceSlice")]
    assert ("DaemonSet", "gpukit-dra-plugin") in objects()


def test_nvidias_device_classes_with_the_extended_resource() -> None:
    got = objects()
    gpu = got[("DeviceClass", "gpu.nvidia.com")]["spec"]
    mig = got[("DeviceClass", "mig.nvidia.com")]["spec"]
    assert gpu["selectors"][0]["cel"]["expression"] == (
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'")
    assert mig["selectors"][0]["cel"]["expression"].endswith(".type == 'mig'")
    assert gpu["extendedResourceName"] == "nvidia.com/gpu"
    assert "extendedResourceName" not in mig
    no_ext = objects(dra_extended_resource=False)[("DeviceClass", "gpu.nvidia.com")]["spec"]
    assert "extendedResourceName" not in no_ext


def test_rbac_reads_claims_and_its_node_and_writes_slices_and_events_only() -> None:
    rules = objects()[("ClusterRole", "gpukit-dra-plugin")]["rules"]
    assert rules == [
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]},
        # status.devices of the claims it prepares: its driver's entries, on its node only
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/status"],
         "verbs": ["patch", "update"]},
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/driver"],
         "resourceNames": ["gpu.nvidia.com"],
         "verbs": ["associated-node:patch", "associated-node:update"]},
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},  # gpukit.io/dra.shares
        # Its served-vs-declared condition (the agent's condition policy narrows it).
        {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"],
         "verbs": ["get", "list", "watch", "create", "update", "delete"]},
        # NVIDIA's claims taken over or refused, on the node (nvidia_claims.py)
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]


def test_the_policy_binds_slices_to_the_tokens_node() -> None:
    spec = objects()[("ValidatingAdmissionPolicy", "gpukit-dra-plugin-own-slices")]["spec"]
    assert spec["matchConditions"][0]["expression"] == (
        "request.userInfo.username == 'system:serviceaccount:gpukit-system:gpukit-dra-plugin'")
    text = " ".join(v["expression"] for v in spec["validations"])
    node = "request.userInfo.extra['authentication.kubernetes.io/node-name'][0]"
    assert f"oldObject.spec.nodeName == {node}" in text
    assert f"object.spec.nodeName == {node}" in text
    assert "object.spec.driver == 'gpu.nvidia.com'" in text
    assert f"object.spec.pool.name == {node}" in text
    assert spec["matchConstraints"]["resourceRules"][0]["operations"] == [
        "CREATE", "UPDATE", "DELETE"]


def test_the_daemonset_is_hardened_and_mounts_only_the_dra_paths() -> None:
    ds = objects()[("DaemonSet", "gpukit-dra-plugin")]["spec"]["template"]["spec"]
    assert ds["nodeSelector"] == {"dra": "yes"}
    assert ds["serviceAccountName"] == "gpukit-dra-plugin"
    c = ds["containers"][0]
    assert c["command"] == ["python3", "-m", "gpukit.plugin.dra"]
    sc = c["securityContext"]
    assert (sc["privileged"], sc["allowPrivilegeEscalation"], sc["readOnlyRootFilesystem"],
            sc["capabilities"]) == (False, False, True, {"drop": ["ALL"]})
    paths = {v["hostPath"]["path"] for v in ds["volumes"] if "hostPath" in v}
    assert paths == {"/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/plugins/gpu.nvidia.com",
                     "/var/run/cdi", "/run/gpukit", "/dev", "/usr/lib/x86_64-linux-gnu",
                     "/usr/bin", "/var/lib/kubelet/pod-resources", "/sys"}
    # The host's sysfs, read-only, where the plugin reads the GPUs' PCIe root (pcieRoot).
    assert next(m for m in c["volumeMounts"] if m["name"] == "host-sys") == {
        "name": "host-sys", "mountPath": "/host/sys", "readOnly": True,
        "recursiveReadOnly": "IfPossible"}
    assert {"name": "GPUKIT_SYSFS_ROOT", "value": "/host/sys"} in c["env"]
    pod_resources = next(m for m in c["volumeMounts"] if m["name"] == "pod-resources")
    assert pod_resources["readOnly"] is True
    # The driver's programs and nvidia-cdi-hook, for claims' CDI specs (as NVIDIA's): read-only
    # under the driver root; the node agent does not mount them.
    assert next(m for m in c["volumeMounts"] if m["name"] == "driver-bin") == {
        "name": "driver-bin", "mountPath": "/driver-root/usr/bin", "readOnly": True,
        "recursiveReadOnly": "IfPossible"}
    agent = objects()[("DaemonSet", "gpukit-node-agent")]["spec"]["template"]["spec"]
    assert "/usr/bin" not in {v["hostPath"]["path"] for v in agent["volumes"] if "hostPath" in v}
    whole = objects(driver_root="/run/nvidia/driver")[("DaemonSet", "gpukit-dra-plugin")]
    assert "driver-bin" not in {v["name"] for v in whole["spec"]["template"]["spec"]["volumes"]}


def test_the_plugin_reads_the_declarations_and_may_set_only_its_nodes_condition() -> None:
    """Served vs declared on a DRA node: the declarations ConfigMap mounted read-only (optional:
    the plugin starts without it) and named to the plugin; the agent's condition policy admits
    the plugin's ServiceAccount too, and only where the DRA objects are deployed."""
    ds = objects()[("DaemonSet", "gpukit-dra-plugin")]["spec"]["template"]["spec"]
    c = ds["containers"][0]
    assert {"name": "declarations", "configMap": {
        "name": "gpukit-node-agent-declarations", "optional": True}} in ds["volumes"]
    assert {"name": "declarations", "mountPath": "/etc/gpukit/declarations",
            "readOnly": True} in c["volumeMounts"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["GPUKIT_DECLARATION_DIR"] == "/etc/gpukit/declarations"
    policy = ("ValidatingAdmissionPolicy", "gpukit-node-agent-own-node-condition")
    who = objects()[policy]["spec"]["matchConditions"][0]["expression"]
    assert who == ("request.userInfo.username in ["
                   "'system:serviceaccount:gpukit-system:gpukit-node-agent', "
                   "'system:serviceaccount:gpukit-system:gpukit-dra-plugin']")
    plain = {(o["kind"], o["metadata"]["name"]): o
             for o in deploy.manifests(deploy.AgentDeployment(image="img:1"))}
    assert "gpukit-dra-plugin" not in plain[policy]["spec"]["matchConditions"][0]["expression"]


def test_the_daemonset_serves_the_agents_metrics_and_readiness() -> None:
    """A DRA node runs no node agent: the DRA plugin serves its GPU metrics and /readyz on
    the same address, port name and probe."""
    c = objects()[("DaemonSet", "gpukit-dra-plugin")]["spec"]["template"]["spec"][
        "containers"][0]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["GPUKIT_METRICS_ADDRESS"] == "0.0.0.0:9402"
    assert c["ports"] == [{"name": "metrics", "containerPort": 9402, "hostPort": 9402,
                           "protocol": "TCP"}]
    assert c["readinessProbe"]["httpGet"] == {"host": "127.0.0.1", "port": 9402,
                                              "path": "/readyz", "scheme": "HTTP"}


def test_metrics_off_leaves_no_port_or_probe() -> None:
    c = objects(metrics_address="")[("DaemonSet", "gpukit-dra-plugin")]["spec"]["template"][
        "spec"]["containers"][0]
    assert {e["name"]: e.get("value") for e in c["env"]}["GPUKIT_METRICS_ADDRESS"] == ""
    assert "ports" not in c and "readinessProbe" not in c
