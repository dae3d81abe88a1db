"""A CUDA-like workload on the lab: a container given a GPU through CDI gets its device nodes
and loads the driver's libcuda.so.1 through what the spec injected; one without cannot.

gpu-a100 runs the lab's nvidia-container-runtime (test_runtime_strategies' fixtures: the toolkit
package, containerd's `nvidia` runtime and a RuntimeClass, the agent with one named config per
strategy, passDeviceSpecs false) and has the stand-in driver package installed (libcuda.so and
libnvidia-ml.so.<version> with their soname links). The workload is the lab's cuda-probe
image (gpukit/lab/cuda/cuda_probe.c: its own C library, no driver library): it dlopens libcuda.so.1,
calls cuInit and cuDeviceGetCount and prints what it found; the stand-in libcuda counts the
device nodes the container may open.

- cdi-annotations / cdi-cri (the agent's spec): exactly its GPU's node and the control nodes,
  the library loaded, one device;
- a MIG device (cdi-annotations): its parent's node and its two caps nodes, one device;
- a pod without a GPU request: no nodes, the library cannot be loaded (exit 2);
- the node-wide spec (gpukit.provision.cdi, NVIDIA's shape, nvidia-cdi-hook installed) binds
  only libcuda.so.<version>: the container loads libcuda.so.1 because the hooks ran ldconfig in
  it (update-ldcache), and counts every GPU for `nvidia.com/gpu=all`.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import labtools
import pytest
import test_runtime_strategies as rs
from kubernetes import client
from labtools import runtime_pod

from gpukit.agent_manifests import AgentDeployment
from gpukit.k8s import waits
from gpukit.lab import images
from gpukit.lab.config import state_dir
from gpukit.lab.packages.catalog import BRANCHES
from gpukit.plugin.devices import Gpu, NodeDevices
from gpukit.provision import cdi

pytestmark = pytest.mark.lab

# test_runtime_strategies' fixtures: the toolkit, the agent, the test pods.
core, toolkit, deployed, pods, mig_gpu0 = rs.core, rs.toolkit, rs.deployed, rs.pods, rs.mig_gpu0
CONTROL, NODE, NS = rs.CONTROL, rs.NODE, rs.NS
root, sh, set_toolkit, nvml_status = rs.root, rs.sh, rs.set_toolkit, rs.nvml_status

BRANCH = BRANCHES[0]  # the lab's GPUs report this driver (gpukit/lab/profiles)
LIBS = "/usr/lib/x86_64-linux-gnu"
NVML_LIB = f"{LIBS}/libnvidia-ml.so.1"
NODE_SPEC = "etc/cdi/nvidia.yaml"


@pytest.fixture(scope="module")
def probe_image(toolkit: None) -> None:
    images.build_cuda_probe(state_dir() / "shared" / "images")
    sh("ctr -n k8s.io images import /opt/gpukit-lab/images/cuda-probe.tar")


@pytest.fixture(scope="module")
def driver(toolkit: None) -> Iterator[None]:
    """The stand-in driver's user space installed (its kernel module is the lab's boot);
    afterwards removed, and the mock NVML the lab put there restored."""
    assert nvml_status()["driver_version"] == BRANCH.driver_version
    with labtools.driver_userspace(NODE):
        yield


def run_probe(core: client.CoreV1Api, pods: list[str], resource: str | None,
              env: dict[str, str] | None = None) -> tuple[client.V1Pod, int, dict[str, str]]:  # fmt: skip
    """The probe in a pod under the nvidia RuntimeClass: (the pod, exit status, report)."""
    name = f"cuda-{uuid.uuid4().hex[:8]}"
    pod = runtime_pod(name, NODE, rs.RUNTIME_CLASS, images.CUDA_PROBE, resource, env,
                      labels={"gpukit-test": "runtime-strategies"})
    core.create_namespaced_pod(NS, pod)
    pods.append(name)
    got = waits.pod_phase(core, NS, name, {"Succeeded", "Failed"}, 120)
    statuses = got.status.container_statuses or []
    assert statuses and statuses[0].state.terminated, got.status
    out = core.read_namespaced_pod_log(name, NS)
    report = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return got, statuses[0].state.terminated.exit_code, report


def nodes_of(report: dict[str, str]) -> set[str]:
    return set(report.get("CUDA_NODES", "").split())


@pytest.mark.parametrize("strategy", ["cdi-annotations", "cdi-cri"])
def test_a_cdi_container_loads_the_driver_library_and_sees_its_gpu(
    core: client.CoreV1Api, deployed: AgentDeployment, driver: None, probe_image: None,
    pods: list[str], strategy: str,
) -> None:
    set_toolkit(hardened=True)
    rs.select(core, strategy, {"nvidia.com/gpu": 8})
    pod, code, report = run_probe(core, pods, "nvidia.com/gpu")
    ids = rs.allocated(pod)
    assert len(ids) == 1 and nodes_of(report) == {rs.gpu_node_of(ids[0]), *CONTROL}, report
    assert (code, report["CUDA_LOAD"], report["CUDA_INIT"]) == (0, "ok", "0"), report
    assert report["CUDA_DEVICES"] == "1", report
    assert report["CUDA_DRIVER"] == "12040", report  # the 550 branch: CUDA 12.4


def test_a_pod_without_a_gpu_cannot_load_the_driver_library(
    core: client.CoreV1Api, deployed: AgentDeployment, driver: None, probe_image: None,
    pods: list[str],
) -> None:
    set_toolkit(hardened=True)
    pod, code, report = run_probe(core, pods, None)
    assert rs.allocated(pod) == [] and nodes_of(report) == set(), report
    assert code == 2 and "libcuda.so.1: cannot open shared object file" in report["CUDA_LOAD"]


def node_inventory() -> NodeDevices:
    status = nvml_status()
    gpus = tuple(Gpu(index=g["index"], uuid=g["uuid"], minor=g["index"], name=g["name"],
                     memory_mb=0) for g in status["gpus"])  # fmt: skip
    return NodeDevices(gpus=gpus, driver_version=status["driver_version"])


def test_the_node_specs_hooks_make_libcuda_loadable_by_soname(
    core: client.CoreV1Api, deployed: AgentDeployment, driver: None, probe_image: None,
    pods: list[str],
) -> None:
    """The node-wide spec as the cdi_spec module writes it on gpu-a100, asked for by CDI name
    (NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=all: env requests need the hardening off)."""
    node = root()
    dev = {f"/dev/{n}" for n in sh("ls /dev").split()}  # the node's own /dev, not in its root

    def exists(path: str) -> bool:
        return path in dev if path.startswith("/dev/") else os.path.exists(node / path[1:])

    spec = cdi.build(node_inventory(), exists=exists, driver_root=str(node))
    for m in spec["containerEdits"]["mounts"]:  # the node's paths, as seen on the node
        m["hostPath"] = "/" + str(Path(m["hostPath"]).relative_to(node))
    bound = {m["containerPath"] for m in spec["containerEdits"]["mounts"]}
    assert f"{LIBS}/libcuda.so.{BRANCH.driver_version}" in bound
    assert f"{LIBS}/libcuda.so.1" not in bound and len(spec["containerEdits"]["hooks"]) == 4
    (node / NODE_SPEC).parent.mkdir(parents=True, exist_ok=True)
    (node / NODE_SPEC).write_text(cdi.render(spec))
    set_toolkit(hardened=False)
    try:
        every = {"NVIDIA_VISIBLE_DEVICES": "nvidia.com/gpu=all"}
        _, code, report = run_probe(core, pods, None, every)
        assert {f"/dev/nvidia{i}" for i in range(8)} | CONTROL == nodes_of(report), report
        assert (code, report["CUDA_LOAD"], report["CUDA_DEVICES"]) == (0, "ok", "8"), report
    finally:
        set_toolkit(hardened=True)
        (node / NODE_SPEC).unlink()


def test_a_cdi_mig_container_sees_one_device(
    core: client.CoreV1Api, deployed: AgentDeployment, driver: None, probe_image: None,
    mig_gpu0: None, pods: list[str],
) -> None:
    """GPU 0 split in two 3g.20gb MIG devices: the container given one sees its parent's node
    and its GPU and compute instance caps nodes, and CUDA counts one device (not GPU 0)."""
    set_toolkit(hardened=True)
    rs.select(core, "mig-cdi-annotations", {"nvidia.com/mig-3g.20gb": 2, "nvidia.com/gpu": 7})
    pod, code, report = run_probe(core, pods, "nvidia.com/mig-3g.20gb")
    ids = rs.allocated(pod)
    assert len(ids) == 1 and ids[0].startswith("MIG-"), ids
    assert nodes_of(report) == {"/dev/nvidia0", *rs.mig_caps(ids[0]), *CONTROL}, report
    assert (code, report["CUDA_LOAD"], report["CUDA_DEVICES"]) == (0, "ok", "1"), report
