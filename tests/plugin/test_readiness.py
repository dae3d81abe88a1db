"""Readiness (issue #14): the agent's /readyz on its metrics endpoint is 503 until every
resource it serves is registered with the kubelet and the kubelet opened its ListAndWatch, 200
then; the DaemonSet's readinessProbe asks it. A stand-in kubelet registers the plugin."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from plugin_testlib import T4, FakeBackend, FakeKubelet, dial, make_gpu, make_inventory

from gpukit import agent_manifests as deploy
from gpukit.plugin.api import deviceplugin_pb2 as pb
from gpukit.plugin.config_source import ConfigSource, Override
from gpukit.plugin.manager import ManagerOptions, PluginManager
from gpukit.plugin.resources import ResourceSet


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def wait_status(url: str, code: int, timeout: float = 10) -> str:
    deadline = time.monotonic() + timeout
    while True:
        got, body = get(url)
        if got == code:
            return body
        assert time.monotonic() < deadline, f"{url}: {got} {body!r}, expected {code}"
        time.sleep(0.05)


@pytest.fixture
def agent(short_tmp: Path) -> Iterator[tuple[PluginManager, str]]:
    """A manager serving two T4s and its metrics endpoint; no kubelet yet."""
    manager = PluginManager(
        ConfigSource(overrides=[Override("gpukit.kubeletDir", str(short_tmp), "test"),
                                Override("gpukit.rescanIntervalSeconds", 0, "test")]),
        FakeBackend(make_inventory([make_gpu(0, T4), make_gpu(1, T4)])),
        options=ManagerOptions(tick=0.05, health=False, register_retry_seconds=0.2,
                               stream_grace_seconds=0.5))  # a dropped stream: register again
    manager.start()
    port = free_port()
    manager.metrics.serve(f"127.0.0.1:{port}")
    try:
        yield manager, f"http://127.0.0.1:{port}"
    finally:
        manager.metrics.close()
        manager.stop()


def test_readyz_is_503_until_registered_and_listed_then_200(
        agent: tuple[PluginManager, str], short_tmp: Path) -> None:
    _, base = agent
    code, body = get(f"{base}/readyz")
    assert code == 503
    assert "nvidia.com/gpu: not registered with the kubelet" in body
    assert "no kubelet socket" in body
    kubelet = FakeKubelet(short_tmp)
    kubelet.start()
    try:
        assert kubelet.next_request().resource_name == "nvidia.com/gpu"
        # Registered, but the kubelet has not taken the device list yet.
        body = wait_status(f"{base}/readyz", 503)
        assert "no ListAndWatch open" in body or "not registered" in body
        channel, stub = dial(str(short_tmp / "gpukit-gpu.sock"))
        stream = stub.ListAndWatch(pb.Empty(), timeout=30)
        assert len(next(stream).devices) == 2
        assert "1 resource(s) registered: nvidia.com/gpu" in wait_status(f"{base}/readyz", 200)
        code, metrics = get(f"{base}/metrics")  # the same endpoint still serves metrics
        assert code == 200 and "gpukit_plugin_registrations_total" in metrics
        # The kubelet restarts (a new kubelet.sock): not ready until registered again and
        # the new kubelet took the list.
        stream.cancel()
        kubelet.stop()
        wait_status(f"{base}/readyz", 503)
        kubelet = FakeKubelet(short_tmp)
        kubelet.start()
        kubelet.next_request()
        assert get(f"{base}/readyz")[0] == 503
        stream = stub.ListAndWatch(pb.Empty(), timeout=30)
        next(stream)
        wait_status(f"{base}/readyz", 200)
        stream.cancel()
        channel.close()
    finally:
        kubelet.stop()


def test_paths_other_than_metrics_and_readyz_are_404(agent: tuple[PluginManager, str]) -> None:
    _, base = agent
    for path in ("/", "/metrics/", "/debug/pprof", "/readyz/x"):
        code, body = get(f"{base}{path}")
        assert (code, body) == (404, "not found; this endpoint serves /metrics and /readyz\n"), \
            path
    assert get(f"{base}/metrics?name[]=gpukit_plugin_registrations_total")[0] == 200


def test_a_node_without_gpus_is_ready(agent: tuple[PluginManager, str]) -> None:
    """Nothing to serve (no GPUs, or NVML down with failOnInitError false) is all there is:
    a DaemonSet rollout must not stall on such a node."""
    manager, base = agent
    with manager._lock:
        for name in list(manager.servers):
            manager._retire(name)
        manager.resources = ResourceSet(resources={})
    assert "0 resource(s) registered" in wait_status(f"{base}/readyz", 200)


def test_readyz_answers_even_if_the_check_fails(agent: tuple[PluginManager, str]) -> None:
    manager, base = agent

    def broken() -> tuple[bool, str]:
        raise RuntimeError("boom")

    manager.metrics.readiness = broken
    code, body = get(f"{base}/readyz")
    assert code == 503 and "boom" in body


def probe_of(d: deploy.AgentDeployment) -> dict[str, object] | None:
    container = deploy.daemonset(d)["spec"]["template"]["spec"]["containers"][0]
    probe: dict[str, object] | None = container.get("readinessProbe")
    return probe


def test_the_daemonset_probes_readyz_on_the_metrics_port() -> None:
    probe = probe_of(deploy.AgentDeployment(image="x"))
    assert probe is not None
    # hostNetwork: the kubelet reaches the agent's loopback listener.
    assert probe["httpGet"] == {"host": "127.0.0.1", "port": 9402, "path": "/readyz",
                                "scheme": "HTTP"}
    assert deploy.daemonset(deploy.AgentDeployment(image="x"))["spec"]["template"]["spec"][
        "hostNetwork"] is True
    wildcard = probe_of(deploy.AgentDeployment(image="x", metrics_address="0.0.0.0:9500"))
    assert wildcard is not None and wildcard["httpGet"] == {
        "host": "127.0.0.1", "port": 9500, "path": "/readyz", "scheme": "HTTP"}
    # An address set through env wins in the pod (the later entry), and in the probe.
    env = probe_of(deploy.AgentDeployment(image="x",
                                          env={"GPUKIT_METRICS_ADDRESS": "127.0.0.2:9600"}))
    assert env is not None and env["httpGet"] == {
        "host": "127.0.0.2", "port": 9600, "path": "/readyz", "scheme": "HTTP"}
    # No HTTP endpoint, no probe (rather than a pod that is never Ready).
    assert probe_of(deploy.AgentDeployment(image="x", metrics_address="")) is None
    with pytest.raises(ValueError, match="metrics address: 'localhost' is not host:port"):
        probe_of(deploy.AgentDeployment(image="x", metrics_address="localhost"))


def test_the_own_node_policy_refuses_more_than_labels() -> None:
    """The rendered CEL names each part of a node the agent must leave alone (the lab test
    test_the_agent_may_label_only_its_own_node is the judge of what the API server does)."""
    policy = deploy.own_node_policy(deploy.AgentDeployment(image="x"))[0]
    rules = {v["message"]: v["expression"] for v in policy["spec"]["validations"]}
    for what, field in (("annotations", "annotations"), ("finalizers", "finalizers"),
                        ("owner references", "ownerReferences")):
        expr = rules[f"the gpukit node agent may not change a node's {what}"]
        assert f"object.metadata.{field}" in expr and f"oldObject.metadata.{field}" in expr
    assert rules["the gpukit node agent may not change a node's spec"] == (
        "object.spec == oldObject.spec")  # taints live in the spec
