"""DRA beside the device plugin on the lab, measured in the same run.

    GPUKIT_LAB_INSTANCE=N PYTHONPATH=. .venv/bin/python benchmarks/dra.py [--rounds 10]

The lab must be up (`gpukit lab up`). gpu-a100 runs gpukit's DRA plugin, gpu-t4 the device
plugin (the node agent). Each round, one after the other:
- DRA: a ResourceClaim (DeviceClass gpu.nvidia.com) and a pod using it on gpu-a100, timed from
  the claim's creation until the pod is Running; NodePrepareResources as the plugin logs it
  ("prepared ... in X ms": reading the claim, the spec file, the checkpoint);
- device plugin: a pod asking for nvidia.com/gpu: 1 on gpu-t4, created until Running.
Meanwhile a thread scrapes the DRA plugin's GPU metrics (it serves the node agent's on a DRA
node) through the API server's node proxy every --scrape-interval seconds (0: none), so the
prepare figures are taken under scrapes. Prints p50/p99 of each, of the scrapes, and the ratio
DRA / device plugin of pod-to-Running.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import threading
import time
import uuid
from dataclasses import replace
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpukit.agent_manifests import APP, DRA_APP, manifests
from gpukit.k8s import connect, objects, waits
from gpukit.k8s.objects import delete_if_there
from gpukit.lab import agent, images
from gpukit.lab.controlplane import paths

NS = "default"
DRA_NODE, DP_NODE = "gpu-a100", "gpu-t4"
PREPARED = re.compile(r"prepared \S+.* in ([0-9.]+) ms")


def pod(name: str, node: str, claim: str | None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "c", "image": images.SHELL,
                                 "command": ["sh", "-c", "exec sleep 3600"]}
    spec: dict[str, Any] = {"nodeSelector": {"kubernetes.io/hostname": node},
                            "restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                            "containers": [container]}
    if claim:
        container["resources"] = {"claims": [{"name": "gpu"}]}
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim}]
    else:
        container["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
            "spec": spec}


def claim(name: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount",
                "count": 1}}]}}}


def running(core: client.CoreV1Api, name: str) -> float:
    started = time.monotonic()
    p = waits.pod_phase(core, NS, name, {"Running", "Failed"}, 180)
    if p.status.phase != "Running":
        raise RuntimeError(f"pod {name}: {p.status.phase}")
    return time.monotonic() - started


def delete(core: client.CoreV1Api, res: client.ResourceV1Api, name: str) -> None:
    for fn in (core.delete_namespaced_pod, res.delete_namespaced_resource_claim):
        delete_if_there(fn, name, NS, grace_period_seconds=0)
    waits.gone(core.list_namespaced_pod, (NS,), f"metadata.name={name}", 120)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def prepare_times(core: client.CoreV1Api) -> list[float]:
    out: list[float] = []
    for p in core.list_namespaced_pod("gpukit-system",
                                      field_selector=f"spec.nodeName={DRA_NODE}").items:
        if p.metadata.name.startswith(DRA_APP):
            log = core.read_namespaced_pod_log(p.metadata.name, "gpukit-system")
            out += [float(m.group(1)) for m in PREPARED.finditer(log)]
    return out


def scrape_loop(core: client.CoreV1Api, port: int, every: float, stop: threading.Event,
                out: list[float]) -> None:
    """The DRA plugin's /metrics on DRA_NODE, timed; a failed scrape is recorded as -1."""
    while not stop.wait(every):
        t0 = time.monotonic()
        try:
            body = core.connect_get_node_proxy_with_path(f"{DRA_NODE}:{port}", "metrics")
            out.append(time.monotonic() - t0 if "DCGM_FI_DEV_FB_USED" in body else -1.0)
        except ApiException:
            out.append(-1.0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--scrape-interval", type=float, default=1.0)
    args = parser.parse_args()
    api = connect.api_client(paths().admin_kubeconfig)
    core, res = client.CoreV1Api(api), client.ResourceV1Api(api)
    configs = {"default": {"version": "v1", "flags": {"plugin": {"passDeviceSpecs": True}}}}
    d = replace(agent.lab_deployment(configs, default_config="default"),
                node_selector={"kubernetes.io/hostname": DP_NODE}, dra=True,
                dra_node_selector={"kubernetes.io/hostname": DRA_NODE})
    docs = manifests(d)
    objects.apply(api, docs, field_manager="gpukit-bench")
    dra_s: list[float] = []
    dp_s: list[float] = []
    scrapes: list[float] = []
    stop = threading.Event()
    try:
        waits.daemonset_rolled_out(api, d.namespace, APP, 180)
        waits.daemonset_rolled_out(api, d.namespace, DRA_APP, 180)
        if args.scrape_interval > 0:
            port = int(d.metrics_address.rsplit(":", 1)[1])
            threading.Thread(target=scrape_loop, daemon=True, args=(
                core, port, args.scrape_interval, stop, scrapes)).start()
        for r in range(args.rounds):
            name = f"bench-dra-{uuid.uuid4().hex[:6]}"
            t0 = time.monotonic()
            res.create_namespaced_resource_claim(NS, claim(name))
            core.create_namespaced_pod(NS, pod(name, DRA_NODE, name))
            running(core, name)
            dra_s.append(time.monotonic() - t0)
            delete(core, res, name)
            name = f"bench-dp-{uuid.uuid4().hex[:6]}"
            t0 = time.monotonic()
            core.create_namespaced_pod(NS, pod(name, DP_NODE, None))
            running(core, name)
            dp_s.append(time.monotonic() - t0)
            delete(core, res, name)
            print(f"round {r + 1}: DRA {dra_s[-1]:.2f} s, device plugin {dp_s[-1]:.2f} s",
                  flush=True)
        prep = prepare_times(core)
    finally:
        stop.set()
        objects.delete(api, docs, wait=120)
    ok = [s for s in scrapes if s >= 0]
    figures = {
        "dra_claim_to_running_s": (pct(dra_s, .5), pct(dra_s, .99)),
        "device_plugin_pod_to_running_s": (pct(dp_s, .5), pct(dp_s, .99)),
        "node_prepare_resources_ms": (pct(prep, .5), pct(prep, .99)) if prep else None,
        "dra_metrics_scrape_s": (pct(ok, .5), pct(ok, .99)) if ok else None,
        "dra_metrics_scrapes_failed": len(scrapes) - len(ok),
    }
    print(json.dumps({"rounds": args.rounds, **figures}, indent=1))
    print(f"DRA / device plugin, p50 pod-to-Running: "
          f"{statistics.median(dra_s) / statistics.median(dp_s):.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
