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


# The lab's agent mounts its mock NVML's profile and state under these volume names
# (inventories/lab: gpukit_device_plugin_host_mounts); restated here, not imported: the suite
# is an independent witness of the agent (gpukit/agent_manifests.py says the same).
_MOCK_NVML_VOLUMES = ("nvml-profile", "nvml-state")
_AGENT_SELECTOR = "app.kubernetes.io/name=gpukit-node-agent"
_DRIVER_ROOT_IN_AGENT = "/driver-root/"


def lab_mounts(suite: Suite, node: str) -> list[tuple[str, str, str]]:
    """The node's mock NVML (library, profile, state) as gpukit's agent on the node mounts
    them, mounted as the toolkit would inject the real driver's library. Read from the agent's
    pod, so the installed suite needs nothing of the lab (gpukit.lab is not in the wheel)."""
    pods = suite.kube.pods_on(node, _AGENT_SELECTOR)
    if not pods:
        return _peer_mounts(suite, node)
    spec = pods[0].spec
    paths = {v.name: v.host_path.path for v in spec.volumes or () if v.host_path}
    env = {e.name: e.value for c in spec.containers for e in c.env or ()}
    library = str(env.get("GPUKIT_NVML_LIB") or "")
    prefix = _DRIVER_ROOT_IN_AGENT
    missing = [n for n in _MOCK_NVML_VOLUMES if n not in paths]
    if not library.startswith(prefix) or missing:
        raise LookupError(f"node {node}: the agent pod {pods[0].metadata.name} has no mock "
                          f"NVML to share (GPUKIT_NVML_LIB {library!r}, volumes missing: "
                          f"{missing})")
    return [("nvml-lib", "/" + library[len(prefix):], "File"),
            *((n, paths[n], "Directory") for n in _MOCK_NVML_VOLUMES)]


def _peer_mounts(suite: Suite, node: str) -> list[tuple[str, str, str]]:
    """Where another device plugin serves a lab node (NVIDIA's, gpukit.lab.peer): a pod of it
    that mounts the mock NVML's library, profile and state as host paths under the same volume
    names."""
    names = ("nvml-lib", *_MOCK_NVML_VOLUMES)
    for pod in suite.kube.pods_on(node, ""):
        paths = {v.name: v.host_path.path for v in pod.spec.volumes or () if v.host_path}
        if all(n in paths for n in names):
            return [("nvml-lib", paths["nvml-lib"], "File"),
                    *((n, paths[n], "Directory") for n in _MOCK_NVML_VOLUMES)]
    raise LookupError(f"node {node}: no gpukit agent pod ({_AGENT_SELECTOR}), nor another pod"
                      f" mounting the mock NVML ({', '.join(names)}), to take its paths from")


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
                      lab_mounts(suite, node) if lab else [], suite.options.pod_timeout)


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
