"""The agent's DaemonSet as the GPU metrics need it: the kubelet's pod-resources directory
read-only at its own path, a container port named `metrics` (what the PodMonitor scrapes),
and an address a Prometheus off the node reaches."""

from __future__ import annotations

from typing import Any

from gpukit import agent_manifests as am
from gpukit import telemetry_manifests
from gpukit.plugin import podresources
from gpukit.provision import agent


def _container(d: am.AgentDeployment) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    spec = am.daemonset(d)["spec"]["template"]["spec"]
    return spec["containers"][0], spec["volumes"]


def test_pod_resources_mounted_read_only_where_the_agent_looks() -> None:
    c, volumes = _container(am.AgentDeployment(image="x"))
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == "pod-resources"]
    (volume,) = [v for v in volumes if v["name"] == "pod-resources"]
    assert mount == {"name": "pod-resources", "mountPath": "/var/lib/kubelet/pod-resources",
                     "readOnly": True}
    assert volume["hostPath"]["path"] == "/var/lib/kubelet/pod-resources"
    # The socket the agent dials (beside device-plugins) lies inside the mount.
    assert podresources.socket_path(am.DEFAULT_KUBELET_DIR).startswith(mount["mountPath"] + "/")


def test_the_metrics_port_is_named_and_reachable_off_the_node() -> None:
    c, _ = _container(am.AgentDeployment(image="x"))
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["GPUKIT_METRICS_ADDRESS"] == "0.0.0.0:9402"
    assert c["ports"] == [{"name": "metrics", "containerPort": 9402, "hostPort": 9402,
                           "protocol": "TCP"}]
    assert c["readinessProbe"]["httpGet"]["host"] == "127.0.0.1"
    endpoint = telemetry_manifests.pod_monitor()["spec"]["podMetricsEndpoints"][0]
    assert endpoint["port"] == c["ports"][0]["name"]


def test_the_role_s_address_reaches_the_daemonset() -> None:
    objs = agent.render(image="x", configs={"default": {"version": "v1"}},
                        metrics_address="10.0.0.1:9500")
    (ds,) = [o for o in objs if o["kind"] == "DaemonSet"]
    c = ds["spec"]["template"]["spec"]["containers"][0]
    assert c["ports"][0]["containerPort"] == 9500
    assert {"name": "GPUKIT_METRICS_ADDRESS", "value": "10.0.0.1:9500"} in c["env"]
    off = agent.render(image="x", configs={"default": {"version": "v1"}}, metrics_address="")
    (ds,) = [o for o in off if o["kind"] == "DaemonSet"]
    assert "ports" not in ds["spec"]["template"]["spec"]["containers"][0]
