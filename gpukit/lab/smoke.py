"""`gpukit lab smoke`: a pod on every lab node sees that node's GPU device files.

A minimal check of the node path (scheduling, containerd, runc, logs through the
kubelet); the device plugin's own checks replace it where the plugin is deployed.
"""

from __future__ import annotations

import sys
import uuid

from kubernetes import client

from gpukit.k8s import connect, waits
from gpukit.lab import images, nodes
from gpukit.lab.config import LabSpec
from gpukit.lab.controlplane import LabError, paths


def _pod(name: str, node: str) -> client.V1Pod:
    script = "ls /host-dev | grep -c '^nvidia[0-9][0-9]*$'"
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels={"app.kubernetes.io/part-of": "gpukit-lab"}),
        spec=client.V1PodSpec(
            node_name=node,
            host_network=True,
            restart_policy="Never",
            containers=[
                client.V1Container(
                    name="smoke",
                    image=images.SHELL,
                    command=["sh", "-c", script],
                    volume_mounts=[
                        client.V1VolumeMount(name="dev", mount_path="/host-dev", read_only=True)
                    ],
                )
            ],
            volumes=[
                client.V1Volume(name="dev", host_path=client.V1HostPathVolumeSource(path="/dev"))
            ],
        ),
    )


def run(lab: LabSpec, timeout: float = 60) -> dict[str, int]:
    core = connect.core(paths().admin_kubeconfig)
    seen: dict[str, int] = {}
    failures = []
    for n in lab.nodes:
        name = f"gpukit-smoke-{n.name}-{uuid.uuid4().hex[:6]}"
        core.create_namespaced_pod("default", _pod(name, n.name))
        try:
            pod = waits.pod_phase(core, "default", name, {"Succeeded", "Failed"}, timeout)
            out = core.read_namespaced_pod_log(name, "default").strip()
        finally:
            core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
        want = nodes.gpu_count(n.profile)
        got = int(out) if out.isdigit() else -1
        seen[n.name] = got
        ok = pod.status.phase == "Succeeded" and got == want
        print(
            f"{n.name}: {got} GPU device files (profile {n.profile}: {want})"
            f" {'ok' if ok else 'FAIL'}",
            file=sys.stderr,
        )
        if not ok:
            failures.append(f"{n.name}: expected {want} GPU device files, observed {out!r}")
    if failures:
        raise LabError("smoke check failed: " + "; ".join(failures))
    return seen
