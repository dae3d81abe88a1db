"""`lab up` keeps the nodes on the node-agent image built from the current checkout.

The image's content is changed without touching the checkout: GPUKIT_LAB_AGENT_MARKER
puts a marker file into it, which changes its content key and its image ID.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from gpukit.lab import agent, cluster, images
from gpukit.lab.config import NodeSpec, load_spec

pytestmark = pytest.mark.lab

CONFIGS = {"default": {"version": "v1", "flags": {"migStrategy": "none"}}}


def node_image_id(node: NodeSpec) -> str:
    """The ID of the image the node's containerd has for the agent's tag, read afresh."""
    ls = cluster.node_exec(node, ["ctr", "-n", "k8s.io", "images", "ls"])
    assert ls.returncode == 0, ls.stderr
    manifest = next(
        line.split()[2] for line in ls.stdout.splitlines() if line.split()[:1] == [images.AGENT]
    )
    got = cluster.node_exec(node, ["ctr", "-n", "k8s.io", "content", "get", manifest])
    assert got.returncode == 0, got.stderr
    return str(json.loads(got.stdout)["config"]["digest"])


def agent_pods() -> dict[str, tuple[str, str]]:
    """node -> (pod name, image ID) of the running node-agent pods."""
    spec = load_spec()
    listing = agent.kubectl(spec, "-n", "gpukit-system", "get", "pods", "-o", "json")
    pods = json.loads(listing)["items"]
    out = {}
    for p in pods:
        statuses = p["status"].get("containerStatuses") or []
        if p["metadata"].get("deletionTimestamp") is None and statuses:
            out[p["spec"]["nodeName"]] = (p["metadata"]["name"], statuses[0]["imageID"])
    return out


@pytest.fixture
def running_agent(lab_cluster: object) -> Iterator[None]:
    spec = load_spec()
    d = agent.lab_deployment(CONFIGS)
    try:
        agent.apply(spec, d)
        agent.wait_rolled_out(spec, d)
        yield
    finally:
        agent.remove(spec, d)


def test_lab_up_brings_a_changed_agent_image_to_every_node_once(
    running_agent: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = load_spec()
    archive = cluster.state_dir() / "shared" / "images" / "node-agent.tar"
    before = {n.name: node_image_id(n) for n in spec.nodes}
    pods_before = agent_pods()
    assert {pod[1] for pod in pods_before.values()} == set(before.values())

    token = f"test-{time.time_ns()}"
    monkeypatch.setenv(images.AGENT_MARKER_ENV, token)
    try:
        messages: list[str] = []
        t0 = time.monotonic()
        cluster.up(spec, say=messages.append)
        took = time.monotonic() - t0
        built = images.agent_record(archive.parent)["id"]
        after = {n.name: node_image_id(n) for n in spec.nodes}
        assert after == {n.name: built for n in spec.nodes}, messages
        assert not set(after.values()) & set(before.values()), "the image ID did not change"
        assert any(m.startswith("built ") for m in messages), messages
        # Pods on the old image were restarted and run the new one, marker included.
        pods = agent_pods()
        assert set(pods) == set(pods_before)
        for node, (name, image_id) in pods.items():
            assert name != pods_before[node][0] and image_id == built
            marker = agent.kubectl(spec, "-n", "gpukit-system", "exec", name, "--",
                                   "cat", "/opt/gpukit/marker")  # fmt: skip
            assert marker.strip() == token

        # A second `lab up` finds everything current: no rebuild, no import, no restart.
        stamp = archive.stat().st_mtime_ns
        messages = []
        t0 = time.monotonic()
        cluster.up(spec, say=messages.append)
        assert messages == ["lab is up (nothing to do)"]
        assert time.monotonic() - t0 < max(5.0, took / 2)
        assert archive.stat().st_mtime_ns == stamp
        assert {n.name: node_image_id(n) for n in spec.nodes} == after
        assert agent_pods() == pods
    finally:
        monkeypatch.delenv(images.AGENT_MARKER_ENV)
        cluster.up(spec, say=lambda _m: None)  # back to the checkout's own image
    assert {n.name: node_image_id(n) for n in spec.nodes} == {
        n.name: images.agent_record(archive.parent)["id"] for n in spec.nodes
    }
