"""Pods that need a node's devices free (after its fill is released): the request above one
replica of a shared resource, the pynvml workload, the CUDA sample. Each runs one pod pinned to
the node, waits for where it got to, reads its logs and deletes it; the tests assert on what it
returns (these are the `gt1` and `workload` stages of conformance.schedule)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .cluster import PodState, pod_manifest
from .fill import HOLD

if TYPE_CHECKING:
    from .suite import Suite

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
            try:  # a MIG-enabled GPU answers NOT_SUPPORTED, as the driver does
                g["utilization"] = n.nvmlDeviceGetUtilizationRates(h).gpu
            except n.NVMLError:
                g["utilization"] = None
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


@dataclass(frozen=True)
class PodRun:
    """One exclusive pod: its name, where it got to, its logs (once it ended)."""

    pod: str
    state: PodState
    logs: str = ""


def lab_mounts() -> list[tuple[str, str, str]]:
    """The lab's mock NVML (library, profile, state), mounted as the toolkit would inject the
    real driver's library."""
    from gpukit.lab.agent import NVML_LIB, NVML_STATE
    from gpukit.lab.nvml import DEFAULT_PROFILE

    return [("nvml-lib", NVML_LIB, "File"), ("nvml-profile", str(DEFAULT_PROFILE.parent),
                                             "Directory"),
            ("nvml-state", NVML_STATE, "Directory")]


def run_to_end(suite: Suite, node: str, resource: str, role: str, image: str,
               command: list[str] | None, host_paths: list[tuple[str, str, str]],
               timeout: float) -> PodRun:
    """A pod with one device of `resource` that runs to its end (Succeeded or Failed)."""
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
                               done=lambda s: s.state not in ("Pending", "Running"),
                               node=node)[name]
        logs = kube.logs(suite.namespace, name) if state.state in ("Succeeded", "Failed") else ""
    finally:
        kube.delete_pods(suite.namespace, [name], timeout, node=node)
    return PodRun(name, state, logs)


def workload(suite: Suite, node: str, resource: str, lab: bool) -> PodRun:
    """The pynvml workload on one device of `resource` (needs --agent-image)."""
    image = suite.options.agent_image
    if not image:
        raise LookupError("no --agent-image (gpukit's node-agent image runs the pynvml workload)")
    return run_to_end(suite, node, resource, "pynvml", image, ["python3", "-c", WORKLOAD],
                      lab_mounts() if lab else [], suite.options.pod_timeout)


def request_above_one(suite: Suite, node: str, resource: str) -> PodRun:
    """A pod asking for 2 of a shared resource; where it got to (admission decides)."""
    kube = suite.kube
    name = suite.pod_name("gt1", node, resource)
    kube.create_pod(suite.namespace, pod_manifest(
        name, run_id=kube.run_id, role="gt1", node=node, image=suite.options.shell_image,
        command=["sh", "-c", HOLD], limits={resource: 2},
        host_network=suite.options.host_network,
    ))
    try:
        state = kube.wait_pods(suite.namespace, [name], suite.options.pod_timeout,
                               node=node)[name]
    finally:
        kube.delete_pods(suite.namespace, [name], suite.options.pod_timeout, node=node)
    return PodRun(name, state)
