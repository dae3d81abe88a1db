"""GPU telemetry on the real kubelet: the node agent's dcgm-style series follow the lab's GPU
workload (gpu-work, gpukit/lab/nvml/workload) and carry the pod, namespace and container the kubelet's
PodResources API names.

The agent is deployed as gpukit.agent_manifests has it (the kubelet's pod-resources directory
mounted read-only, the metrics port on every interface) and one named config per case: whole GPUs, time-slicing
(2 replicas) and MIG (mixed); DeviceSpecs put the device nodes into containers (runc, no NVIDIA
runtime), which is what gpu-work looks at. gpu-work registers itself with the node's mock NVML
through the clients directory (a hostPath) for as long as it runs.

- a pod working on a GPU moves that GPU's DCGM_FI_DEV_GPU_UTIL and DCGM_FI_DEV_FB_USED, with
  its pod/namespace/container labels, to what NVML on the node says; deleted, the series lose
  its labels and fall back to idle;
- three single-replica pods on gpu-t4 (2 GPUs x 2 replicas): the GPU two of them share has one
  series per sharing container, each GPU's series name exactly the pods given its replicas;
- a pod on a 3g.20gb MIG device: the device's FB_USED series (GPU_I_PROFILE, GPU_I_ID of its GPU
  instance) carries the pod; the MIG-enabled GPU has no utilisation series (NVML: not
  supported), as dcgm-exporter shows it;
- MPS (NVIDIA's sharing.mps config, 2 replicas per T4): gpukit's MPS control DaemonSet runs on
  gpu-t4 alone (nvidia.com/mps.capable), one daemon per GPU with both GPUs in
  EXCLUSIVE_PROCESS; three pods run at once, the two on one GPU as MPS clients of its server
  (NVML: the server is the GPU's one process, the pods its MPS clients), each pod's series name
  it; a pod asking for more than its replica's memory limit fails as on MPS (out of memory);
  back to whole GPUs, the daemons and the DaemonSet's pod are gone and the compute mode is
  DEFAULT again.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import labtools
import pytest
from kubernetes import client
from labtools import created_pods, wait_for, work_pod
from prometheus_client.parser import text_string_to_metric_families

from gpukit.agent_manifests import MPS_APP, AgentDeployment
from gpukit.k8s import connect, waits
from gpukit.lab import agent, cluster, nodes
from gpukit.lab import nvml as mock
from gpukit.lab.config import load_spec, state_dir
from gpukit.lab.controlplane import paths
from gpukit.lab.nvml import workload

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
A100, T4 = "gpu-a100", "gpu-t4"
NS = "telemetry-test"
CONFIG_LABEL = "nvidia.com/device-plugin.config"
MIB = 1 << 20
Sample = tuple[str, dict[str, str], float]


def _config(mig: str = "none", replicas: int = 0) -> dict[str, Any]:
    doc: dict[str, Any] = {"version": "v1", "flags": {"migStrategy": mig, "plugin": {
        "passDeviceSpecs": True, "deviceListStrategy": "envvar", "deviceIDStrategy": "uuid"}}}
    if replicas:
        doc["sharing"] = {"timeSlicing": {"resources": [
            {"name": "nvidia.com/gpu", "replicas": replicas}]}}
    return doc


MPS = {**_config(), "sharing": {"mps": {"resources": [
    {"name": "nvidia.com/gpu", "replicas": 2}]}}}
CONFIGS = {"whole": _config(), "ts": _config(replicas=2), "mig": _config("mixed"), "mps": MPS}


def sh(node: str, command: str, timeout: float = 120) -> str:
    r = cluster.node_exec(load_spec().node(node), ["sh", "-c", command], timeout=timeout)
    assert r.returncode == 0, f"{node}: {command}: {r.stdout}{r.stderr}"
    return r.stdout


def scrape(node: str) -> list[Sample]:
    status, body = labtools.agent_http(node, "/metrics")
    assert status == 200, body
    return [(s.name, dict(s.labels), s.value) for f in text_string_to_metric_families(body)
            for s in f.samples]


def series(samples: list[Sample], name: str, **labels: str) -> list[Sample]:
    return [s for s in samples
            if s[0] == name and all(s[1].get(k) == v for k, v in labels.items())]


def node_nvml(node: str) -> dict[str, dict[str, Any]]:
    """What NVML on the node says now, per UUID (GPUs and MIG devices): utilisation (None where
    not supported), memory used, processes."""
    code = r"""
import json, pynvml as n
n.nvmlInit()
out = {}
def dev(h):
    d = {"used": n.nvmlDeviceGetMemoryInfo(h).used,
         "procs": [p.pid for p in n.nvmlDeviceGetComputeRunningProcesses(h)]}
    try:
        d["util"] = n.nvmlDeviceGetUtilizationRates(h).gpu
    except n.NVMLError:
        d["util"] = None
    return d
for i in range(n.nvmlDeviceGetCount()):
    h = n.nvmlDeviceGetHandleByIndex(i)
    out[n.nvmlDeviceGetUUID(h)] = dev(h)
    try:
        mig = n.nvmlDeviceGetMigMode(h)[0]
    except n.NVMLError:
        mig = 0
    for j in range(n.nvmlDeviceGetMaxMigDeviceCount(h) if mig else 0):
        try:
            m = n.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
        except n.NVMLError:
            continue
        out[n.nvmlDeviceGetUUID(m)] = dev(m)
print(json.dumps(out))
"""
    root = nodes.root(load_spec().node(node))
    env = mock.env(root / "etc/gpukit-lab/nvml/profile.yaml", root / "var/lib/gpukit-lab/nvml")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       check=True, timeout=60)
    got: dict[str, dict[str, Any]] = json.loads(r.stdout)
    return got


def resources(core: client.CoreV1Api, node: str) -> dict[str, int]:
    alloc = core.read_node(node).status.allocatable or {}
    return {k: int(v) for k, v in alloc.items() if k.startswith("nvidia.com/")}


def allocated(node: str, pod: client.V1Pod) -> list[str]:
    """The device IDs the kubelet gave the pod (its device manager checkpoint)."""
    text = sh(node, "cat /var/lib/kubelet/device-plugins/kubelet_internal_checkpoint")
    ids: list[str] = []
    for e in json.loads(text)["Data"]["PodDeviceEntries"] or []:
        if e["PodUID"] == pod.metadata.uid:
            for per_numa in e["DeviceIDs"].values():
                ids += per_numa
    return ids


@pytest.fixture(scope="module")
def core(lab_cluster: object) -> Iterator[client.CoreV1Api]:
    api = connect.core(paths().admin_kubeconfig)
    api.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NS)))
    yield api
    api.delete_namespace(NS)


@pytest.fixture(scope="module")
def deployed(core: client.CoreV1Api) -> Iterator[AgentDeployment]:
    spec = load_spec()
    userspace = ExitStack()
    archive = workload.build_image(state_dir() / "shared" / "images")
    for node in (A100, T4):
        sh(node, f"ctr -n k8s.io images import /opt/gpukit-lab/images/{archive.name}")
    # The agent's manifest mounts the kubelet's pod-resources directory itself.
    d = agent.lab_deployment(CONFIGS, default_config="whole")
    try:
        userspace.enter_context(labtools.driver_userspace(T4))  # the MPS tools
        agent.apply(spec, d)
        agent.wait_rolled_out(spec, d, timeout=180)
        wait_for(f"{A100}: 8 nvidia.com/gpu",
                 lambda: resources(core, A100).get("nvidia.com/gpu") == 8, timeout=180,
                 explain=lambda: agent.diagnose(spec, A100))
        yield d
    finally:
        agent.remove(spec, d)
        for node in (A100, T4):
            core.patch_node(node, {"metadata": {"labels": {CONFIG_LABEL: None}}})
        userspace.close()


def select(core: client.CoreV1Api, node: str, config: str, want: dict[str, int]) -> None:
    core.patch_node(node, {"metadata": {"labels": {CONFIG_LABEL: config}}})
    wait_for(f"{node} to advertise {want} ({config})",
             lambda: all(resources(core, node).get(k) == v for k, v in want.items())
             and labtools.agent_http(node, "/readyz")[0] == 200, timeout=120)


@pytest.fixture
def pods(core: client.CoreV1Api) -> Iterator[list[str]]:
    yield from created_pods(core, NS)


def run_work(core: client.CoreV1Api, pods: list[str], node: str, resource: str, mem_mb: int,
             util: int) -> client.V1Pod:
    name = f"work-{uuid.uuid4().hex[:6]}"
    pod = work_pod(name, node, resource, mem_mb, util)
    core.create_namespaced_pod(NS, pod)
    pods.append(name)
    return waits.pod_phase(core, NS, name, {"Running"}, 120)


def test_a_working_pod_moves_its_gpus_series_and_they_stop_when_it_ends(
        core: client.CoreV1Api, deployed: AgentDeployment, pods: list[str]) -> None:
    select(core, A100, "whole", {"nvidia.com/gpu": 8})
    pod = run_work(core, pods, A100, "nvidia.com/gpu", mem_mb=3000, util=60)
    (gpu,) = allocated(A100, pod)
    labels = {"UUID": gpu, "pod": pod.metadata.name, "namespace": NS, "container": "trainer"}

    def moved() -> list[Sample]:
        got = scrape(A100)
        util = series(got, "DCGM_FI_DEV_GPU_UTIL", **labels)
        return got if util and util[0][2] == 60.0 else []

    got = wait_for(f"{gpu}'s utilisation series with the pod's labels at 60 %", moved,
                   timeout=60, every=1)
    nvml = node_nvml(A100)[gpu]
    (used,) = series(got, "DCGM_FI_DEV_FB_USED", **labels)
    assert nvml["util"] == 60 and used[2] == nvml["used"] / MIB >= 3000, (used, nvml)
    assert len(nvml["procs"]) == 1  # gpu-work, by its pid on the node
    (temp,) = series(got, "DCGM_FI_DEV_GPU_TEMP", **labels)
    assert temp[1]["hostname"] == A100 and temp[1]["device"].startswith("nvidia")
    others = [s for s in series(got, "DCGM_FI_DEV_GPU_UTIL") if s[1]["UUID"] != gpu]
    assert len(others) == 7 and all(s[2] == 0 and "pod" not in s[1] for s in others)

    core.delete_namespaced_pod(pod.metadata.name, NS, grace_period_seconds=0)

    def stopped() -> bool:
        util = series(scrape(A100), "DCGM_FI_DEV_GPU_UTIL", UUID=gpu)
        return len(util) == 1 and util[0][2] == 0.0 and "pod" not in util[0][1]

    wait_for(f"{gpu}'s series back to idle without the pod", stopped, timeout=60, every=1)
    assert node_nvml(A100)[gpu]["procs"] == []


def test_a_time_sliced_gpu_has_one_series_per_sharing_container(
        core: client.CoreV1Api, deployed: AgentDeployment, pods: list[str]) -> None:
    select(core, T4, "ts", {"nvidia.com/gpu": 4})
    started = [run_work(core, pods, T4, "nvidia.com/gpu", mem_mb=500, util=30)
               for _ in range(3)]
    by_gpu: dict[str, set[str]] = {}
    for pod in started:
        (replica,) = allocated(T4, pod)
        by_gpu.setdefault(replica.split("::")[0], set()).add(pod.metadata.name)
    shared = [g for g, names in by_gpu.items() if len(names) == 2]
    assert shared, by_gpu  # three pods on two GPUs: one is shared

    def attributed() -> bool:
        got = scrape(T4)
        return all({s[1].get("pod") for s in series(got, "DCGM_FI_DEV_FB_USED", UUID=g)}
                   == names for g, names in by_gpu.items())

    wait_for(f"FB_USED series per sharing pod {by_gpu}", attributed, timeout=60, every=1)
    got = scrape(T4)
    nvml = node_nvml(T4)
    for g, names in by_gpu.items():
        util = series(got, "DCGM_FI_DEV_GPU_UTIL", UUID=g)
        assert {s[1]["pod"] for s in util} == names
        assert {s[2] for s in util} == {float(nvml[g]["util"])} == {30.0 * len(names)}
        assert len(nvml[g]["procs"]) == len(names)


def mps_pods(core: client.CoreV1Api, namespace: str) -> dict[str, str]:
    return labtools.phases_by_node(core, namespace, MPS_APP)


def suite_mps(tmp_path: Path, replicas: int) -> tuple[int, str]:
    """The conformance suite's mps area on gpu-t4, declared with this module's configs and
    its "mps" config at `replicas` per GPU: (exit status, output)."""
    configs = json.loads(json.dumps(CONFIGS))
    configs["mps"]["sharing"]["mps"]["resources"][0]["replicas"] = replicas
    # The configs' envvar strategy with runc and DeviceSpecs: no NVIDIA runtime to harden.
    host_vars = {T4: {**labtools.NO_TOOLKIT_VARS, "gpukit_device_plugin_configs": configs,
                      "gpukit_device_plugin_config": "mps",
                      "gpukit_runtime_accept_envvar_unprivileged": True}}
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                        str(REPO / "gpukit" / "conformance"), "--lab", "-m", "mps",
                        "--nodes", T4, "--host-vars", json.dumps(host_vars), "-q",
                        f"--junitxml={tmp_path / f'mps-{replicas}.xml'}"],
                       capture_output=True, text=True, timeout=600, cwd=REPO)
    return r.returncode, r.stdout[-6000:] + r.stderr[-2000:]


def test_mps_pods_share_a_gpu_through_its_daemon_within_their_limits(
        core: client.CoreV1Api, deployed: AgentDeployment, pods: list[str],
        tmp_path: Path) -> None:
    # From whole GPUs (2): an earlier time-sliced config also advertises 4, so the 4 seen here
    # are the MPS replicas, healthy once every GPU's daemon serves.
    select(core, T4, "whole", {"nvidia.com/gpu": 2})
    select(core, T4, "mps", {"nvidia.com/gpu": 4})
    ns = deployed.namespace
    wait_for("the MPS control pod running on gpu-t4 only",
             lambda: mps_pods(core, ns) == {T4: "Running"}, timeout=120)
    try:
        view = labtools.mps_view(T4)
        # NVML_COMPUTEMODE_EXCLUSIVE_PROCESS (3) on both GPUs
        assert {g: v["mode"] for g, v in view.items()} == dict.fromkeys(view, 3), view
        daemons = sh(T4, "ls /run/nvidia/mps").split()
        assert sorted(d for d in daemons if d.startswith("GPU-")) == sorted(view), daemons
        started = [run_work(core, pods, T4, "nvidia.com/gpu", mem_mb=2000, util=30)
                   for _ in range(3)]
        by_gpu: dict[str, set[str]] = {}
        for pod in started:
            (replica,) = allocated(T4, pod)
            by_gpu.setdefault(replica.split("::")[0], set()).add(pod.metadata.name)
        (shared,) = [g for g, names in by_gpu.items() if len(names) == 2]

        def clients() -> dict[str, Any]:
            v = labtools.mps_view(T4)[shared]
            return v if len(v["clients"]) == 2 else {}

        seen = wait_for(f"two MPS clients on {shared}", clients, timeout=60, every=1)
        assert len(seen["procs"]) == 1 and seen["procs"][0] not in seen["clients"], seen

        def attributed() -> bool:
            got = series(scrape(T4), "DCGM_FI_DEV_FB_USED", UUID=shared)
            return {s[1].get("pod") for s in got} == by_gpu[shared]

        wait_for(f"FB_USED series of {shared} per MPS client pod", attributed, timeout=60,
                 every=1)
        # A replica's limit is its share of the T4's 15360 MiB: 7680 MiB.
        name = f"work-{uuid.uuid4().hex[:6]}"
        core.create_namespaced_pod(NS, work_pod(name, T4, "nvidia.com/gpu", 9000, 10))
        pods.append(name)
        done = waits.pod_phase(core, NS, name, {"Failed", "Succeeded"}, 120)
        (state,) = done.status.container_statuses
        assert done.status.phase == "Failed" and state.state.terminated.exit_code == 4, state
        labtools.delete_pods(core, NS, pods)
        pods.clear()
        # The suite's mps area, gpu-t4 declared as it is served: passes; declared with 4
        # replicas per GPU: fails, naming each pod's limits (expected and observed).
        rc, out = suite_mps(tmp_path, replicas=2)
        assert rc == 0 and "2 passed" in out, out
        rc, out = suite_mps(tmp_path, replicas=4)
        assert rc == 1 and "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" in out and \
            "expected 0=3840M" in out and "observed 0=7680M" in out, out
    finally:
        labtools.delete_pods(core, NS, pods)
        pods.clear()
        select(core, T4, "whole", {"nvidia.com/gpu": 2})
        wait_for("no MPS control pod left", lambda: mps_pods(core, ns) == {}, timeout=120)
    assert "GPU-" not in sh(T4, "ls /run/nvidia/mps")
    assert {v["mode"] for v in labtools.mps_view(T4).values()} == {0}


@pytest.fixture
def mig_gpu0(core: client.CoreV1Api, deployed: AgentDeployment) -> Iterator[None]:
    cli = load_spec().node(A100)
    labtools.node_pynvml(A100, labtools.MIG_MODE, "create")
    nodes.nvml_cli(cli, "reset", "--gpu", "0")
    labtools.node_pynvml(A100, labtools.MIG_CREATE)
    try:
        yield
    finally:
        select(core, A100, "whole", {})
        # A reset waits for the GPU's processes to end, as nvidia-smi -r does (IN_USE until).
        wait_for("GPU 0 of gpu-a100 free to reset",
                 lambda: nodes.nvml_cli(cli, "reset", "--gpu", "0") is not None, timeout=60,
                 every=1, retry_on=(subprocess.CalledProcessError,))
        labtools.node_pynvml(A100, labtools.MIG_MODE, "destroy")
        nodes.nvml_cli(cli, "reset", "--gpu", "0")
        wait_for(f"{A100} back to 8 whole GPUs",
                 lambda: resources(core, A100).get("nvidia.com/gpu") == 8, timeout=120)


def test_a_mig_pod_is_attributed_on_its_mig_device(
        core: client.CoreV1Api, deployed: AgentDeployment, mig_gpu0: None,
        pods: list[str]) -> None:
    select(core, A100, "mig", {"nvidia.com/mig-3g.20gb": 2, "nvidia.com/gpu": 7})
    pod = run_work(core, pods, A100, "nvidia.com/mig-3g.20gb", mem_mb=1500, util=100)
    (mig,) = allocated(A100, pod)
    status = json.loads(nodes.nvml_cli(load_spec().node(A100), "status"))
    gpu0 = status["gpus"][0]
    gi_id = next(gi["id"] for gi in gpu0["mig"]["gpu_instances"]
                 for ci in gi["compute_instances"] if ci["uuid"] == mig)

    def attributed() -> list[Sample]:
        return series(scrape(A100), "DCGM_FI_DEV_FB_USED", pod=pod.metadata.name)

    (used,) = wait_for(f"the MIG device {mig}'s FB_USED with the pod's labels", attributed,
                       timeout=60, every=1)
    assert used[1]["GPU_I_PROFILE"] == "3g.20gb" and used[1]["GPU_I_ID"] == str(gi_id)
    assert used[1]["UUID"] == gpu0["uuid"] and used[1]["gpu"] == "0"  # the parent's, as dcgm
    assert used[2] == node_nvml(A100)[mig]["used"] / MIB >= 1500
    got = scrape(A100)
    assert series(got, "DCGM_FI_DEV_GPU_UTIL", gpu="0") == []  # not supported with MIG on
    other = [s for s in series(got, "DCGM_FI_DEV_FB_USED", gpu="0", GPU_I_PROFILE="3g.20gb")
             if "pod" not in s[1]]
    assert len(other) == 1 and other[0][2] < 1500  # the second instance: nobody's


def test_an_injected_xid_and_ecc_error_reach_the_series(
        core: client.CoreV1Api, deployed: AgentDeployment) -> None:
    """The node's driver reports XID 79 on gpu-t4's GPU 1 and an uncorrectable ECC error on its
    GPU 0: DCGM_FI_DEV_XID_ERRORS shows the last XID (from the agent's health monitor), the
    agent counts it critical, the volatile double-bit ECC counter is 1; a T4 (Turing) has no
    row remapping, so that series is absent, not 0."""
    cli = load_spec().node(T4)
    select(core, T4, "whole", {"nvidia.com/gpu": 2})
    nodes.nvml_cli(cli, "inject-xid", "--gpu", "1", "--xid", "79")
    nodes.nvml_cli(cli, "inject-xid", "--gpu", "0", "--xid", "0", "--type", "double-bit-ecc")
    try:
        def seen() -> list[Sample]:
            got = scrape(T4)
            xid = series(got, "DCGM_FI_DEV_XID_ERRORS", gpu="1")
            ecc = series(got, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", gpu="0")
            return got if xid and xid[0][2] == 79 and ecc and ecc[0][2] == 1 else []

        got = wait_for("XID 79 and the ECC error in the series", seen, timeout=60, every=1)
        assert series(got, "DCGM_FI_DEV_XID_ERRORS", gpu="0")[0][2] == 0
        counted = series(got, "gpukit_plugin_xid_events_total", xid="79", critical="true")
        assert counted and counted[0][2] >= 1
        assert series(got, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS") == []
    finally:
        nodes.nvml_cli(cli, "reset", "--gpu", "0")  # volatile ECC counts end with a reset
