"""Every device list strategy end to end on the lab, through the lab's nvidia-container-runtime.

gpu-a100 gets the lab's nvidia-container-toolkit package (the stand-in runtime), containerd
the `nvidia` runtime (gpukit.provision.runtime, in place) and a RuntimeClass for it, the
runtime's config.toml NVIDIA's hardening (gpukit.provision.toolkit_config). The node agent
serves one named config per strategy with passDeviceSpecs false, so only the runtime (or
containerd's CDI, for cdi-cri and the CDI annotations) puts device nodes into a container:

- volume-mounts, cdi-annotations, cdi-cri: a one-GPU pod sees exactly its GPU's node and the
  driver's control nodes; a MIG device its parent's node and its two /dev/nvidia-caps nodes,
  those the driver lists for its GPU and compute instance; a time-sliced replica its GPU's;
- envvar under the hardening: nothing (why the roles refuse that combination); with the
  hardening off: exactly its GPU;
- a pod without a GPU request but NVIDIA_VISIBLE_DEVICES=all (as CUDA images set it) sees no
  GPU under the hardening and every GPU with it off, and the conformance suite (its pods
  under the nvidia RuntimeClass) then fails naming the node and the device nodes.

Which GPU the kubelet gave a container comes from the kubelet's own checkpoint; the runtime's
log shows it created each container.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import labtools
import pytest
import yaml
from kubernetes import client
from labtools import created_pods, runtime_pod, wait_for

from gpukit.agent_manifests import AgentDeployment
from gpukit.contracts.device_ids import ReplicaId
from gpukit.k8s import connect, waits
from gpukit.lab import agent, cluster, images, nodes
from gpukit.lab import driver_surface as ds
from gpukit.lab.config import load_spec
from gpukit.lab.controlplane import paths
from gpukit.lab.inventory import for_instance
from gpukit.lab.packages import build_repo
from gpukit.lab.packages.catalog import RUNTIME_LOG
from gpukit.provision import runtime, toolkit_config

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
NODE = "gpu-a100"
NS = "default"
RUNTIME_CLASS = "gpukit-test-nvidia"
CONFIG_LABEL = "nvidia.com/device-plugin.config"
CONTAINERD = "etc/containerd/config.toml"
TOOLKIT = "etc/nvidia-container-runtime/config.toml"
CONTROL = {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"}
NVML_LIB = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
STRATEGIES = ("envvar", "volume-mounts", "cdi-annotations", "cdi-cri")


def _config(strategy: str, mig: str = "none", replicas: int = 0) -> dict[str, Any]:
    doc: dict[str, Any] = {"version": "v1", "flags": {"migStrategy": mig, "plugin": {
        "passDeviceSpecs": False, "deviceListStrategy": strategy, "deviceIDStrategy": "uuid"}}}
    if replicas:
        doc["sharing"] = {"timeSlicing": {"resources": [
            {"name": "nvidia.com/gpu", "replicas": replicas}]}}
    return doc


TIME_SLICED = 2
CONFIGS = {
    **{s: _config(s) for s in STRATEGIES},
    **{f"mig-{s}": _config(s, "mixed") for s in STRATEGIES},
    **{f"ts-{s}": _config(s, replicas=TIME_SLICED) for s in STRATEGIES},
}


def sh(command: str, timeout: float = 120) -> str:
    r = cluster.node_exec(load_spec().node(NODE), ["sh", "-c", command], timeout=timeout)
    assert r.returncode == 0, f"{NODE}: {command}: {r.stdout}{r.stderr}"
    return r.stdout


def root() -> Path:
    return nodes.root(load_spec().node(NODE))


def agent_http(path: str) -> tuple[int, str]:
    return labtools.agent_http(NODE, path)


def reloads() -> float:
    status, body = agent_http("/metrics")
    if status != 200:
        return -1
    m = re.search(r'^gpukit_plugin_config_reloads_total\{result="ok"\} (\S+)$', body, re.M)
    return float(m.group(1)) if m else 0.0


def resources(core: client.CoreV1Api) -> dict[str, int]:
    alloc = core.read_node(NODE).status.allocatable or {}
    return {k: int(v) for k, v in alloc.items() if k.startswith("nvidia.com/")}


def nvml_status() -> dict[str, Any]:
    return json.loads(nodes.nvml_cli(load_spec().node(NODE), "status"))


def set_toolkit(hardened: bool) -> None:
    path = root() / TOOLKIT
    settings = toolkit_config.ToolkitSettings(accept_envvar_unprivileged=not hardened)
    edit = toolkit_config.plan(path.read_text(), settings, "/" + TOOLKIT)
    if edit.changed:
        path.write_text(edit.after or "")


@pytest.fixture(scope="module")
def core(lab_cluster: object) -> client.CoreV1Api:
    return connect.core(paths().admin_kubeconfig)


@pytest.fixture(scope="module")
def toolkit(core: client.CoreV1Api) -> Iterator[None]:
    """The toolkit package installed, containerd running the `nvidia` runtime, its
    RuntimeClass; undone afterwards."""
    build_repo()
    containerd_conf = root() / CONTAINERD
    original = containerd_conf.read_text()
    version = runtime.config_version(tomllib.loads(original), "/" + CONTAINERD)
    edit = runtime.configure_containerd(original, runtime.RuntimeSettings(), "/" + CONTAINERD,
                                        new_version=version)  # fmt: skip
    node_api = client.NodeV1Api(core.api_client)
    try:
        sh("dpkg -i /opt/gpukit-lab/apt/nvidia-container-toolkit_*.deb")
        containerd_conf.write_text(edit.after or original)
        sh("systemctl restart containerd")
        node_api.create_runtime_class(client.V1RuntimeClass(
            metadata=client.V1ObjectMeta(name=RUNTIME_CLASS), handler="nvidia"))
        wait_for(f"{NODE} Ready after the containerd restart",
                 lambda: any(c.type == "Ready" and c.status == "True"
                             for c in core.read_node(NODE).status.conditions), timeout=120)
        yield
    finally:
        try:
            node_api.delete_runtime_class(RUNTIME_CLASS)
        except client.ApiException:
            pass
        containerd_conf.write_text(original)
        sh("systemctl restart containerd")
        sh("dpkg --purge nvidia-container-toolkit")


@pytest.fixture(scope="module")
def deployed(core: client.CoreV1Api, toolkit: None) -> Iterator[AgentDeployment]:
    spec = load_spec()
    d = agent.lab_deployment(CONFIGS, default_config="volume-mounts")
    core.patch_node(NODE, {"metadata": {"labels": {CONFIG_LABEL: "volume-mounts"}}})
    try:
        agent.apply(spec, d)
        agent.wait_rolled_out(spec, d, timeout=180)
        wait_for(f"{NODE}: 8 nvidia.com/gpu", lambda: resources(core).get("nvidia.com/gpu") == 8,
                 timeout=180, explain=lambda: agent.diagnose(spec, NODE))  # fmt: skip
        yield d
    finally:
        agent.remove(spec, d)
        core.patch_node(NODE, {"metadata": {"labels": {CONFIG_LABEL: None}}})


def select(core: client.CoreV1Api, config: str, want: dict[str, int]) -> None:
    """Switch the node's agent to a named config: label, a successful reload, the resources
    advertised again."""
    current = core.read_node(NODE).metadata.labels.get(CONFIG_LABEL)
    if current != config:
        before = reloads()
        core.patch_node(NODE, {"metadata": {"labels": {CONFIG_LABEL: config}}})
        wait_for(f"the agent to reload into {config}", lambda: reloads() > before, timeout=90)
    wait_for(f"{NODE} to advertise {want}",
             lambda: all(resources(core).get(k) == v for k, v in want.items())
             and agent_http("/readyz")[0] == 200, timeout=90)  # fmt: skip


SCRIPT = ('echo "NVD=${NVIDIA_VISIBLE_DEVICES-<unset>}"; '
          'echo "DEV=$(find /dev -name "nvidia*" ! -type d | sort | tr "\\n" " ")"; '
          f'test -e {NVML_LIB} && echo LIB=yes; echo END; exec sleep 3600')


@pytest.fixture
def pods(core: client.CoreV1Api) -> Iterator[list[str]]:
    yield from created_pods(core, NS)


def start(core: client.CoreV1Api, pods: list[str], resource: str | None,
          env: dict[str, str] | None = None) -> tuple[client.V1Pod, dict[str, str]]:
    """A pod under the nvidia RuntimeClass; (the pod, what it reported)."""
    name = f"rt-{uuid.uuid4().hex[:8]}"
    pod = runtime_pod(name, NODE, RUNTIME_CLASS, images.SHELL, resource, env,
                      command=["sh", "-c", SCRIPT], labels={"gpukit-test": "runtime-strategies"})
    core.create_namespaced_pod(NS, pod)
    pods.append(name)
    got = waits.pod_phase(core, NS, name, {"Running", "Failed", "Succeeded"}, 120)
    assert got.status.phase == "Running", got.status

    def logged() -> str | None:
        out = core.read_namespaced_pod_log(name, NS)
        return out if "END" in out else None

    out = wait_for(f"{name} to report", logged, timeout=60)
    report = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return got, report


def devices(report: dict[str, str]) -> set[str]:
    return set(report.get("DEV", "").split())


def allocated(pod: client.V1Pod) -> list[str]:
    """The device IDs the kubelet gave the pod's container (its device manager checkpoint)."""
    text = sh("cat /var/lib/kubelet/device-plugins/kubelet_internal_checkpoint")
    entries = json.loads(text)["Data"]["PodDeviceEntries"] or []
    ids: list[str] = []
    for e in entries:
        if e["PodUID"] == pod.metadata.uid:
            for per_numa in e["DeviceIDs"].values():
                ids += per_numa
    return ids


def created_by_runtime(pod: client.V1Pod) -> bool:
    cid = pod.status.container_statuses[0].container_id.removeprefix("containerd://")
    log = (root() / RUNTIME_LOG.lstrip("/")).read_text()
    return any(" create " in line and line.split()[-1] == cid for line in log.splitlines())


def gpu_node_of(uuid_: str) -> str:
    gpus = nvml_status()["gpus"]
    index = next(g["index"] for g in gpus if g["uuid"] == uuid_)
    return f"/dev/nvidia{index}"  # the lab's minors are the indices


@pytest.mark.parametrize("strategy", ["volume-mounts", "cdi-annotations", "cdi-cri"])
def test_hardened_strategies_give_exactly_the_allocated_gpu(
    core: client.CoreV1Api, deployed: AgentDeployment, pods: list[str], strategy: str
) -> None:
    set_toolkit(hardened=True)
    select(core, strategy, {"nvidia.com/gpu": 8})
    pod, report = start(core, pods, "nvidia.com/gpu")
    ids = allocated(pod)
    assert len(ids) == 1 and ids[0].startswith("GPU-"), ids
    assert devices(report) == {gpu_node_of(ids[0]), *CONTROL}, (strategy, report)
    assert report.get("LIB") == "yes", report  # the driver's files come with the GPU
    assert created_by_runtime(pod)
    if strategy == "volume-mounts":
        assert report["NVD"] == "/var/run/nvidia-container-devices"
    else:  # the CDI spec's edits
        assert report["NVD"] == "void"


def test_envvar_gives_nothing_hardened_and_the_gpu_without_hardening(
    core: client.CoreV1Api, deployed: AgentDeployment, pods: list[str]
) -> None:
    select(core, "envvar", {"nvidia.com/gpu": 8})
    set_toolkit(hardened=True)
    pod, report = start(core, pods, "nvidia.com/gpu")
    ids = allocated(pod)
    assert report["NVD"] == ids[0] and devices(report) == set(), report
    set_toolkit(hardened=False)
    try:
        pod, report = start(core, pods, "nvidia.com/gpu")
        ids = allocated(pod)
        assert devices(report) == {gpu_node_of(ids[0]), *CONTROL}, report
    finally:
        set_toolkit(hardened=True)


@pytest.mark.parametrize(("strategy", "hardened"), [
    ("volume-mounts", True), ("cdi-annotations", True), ("cdi-cri", True), ("envvar", False)])
def test_a_time_sliced_replica_gets_exactly_its_gpu(
    core: client.CoreV1Api, deployed: AgentDeployment, pods: list[str], strategy: str,
    hardened: bool,
) -> None:
    # The kubelet hands out replica IDs (<uuid>::<n>); what reaches the runtime or containerd
    # must name the GPU itself, or the container gets nothing or fails to start.
    set_toolkit(hardened=hardened)
    try:
        select(core, f"ts-{strategy}", {"nvidia.com/gpu": 8 * TIME_SLICED})
        pod, report = start(core, pods, "nvidia.com/gpu")
        ids = allocated(pod)
        replica = ReplicaId.parse(ids[0]) if len(ids) == 1 else None
        assert replica is not None, ids
        assert devices(report) == {gpu_node_of(replica.device), *CONTROL}, (strategy, report)
        assert report.get("LIB") == "yes", report
    finally:
        set_toolkit(hardened=True)


def test_a_gpu_less_pod_asking_for_all_gpus_gets_them_only_without_hardening(
    core: client.CoreV1Api, deployed: AgentDeployment, pods: list[str]
) -> None:
    every = {f"/dev/nvidia{i}" for i in range(8)}
    set_toolkit(hardened=True)
    pod, report = start(core, pods, None, {"NVIDIA_VISIBLE_DEVICES": "all"})
    assert allocated(pod) == [] and devices(report) == set(), report
    assert created_by_runtime(pod)
    set_toolkit(hardened=False)
    try:
        _, report = start(core, pods, None, {"NVIDIA_VISIBLE_DEVICES": "all"})
        assert every | CONTROL <= devices(report), report
    finally:
        set_toolkit(hardened=True)


def _suite(tmp_path: Path, inventory: Path) -> tuple[int, dict[str, str], str]:
    """The conformance suite's GPU-less pod check on NODE, its pods under the nvidia
    RuntimeClass: (exit status, failure text per test, output)."""
    junit = tmp_path / f"junit-{uuid.uuid4().hex[:6]}.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "gpukit/conformance", "-q", "-p", "no:cacheprovider",
         "--inventory", str(inventory), "--kubeconfig", str(paths().admin_kubeconfig),
         "--nodes", NODE, "--no-host", "--shell-image", images.SHELL,
         "--runtime-class", RUNTIME_CLASS, "-k", "test_pod_without_gpu_sees_none",
         f"--junitxml={junit}"],
        cwd=REPO, capture_output=True, text=True, timeout=300)  # fmt: skip
    failures = {c.get("name", ""): (c.find("failure").text or "")  # type: ignore[union-attr]
                for c in ET.parse(junit).getroot().iter("testcase")
                if c.find("failure") is not None}
    return proc.returncode, failures, proc.stdout[-3000:] + proc.stderr[-2000:]


def test_the_suite_fails_a_gpu_less_pod_that_gets_gpus_without_hardening(
    core: client.CoreV1Api, deployed: AgentDeployment, tmp_path: Path
) -> None:
    # The node declared as the agent serves it: the hardened configs, volume-mounts selected.
    inventory = tmp_path / "inventory"
    shutil.copytree(for_instance(load_spec()), inventory)
    (inventory / "host_vars").mkdir(exist_ok=True)
    (inventory / "host_vars" / f"{NODE}.yml").write_text(yaml.safe_dump({
        "gpukit_device_plugin_configs": {
            k: v for k, v in CONFIGS.items() if "envvar" not in k},
        "gpukit_device_plugin_config": "volume-mounts", "gpukit_mig_config": None}))
    select(core, "volume-mounts", {"nvidia.com/gpu": 8})
    set_toolkit(hardened=True)
    rc, failures, out = _suite(tmp_path, inventory)
    assert rc == 0 and not failures, out
    set_toolkit(hardened=False)  # the runtime honours NVIDIA_VISIBLE_DEVICES=all again
    try:
        rc, failures, out = _suite(tmp_path, inventory)
    finally:
        set_toolkit(hardened=True)
    text = failures.get(f"test_pod_without_gpu_sees_none[{NODE}]", "")
    assert rc == 1 and text, out
    assert NODE in text and "/dev/nvidia* entries" in text and "nvidia0" in text, text


def node_pynvml(code: str, *args: str) -> None:
    labtools.node_pynvml(NODE, code, *args)


@pytest.fixture
def mig_gpu0(core: client.CoreV1Api, deployed: AgentDeployment) -> Iterator[None]:
    cli = load_spec().node(NODE)
    node_pynvml(labtools.MIG_MODE, "create")
    nodes.nvml_cli(cli, "reset", "--gpu", "0")
    node_pynvml(labtools.MIG_CREATE)
    yield
    select(core, "volume-mounts", {})
    nodes.nvml_cli(cli, "reset", "--gpu", "0")  # a reset destroys the MIG instances
    node_pynvml(labtools.MIG_MODE, "destroy")
    nodes.nvml_cli(cli, "reset", "--gpu", "0")
    wait_for(f"{NODE} back to 8 whole GPUs", lambda: resources(core).get("nvidia.com/gpu") == 8,
             timeout=90)  # fmt: skip


def mig_caps(mig_uuid: str) -> set[str]:
    """The /dev/nvidia-caps nodes of a MIG device: the GPU and compute instance access minors
    (GPU 0's minor is 0)."""
    gpu0 = nvml_status()["gpus"][0]
    for gi in gpu0["mig"]["gpu_instances"]:
        for ci in gi["compute_instances"]:
            if mig_uuid in json.dumps(ci):
                return {f"/dev/nvidia-caps/nvidia-cap{ds.caps_minor(0, gi['id'])}",
                        f"/dev/nvidia-caps/nvidia-cap{ds.caps_minor(0, gi['id'], ci['id'])}"}
    raise AssertionError(f"{mig_uuid} is not a MIG device of GPU 0: {gpu0['mig']}")


@pytest.mark.parametrize(("strategy", "hardened"), [
    ("volume-mounts", True), ("cdi-annotations", True), ("cdi-cri", True), ("envvar", False)])
def test_a_mig_device_gets_its_parent_and_its_caps_nodes(
    core: client.CoreV1Api, deployed: AgentDeployment, mig_gpu0: None, pods: list[str],
    strategy: str, hardened: bool,
) -> None:
    set_toolkit(hardened=hardened)
    try:
        select(core, f"mig-{strategy}", {"nvidia.com/mig-3g.20gb": 2, "nvidia.com/gpu": 7})
        pod, report = start(core, pods, "nvidia.com/mig-3g.20gb")
        ids = allocated(pod)
        assert len(ids) == 1 and ids[0].startswith("MIG-"), ids
        caps = mig_caps(ids[0])
        assert devices(report) == {"/dev/nvidia0", *caps, *CONTROL}, report
    finally:
        set_toolkit(hardened=True)
