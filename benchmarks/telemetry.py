"""GPU metrics scrape figures at scale: 16x A100-40GB (the mock NVML's a100-sxm4-40gb-x16
profile), every GPU split into 7x 1g.5gb (112 MIG devices), each MIG device time-sliced twice,
200 pods each holding one replica (a synthetic PodResources answer from a stand-in kubelet on
a unix socket), a gpu-work-like load on half the MIG devices.

    .venv/bin/python benchmarks/telemetry.py

Prints the /metrics scrape latency over HTTP (p50/p99, with PodResources cached as the agent
runs, and with a List on every scrape), series per scrape, the agent's CPU time per scrape and
its peak RSS, with the ratios to the targets.
"""

from __future__ import annotations

import os
import resource
import socket
import statistics
import tempfile
import time
import urllib.request
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from gpukit.lab import nvml as mock
from gpukit.lab.nvml.control import MockControl
from gpukit.plugin.api import deviceplugin_grpc, podresources_grpc
from gpukit.plugin.api import deviceplugin_pb2 as pb
from gpukit.plugin.api import podresources_pb2 as pr
from gpukit.plugin.config_source import ConfigSource, Override
from gpukit.plugin.manager import ManagerOptions, PluginManager, PynvmlBackend

PROFILE = "a100-sxm4-40gb-x16"
GPUS, MIGS, REPLICAS, PODS = 16, 7, 2, 200
SCRAPES = 40
TARGET_SCRAPE_P99_S = 1.0  # well inside a 15 s scrape interval
TARGET_CPU_PER_SCRAPE_S = 0.5
TARGET_RSS_MIB = 256  # the DaemonSet's memory limit

class Kubelet(deviceplugin_grpc.RegistrationServicer, podresources_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    """Answers Register, and List with `pods` (pod, device IDs)."""

    def __init__(self, plugins: Path, pod_resources: Path) -> None:
        self.pods: list[tuple[str, list[str]]] = []
        self.lists = 0
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        deviceplugin_grpc.add_RegistrationServicer_to_server(self, self.server)
        podresources_grpc.add_PodResourcesListerServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"unix://{plugins / 'kubelet.sock'}")
        self.server.add_insecure_port(f"unix://{pod_resources / 'kubelet.sock'}")

    def Register(self, request: Any, context: Any) -> Any:
        return pb.Empty()

    def List(self, request: Any, context: Any) -> Any:
        self.lists += 1
        return pr.ListPodResourcesResponse(pod_resources=[
            pr.PodResources(name=name, namespace=f"team-{i % 8}", containers=[
                pr.ContainerResources(name="main", devices=[pr.ContainerDevices(
                    resource_name="nvidia.com/mig-1g.5gb", device_ids=ids)])])
            for i, (name, ids) in enumerate(self.pods)])


def pct(values: list[float], p: int) -> float:
    return statistics.quantiles(values, n=100)[p - 1] if len(values) > 1 else values[0]


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def scrape_all(url: str) -> tuple[list[float], list[float], int]:
    lat, cpus, lines = [], [], 0
    for _ in range(SCRAPES):
        c, t = cpu(), time.perf_counter()
        with urllib.request.urlopen(url, timeout=30) as r:
            body = r.read().decode()
        lat.append(time.perf_counter() - t)
        cpus.append(cpu() - c)
        lines = sum(1 for line in body.splitlines() if line.startswith("DCGM_FI_"))
    return lat, cpus, lines


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="gk-bench-", dir="/tmp"))
    state = work / "nvml"
    env = mock.env(PROFILE, state)
    mock.split_seven_1g(env, GPUS)
    os.environ.update(env)
    ctl = MockControl(env[mock.ENV_LIB])
    status = ctl.status()
    migs = [(g["index"], gi["id"], ci["uuid"]) for g in status["gpus"]
            for gi in g["mig"]["gpu_instances"] for ci in gi["compute_instances"]]
    assert len(migs) == GPUS * MIGS, len(migs)
    for n, (gpu, gi, _uuid) in enumerate(migs[::2]):  # work on half the MIG devices
        ctl.set_process(gpu, pid=10000 + n, mem_mb=1024, gi=gi, ci=0, util=70)

    plugins, pod_resources = work / "device-plugins", work / "pod-resources"
    plugins.mkdir()
    pod_resources.mkdir()
    kubelet = Kubelet(plugins, pod_resources)
    ids = [f"{uuid}::{r}" for _g, _gi, uuid in migs for r in range(REPLICAS)]
    kubelet.pods = [(f"pod-{i:03d}", [ids[i]]) for i in range(PODS)]
    kubelet.server.start()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    overrides = [
        Override("gpukit.kubeletDir", str(plugins), "bench"),
        Override("gpukit.metricsAddress", f"127.0.0.1:{port}", "bench"),
        Override("flags.migStrategy", "mixed", "bench"),
        Override("sharing.timeSlicing.resources",
                 [{"name": "nvidia.com/mig-1g.5gb", "replicas": REPLICAS}], "bench"),
    ]  # fmt: skip
    manager = PluginManager(ConfigSource(overrides=overrides, node_name="bench-node"),
                            PynvmlBackend(env[mock.ENV_LIB]),
                            options=ManagerOptions(tick=0.05, health=False))
    manager.start()
    manager.metrics.serve(f"127.0.0.1:{port}")
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        urllib.request.urlopen(url, timeout=30).read()  # warm: first List, first NVML calls
        cached, cached_cpu, lines = scrape_all(url)
        lists_cached = kubelet.lists
        manager.pod_resources.ttl = 0.0  # worst case: a PodResources List on every scrape
        uncached, uncached_cpu, _ = scrape_all(url)
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    finally:
        manager.metrics.close()
        manager.stop()
        kubelet.server.stop(0)

    print(f"{GPUS} GPUs x {MIGS} MIG devices, {REPLICAS} replicas each, {PODS} pods; "
          f"{lines} DCGM series per scrape")
    for what, lat, cpus in (("PodResources cached (5 s)", cached, cached_cpu),
                            ("PodResources listed every scrape", uncached, uncached_cpu)):
        p99 = pct(lat, 99)
        per = statistics.mean(cpus)
        print(f"scrape, {what}: p50 {pct(lat, 50) * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms "
              f"(target {TARGET_SCRAPE_P99_S:.1f} s, ratio {p99 / TARGET_SCRAPE_P99_S:.3f}); "
              f"CPU {per * 1000:.0f} ms per scrape (target {TARGET_CPU_PER_SCRAPE_S:.1f} s, "
              f"ratio {per / TARGET_CPU_PER_SCRAPE_S:.3f})")
    print(f"PodResources Lists during {SCRAPES} cached scrapes: {lists_cached - 1}")
    print(f"peak RSS (agent + this client): {rss:.0f} MiB "
          f"(target {TARGET_RSS_MIB} MiB, ratio {rss / TARGET_RSS_MIB:.3f})")


if __name__ == "__main__":
    main()
