"""Workloads: a pod asking for one device of each resource runs NVML (pynvml) and sees exactly
its device; on real GPUs, a CUDA sample computes on it.

In the lab the NVML library is the mock: the pod mounts it from the node (as the NVIDIA container
toolkit would inject the real one) and counts as visible only the GPUs whose device node the
runtime gave it, which is what the real driver enforces."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpukit.conformance import exclusive
from gpukit.conformance.checks import Check
from gpukit.conformance.common import CDI_VISIBLE_DEVICES, lab_mode, need_decl
from gpukit.contracts import label_names as ln
from gpukit.contracts.device_ids import strip_replica

pytestmark = [pytest.mark.workload, pytest.mark.exclusive]


@pytest.mark.stages("probe", "release", "workload")
@pytest.mark.per_resource("all")
def test_workload_sees_its_device(gpukit_suite: Any, node: str, resource: str,
                                  check: Check) -> None:
    suite = gpukit_suite
    need_decl(suite, node)
    if not suite.options.agent_image:
        check.skip("no --agent-image (gpukit's node-agent image runs the pynvml workload)")
    run = suite.workload(node, resource, lab_mode(suite, node))
    state, logs = run.state, run.logs
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
    if env == [CDI_VISIBLE_DEVICES]:
        # CDI injection: the variable says nothing; the devices are the nodes it got (a MIG
        # device: its parent's, the MIG instance it may use is the driver's to enforce).
        check.equal("GPUs the container can open (CDI devices, NVIDIA_VISIBLE_DEVICES void)",
                    1, len(usable), resource)
        check.true("memory of its GPU readable", all(g.get("memory_total", 0) > 0
                                                     for g in usable), "> 0",
                   [g.get("memory_total") for g in usable], resource)
        check.verify()
        return
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
@pytest.mark.stages("probe", "release")
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
    run = exclusive.run_to_end(suite, node, resource, "cuda", suite.options.cuda_image, None,
                               [], suite.options.pod_timeout * 3)
    state, logs = run.state, run.logs
    check.equal(f"CUDA sample {suite.options.cuda_image}", "Succeeded", str(state), resource)
    check.true("sample output", "PASSED" in logs, "Test PASSED", logs.strip()[-200:], resource)
    check.verify()
