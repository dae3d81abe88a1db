"""Deploy gpukit's node agent (device plugin + labeler) onto the lab's nodes.

The lab's GPUs are the mock NVML: the agent loads the node's libnvidia-ml.so.1 from
the driver root and reads the node's profile and device state, as it would read a
real driver's.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from gpukit.lab import images
from gpukit.lab.cluster import kubernetes_bindir
from gpukit.lab.config import LabSpec
from gpukit.lab.controlplane import LabError, paths
from gpukit.plugin.deploy import AgentDeployment, HostMount, manifests

NVML_LIB = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
NVML_STATE = "/var/lib/gpukit-lab/nvml"


def lab_deployment(
    configs: dict[str, dict[str, Any]], default_config: str | None = None, **env: str
) -> AgentDeployment:
    return AgentDeployment(
        image=images.AGENT,
        configs=configs,
        default_config=default_config,
        nvml_library=f"/driver-root{NVML_LIB}",
        env={
            "GPUKIT_NVML_PROFILE": "/driver-root/etc/gpukit-lab/nvml/profile.yaml",
            "GPUKIT_NVML_STATE_DIR": NVML_STATE,
            **env,
        },
        host_mounts=(HostMount("nvml-state", NVML_STATE, NVML_STATE, read_only=False),),
        image_pull_policy="Never",
    )


def kubectl(lab: LabSpec, *args: str, stdin: str | None = None) -> str:
    r = subprocess.run(
        [str(kubernetes_bindir(lab) / "kubectl"),
         f"--kubeconfig={paths().admin_kubeconfig}", *args],
        input=stdin, capture_output=True, text=True,
    )  # fmt: skip
    if r.returncode != 0:
        raise LabError(f"kubectl {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout


def apply(lab: LabSpec, deployment: AgentDeployment) -> None:
    docs = yaml.safe_dump_all(manifests(deployment), sort_keys=False)
    kubectl(lab, "apply", "--server-side", "--force-conflicts", "-f", "-", stdin=docs)


def wait_rolled_out(lab: LabSpec, deployment: AgentDeployment, timeout: int = 120) -> None:
    kubectl(
        lab, "-n", deployment.namespace, "rollout", "status", "daemonset/gpukit-node-agent",
        f"--timeout={timeout}s",
    )  # fmt: skip


def remove(lab: LabSpec, deployment: AgentDeployment) -> None:
    docs = yaml.safe_dump_all(manifests(deployment), sort_keys=False)
    kubectl(lab, "delete", "--ignore-not-found", "--wait=true", "-f", "-", stdin=docs)


def mock_library() -> Path:
    from gpukit.lab import nvml

    lib = nvml.library_path()
    if lib is None:
        raise LabError("the mock NVML library is not built: run `make nvml`")
    return lib
