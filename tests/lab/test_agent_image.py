"""The lab's node agent runs from the image the Containerfile builds, and `lab up` keeps the
nodes on the image built from the current checkout.

The image's content is changed without touching the checkout: GPUKIT_LAB_AGENT_MARKER is
part of the content key and of the REVISION build argument the image records.
"""

from __future__ import annotations

import json
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpukit.k8s import connect
from gpukit.lab import agent, cluster, images, nodes
from gpukit.lab.config import NodeSpec, load_spec, state_dir
from gpukit.lab.controlplane import paths

pytestmark = pytest.mark.lab

CONFIGS = {"default": {"version": "v1", "flags": {"migStrategy": "none"}}}
SIZE_TARGET = 150 * 10**6  # bytes, uncompressed (issue 15)


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
    listing = cluster.kubectl(spec, "-n", "gpukit-system", "get", "pods", "-o", "json")
    pods = json.loads(listing)["items"]
    out = {}
    for p in pods:
        statuses = p["status"].get("containerStatuses") or []
        if p["metadata"].get("deletionTimestamp") is None and statuses:
            out[p["spec"]["nodeName"]] = (p["metadata"]["name"], statuses[0]["imageID"])
    return out


def read_in_pod(pod: str, path: str) -> str:
    """A file's text, read by the pod's python3 (the image has no shell and no cat)."""
    return cluster.kubectl(load_spec(), "-n", "gpukit-system", "exec", pod, "--", "python3", "-c",
                         f"print(open({path!r}).read(), end='')")  # fmt: skip


def archive_contents(archive: Path) -> tuple[dict[str, object], list[int], set[str]]:
    """A docker-archive's image config, its layers' sizes and every path in its layers."""
    paths_seen: set[str] = set()
    sizes = []
    with tarfile.open(archive) as tar:
        manifest = json.loads(tar.extractfile("manifest.json").read())[0]  # type: ignore[union-attr]
        config = json.loads(tar.extractfile(manifest["Config"]).read())  # type: ignore[union-attr]
        for name in manifest["Layers"]:
            member = tar.getmember(name)
            sizes.append(member.size)
            with tarfile.open(fileobj=tar.extractfile(member)) as layer:
                paths_seen |= {m.name.removeprefix("./") for m in layer.getmembers()}
    return config, sizes, paths_seen


@pytest.fixture
def running_agent(lab_cluster: object) -> Iterator[None]:
    spec = load_spec()
    d = agent.lab_deployment(CONFIGS)
    try:
        agent.apply(spec, d)
        agent.wait_rolled_out(spec, d, timeout=300)
        yield
    finally:
        agent.remove(spec, d)


def test_agent_runs_from_the_containerfile_image(running_agent: None) -> None:
    spec = load_spec()
    archive = state_dir() / "shared" / "images" / "node-agent.tar"
    record = images.agent_record(archive.parent)
    built = images.image_id(archive)
    assert record["id"] == built

    # The archive is the Containerfile's image: its revision label, its entry point, a root
    # with Debian's python3 and gpukit but no shell, package manager or pip (multi-stage).
    config, sizes, files = archive_contents(archive)
    cfg = config["config"]
    assert isinstance(cfg, dict)
    assert cfg["Labels"]["org.opencontainers.image.revision"] == record["revision"]
    assert cfg["Entrypoint"] == ["python3", "-m", "gpukit.plugin"]
    assert {
        "usr/bin/python3",
        "usr/bin/python3.11",
        "opt/gpukit/REVISION",
        "opt/gpukit/app/gpukit/plugin/api/deviceplugin_v1beta1_pb2.py",
        "opt/gpukit/lib/grpc/__init__.py",
        "opt/gpukit/lib/kubernetes/__init__.py",
    } <= files
    assert not {"usr/bin/dash", "usr/bin/bash", "usr/bin/dpkg", "usr/bin/apt-get"} & files
    # gpukit's part is the agent's: no lab (nor its C sources), conformance suite or controller
    # library; of the dependencies, none the agent does not import.
    app = [f.removeprefix("opt/gpukit/app/") for f in files if f.startswith("opt/gpukit/app/")]
    assert "gpukit/plugin/cli.py" in app
    assert not [f for f in app if f.startswith(("gpukit/lab", "gpukit/conformance",
                                               "gpukit/provision", "gpukit/cli.py"))], app
    assert not [f for f in app if f.endswith((".c", ".h"))], app
    assert not {"opt/gpukit/lib/typer", "opt/gpukit/lib/cryptography"} & files
    assert not [f for f in files if "/pip/" in f or f.endswith("/pip")]
    assert sum(sizes) <= SIZE_TARGET, f"image is {sum(sizes) / 1e6:.1f} MB, over 150 MB"
    assert int(record["size"]) == pytest.approx(sum(sizes), rel=0.02)

    # Every node runs it: the node's image for the tag and each agent pod's image ID are the
    # archive's, and the pod's /opt/gpukit/REVISION is this build's.
    pods = agent_pods()
    assert set(pods) == {n.name for n in spec.nodes}
    for node in spec.nodes:
        name, image_id = pods[node.name]
        assert node_image_id(node) == built and image_id == built, (node.name, image_id)
        assert read_in_pod(name, "/opt/gpukit/REVISION").strip() == record["revision"]

    # ... and registers each node's GPUs with its kubelet.
    core = connect.core(paths().admin_kubeconfig)
    for node in spec.nodes:
        want = len(nodes.gpu_uuids(node))
        deadline = time.monotonic() + 120
        got = None
        while time.monotonic() < deadline:
            got = (core.read_node(node.name).status.allocatable or {}).get("nvidia.com/gpu")
            if got is not None and int(got) == want:
                break
            time.sleep(1)
        assert got is not None and int(got) == want, (node.name, got, want)


def test_lab_up_brings_a_changed_agent_image_to_every_node_once(
    running_agent: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = load_spec()
    archive = state_dir() / "shared" / "images" / "node-agent.tar"
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
        record = images.agent_record(archive.parent)
        built = record["id"]
        assert built == images.image_id(archive)
        after = {n.name: node_image_id(n) for n in spec.nodes}
        assert after == {n.name: built for n in spec.nodes}, messages
        assert not set(after.values()) & set(before.values()), "the image ID did not change"
        assert any(m.startswith("built ") for m in messages), messages
        # Pods on the old image were restarted and run the new one, marker included.
        pods = agent_pods()
        assert set(pods) == set(pods_before)
        for node, (name, image_id) in pods.items():
            assert name != pods_before[node][0] and image_id == built
            revision = read_in_pod(name, "/opt/gpukit/REVISION").strip()
            assert revision == record["revision"] and revision.endswith(f"+{token}")

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
