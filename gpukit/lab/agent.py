"""Deploy gpukit's node agent (device plugin + labeler) onto the lab's nodes.

The lab's GPUs are the mock NVML: the agent loads the node's libnvidia-ml.so.1 from
the driver root and reads the node's profile and device state, as it would read a
real driver's. The deployment mounts the library's directory and /dev (driver root
`/`), and the mock's profile and state directories, nothing else of the node.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpukit.agent_manifests import APP, AgentDeployment, HostMount, manifests
from gpukit.k8s import connect, objects, waits
from gpukit.lab import images
from gpukit.lab.config import LabSpec
from gpukit.lab.controlplane import LabError, paths

NVML_LIB = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
NVML_STATE = "/var/lib/gpukit-lab/nvml"
NVML_PROFILE_DIR = "/etc/gpukit-lab/nvml"
# The stand-in driver's /proc/driver is a mount over each node's procfs (gpukit/lab/node/boot.sh),
# which a container's own /proc does not show as a real driver's would: the agent reads the
# node's view through a host mount, for the MIG capability files its DeviceSpecs need.
PROC_ROOT_IN_AGENT = "/host-proc"


def lab_deployment(
    configs: dict[str, dict[str, Any]], default_config: str | None = None, **env: str
) -> AgentDeployment:
    return AgentDeployment(
        image=images.AGENT,
        configs=configs,
        default_config=default_config,
        nvml_library=f"/driver-root{NVML_LIB}",
        env={
            "GPUKIT_NVML_PROFILE": f"{NVML_PROFILE_DIR}/profile.yaml",
            "GPUKIT_NVML_STATE_DIR": NVML_STATE,
            "GPUKIT_PROC_ROOT": PROC_ROOT_IN_AGENT,
            **env,
        },
        host_mounts=(
            HostMount("nvml-profile", NVML_PROFILE_DIR, NVML_PROFILE_DIR, read_only=True),
            HostMount("nvml-state", NVML_STATE, NVML_STATE, read_only=False),
            HostMount("driver-proc", "/proc/driver", f"{PROC_ROOT_IN_AGENT}/proc/driver"),
        ),
        image_pull_policy="Never",
    )


def _client() -> Any:
    return connect.api_client(paths().admin_kubeconfig)


def apply(lab: LabSpec, deployment: AgentDeployment) -> None:
    objects.apply(_client(), manifests(deployment), field_manager="gpukit-lab")


def wait_rolled_out(lab: LabSpec, deployment: AgentDeployment, timeout: int = 120) -> None:
    waits.daemonset_rolled_out(_client(), deployment.namespace, APP, timeout)


def remove(lab: LabSpec, deployment: AgentDeployment, timeout: float = 120) -> None:
    objects.delete(_client(), manifests(deployment), wait=timeout)


def agent_pods(node: str, namespace: str = "gpukit-system") -> list[str]:
    core = connect.core(paths().admin_kubeconfig)
    pods = core.list_namespaced_pod(namespace, field_selector=f"spec.nodeName={node}").items
    return [p.metadata.name for p in pods]


def agent_log(node: str, namespace: str = "gpukit-system", tail: int | None = None,
              timestamps: bool = False) -> str:
    """The logs of the agent pods on `node`, one after another."""
    core = connect.core(paths().admin_kubeconfig)
    kw: dict[str, Any] = {"timestamps": timestamps}
    if tail is not None:
        kw["tail_lines"] = tail
    return "".join(core.read_namespaced_pod_log(n, namespace, **kw) for n in agent_pods(node))


def mock_library() -> Path:
    from gpukit.lab import nvml

    lib = nvml.library_path()
    if lib is None:
        raise LabError("the mock NVML library is not built: run `make nvml`")
    return lib


def diagnose(lab: LabSpec, node: str, log_lines: int = 25) -> str:
    """What a test that waited in vain for the agent on `node` should print: the agent pods
    and their last log lines, the node's GPU capacity and allocatable, and what the node's
    kubelet said about device plugins (a plugin's registration and disconnection)."""
    out: list[str] = []

    def run(what: str, fn: Any) -> None:
        try:
            out.append(f"--- {what}\n{fn()}")
        except Exception as exc:  # a diagnosis must not hide the failure it explains
            out.append(f"--- {what}: {exc}")

    core = connect.core(paths().admin_kubeconfig)

    def pods() -> str:
        items = core.list_namespaced_pod("gpukit-system",
                                         field_selector=f"spec.nodeName={node}").items
        return "\n".join(f"{p.metadata.name} {p.status.phase} restarts="
                         f"{sum(c.restart_count for c in p.status.container_statuses or [])}"
                         for p in items) or "none"

    run("agent pods", pods)
    for name in agent_pods(node):
        run(f"log of {name}", lambda n=name: core.read_namespaced_pod_log(
            n, "gpukit-system", tail_lines=log_lines, timestamps=True))

    def resources() -> str:
        st = core.read_node(node).status
        return f"capacity {st.capacity}\nallocatable {st.allocatable}"

    run("node resources", resources)

    def kubelet_log() -> str:
        from gpukit.lab.cluster import node_exec

        r = node_exec(lab.node(node), ["journalctl", "-u", "kubelet", "--no-pager", "-o",
                                       "short-precise", "-n", "400"])  # fmt: skip
        lines = [ln for ln in r.stdout.splitlines()
                 if "plugin" in ln.lower() or "endpoint" in ln.lower()]  # fmt: skip
        return "\n".join(lines[-log_lines:]) or r.stderr

    run("kubelet, device plugins", kubelet_log)
    return "\n".join(out)
