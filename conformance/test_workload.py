"""Workloads: a pod asking for one device of each resource runs NVML (pynvml) and sees exactly
its device; on real GPUs, a CUDA sample computes on it.

In the lab the NVML library is the mock: the pod mounts it from the node (as the NVIDIA container
toolkit would inject the real one) and counts as visible only the GPUs whose device node the
runtime gave it, which is what the real driver enforces."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpukit.conformance.checks import Check
from gpukit.conformance.cluster import pod_manifest
from gpukit.conformance.common import lab_mode, need_decl
from gpukit.contracts import label_names as ln
from gpukit.contracts.device_ids import strip_replica

pytestmark = [pytest.mark.workload, pytest.mark.exclusive]

WORKLOAD = r"""
import json, os
env = os.environ.get("NVIDIA_VISIBLE_DEVICES")
if env == "/var/run/nvidia-container-devices" and os.path.isdir(env):
    env = ",".join(sorted(os.listdir(env)))  # volume-mounts: one mount per device ID
out = {"env": env, "gpus": [], "error": ""}
try:
    import pynvml as n
    n.nvmlInit()
    out["driver"] = n.nvmlSystemGetDriverVersion()
    for i in range(n.nvmlDeviceGetCount()):
        h = n.nvmlDeviceGetHandleByIndex(i)
        minor = n.nvmlDeviceGetMinorNumber(h)
        g = {"uuid": n.nvmlDeviceGetUUID(h), "minor": minor, "migs": [],
             "node": os.path.exists("/dev/nvidia%d" % minor)}
        if g["node"]:
            g["memory_total"] = n.nvmlDeviceGetMemoryInfo(h).total
            g["utilization"] = n.nvmlDeviceGetUtilizationRates(h).gpu
            try:
                mig = n.nvmlDeviceGetMigMode(h)[0]
            except n.NVMLError:
                mig = 0
            for j in range(n.nvmlDeviceGetMaxMigDeviceCount(h) if mig else 0):
                try:
                    m = n.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
                    g["migs"].append(n.nvmlDeviceGetUUID(m))
                except n.NVMLError:
                    pass
        out["gpus"].append(g)
    n.nvmlShutdown()
except Exception as e:
    out["error"] = repr(e)
print(json.dumps(out))
"""


def _lab_mounts() -> list[tuple[str, str, str]]:
    from gpukit.lab.agent import NVML_LIB, NVML_STATE
    from gpukit.lab.nvml import DEFAULT_PROFILE

    return [("nvml-lib", NVML_LIB, "File"), ("nvml-profile", str(DEFAULT_PROFILE.parent),
                                             "Directory"),
            ("nvml-state", NVML_STATE, "Directory")]


def _run_pod(suite: Any, node: str, resource: str, role: str, image: str,
             command: list[str] | None, host_paths: list[tuple[str, str, str]],
             timeout: float) -> tuple[Any, str]:
    kube = suite.kube
    name = suite.pod_name(role, node, resource)
    manifest = pod_manifest(name, run_id=kube.run_id, role=role, node=node, image=image,
                            command=command or [], limits={resource: 1},
                            host_network=suite.options.host_network, host_paths=host_paths)
    if not command:
        del manifest["spec"]["containers"][0]["command"]
    kube.create_pod(suite.namespace, manifest)
    try:
        state = kube.wait_pods(suite.namespace, [name], timeout,
                               done=lambda s: s.state not in ("Pending", "Running"))[name]
        logs = kube.logs(suite.namespace, name) if state.state in ("Succeeded", "Failed") else ""
    finally:
        kube.delete_pods(suite.namespace, [name], timeout)
    return state, logs


@pytest.mark.per_resource("all")
def test_workload_sees_its_device(gpukit_suite: Any, node: str, resource: str,
                                  check: Check) -> None:
    suite = gpukit_suite
    need_decl(suite, node)
    if not suite.options.agent_image:
        check.skip("no --agent-image (gpukit's node-agent image runs the pynvml workload)")
    suite.release(node)
    lab = lab_mode(suite, node)
    state, logs = _run_pod(suite, node, resource, "pynvml", suite.options.agent_image,
                           ["python3", "-c", WORKLOAD], _lab_mounts() if lab else [],
                           suite.options.pod_timeout)
    check.equal("pynvml workload pod", "Succeeded", str(state), resource)
    if state.state != "Succeeded":
        check.verify()
    try:
        out: dict[str, Any] = json.loads(logs.strip().splitlines()[-1])
    except (ValueError, IndexError):
        check.record("workload output", "JSON", logs[-300:], False, resource)
        check.verify()
    check.equal("NVML in the container", "", out.get("error", ""), resource)
    env = [v for v in (out.get("env") or "").split(",") if v]
    usable = [g for g in out.get("gpus", []) if g.get("node")]
    check.equal("devices in NVIDIA_VISIBLE_DEVICES", 1, len(env), resource)
    if resource.startswith(ln.MIG_RESOURCE_PREFIX) or any(e.startswith("MIG-") for e in env):
        check.equal("GPUs the container can open (the MIG device's parent)", 1, len(usable),
                    resource)
        migs = [m for g in usable for m in g.get("migs", [])]
        check.true("its MIG device is on that GPU (NVML)", bool(env) and env[0] in migs,
                   env[0] if env else "a MIG UUID", migs, resource)
    else:
        check.equal("GPUs NVML shows the container (UUIDs)",
                    sorted(strip_replica(e) for e in env), sorted(g["uuid"] for g in usable),
                    resource)
        check.true("memory of its GPU readable", all(g.get("memory_total", 0) > 0
                                                     for g in usable), "> 0",
                   [g.get("memory_total") for g in usable], resource)
    check.verify()


@pytest.mark.cuda
@pytest.mark.per_resource("all")
def test_cuda_smoke(gpukit_suite: Any, node: str, resource: str, check: Check) -> None:
    """A CUDA sample (vectorAdd) on one device of each resource; real GPUs only."""
    suite = gpukit_suite
    need_decl(suite, node)
    if lab_mode(suite, node):
        check.skip("no real GPU (NVML is the gpukit lab mock): the CUDA smoke needs one")
    if suite.options.host_access and suite.probe(node) is None:
        check.skip(f"cannot tell whether the GPU is real: {suite.probe_error(node)}")
    suite.release(node)
    state, logs = _run_pod(suite, node, resource, "cuda", suite.options.cuda_image, None, [],
                           suite.options.pod_timeout * 3)
    check.equal(f"CUDA sample {suite.options.cuda_image}", "Succeeded", str(state), resource)
    check.true("sample output", "PASSED" in logs, "Test PASSED", logs.strip()[-200:], resource)
    check.verify()
