"""Device plugin figures on the mock NVML (8x A100-40GB, every GPU split into 7x 1g.5gb,
each MIG device time-sliced 16 ways: 896 device IDs on one socket).

    .venv/bin/python benchmarks/device_plugin.py

Prints start-to-registered, first ListAndWatch, Allocate and GetPreferredAllocation
latency over the unix socket (p50/p99, with the ratio to the target), a rescan, and RSS.
The kubelet here is a stand-in that only answers Register: the figures are the plugin's own.
"""

from __future__ import annotations

import os
import queue
import resource
import statistics
import tempfile
import time
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from gpukit.lab import nvml as mock
from gpukit.plugin.api import deviceplugin_grpc
from gpukit.plugin.api import deviceplugin_pb2 as pb
from gpukit.plugin.config_source import ConfigSource, Override
from gpukit.plugin.manager import ManagerOptions, PluginManager, PynvmlBackend

TARGET_ALLOCATE_P99_MS = 10.0
TARGET_REGISTER_S = 2.0
REPLICAS = 16
CALLS = 500


class Kubelet:
    """Answers Register; records what registered."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.requests: queue.Queue[Any] = queue.Queue()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        deviceplugin_grpc.add_RegistrationServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"unix://{path}")

    def Register(self, request: Any, context: Any) -> Any:
        self.requests.put(request)
        return pb.Empty()


def pct(values: list[float], p: float) -> float:
    return statistics.quantiles(values, n=100)[int(p) - 1] if len(values) > 1 else values[0]


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="gpukit-bench-"))
    state = work / "nvml"
    env = mock.env("a100-sxm4-40gb-x8", state)
    mock.split_seven_1g(env, 8)
    os.environ.update(env)

    kubelet = Kubelet(work / "kubelet.sock")
    kubelet.server.start()
    overrides = [
        Override("gpukit.kubeletDir", str(work), "bench"),
        Override("gpukit.metricsAddress", "", "bench"),
        Override("flags.migStrategy", "mixed", "bench"),
        Override("sharing.timeSlicing.resources",
                 [{"name": "nvidia.com/mig-1g.5gb", "replicas": REPLICAS}], "bench"),
    ]  # fmt: skip
    manager = PluginManager(
        ConfigSource(overrides=overrides),
        PynvmlBackend(env[mock.ENV_LIB]),
        options=ManagerOptions(tick=0.05, health=False),
    )
    t0 = time.perf_counter()
    manager.start()
    req = kubelet.requests.get(timeout=30)
    registered = time.perf_counter() - t0
    channel = grpc.insecure_channel(f"unix://{work / req.endpoint}")
    stub = deviceplugin_grpc.DevicePluginStub(channel)
    t0 = time.perf_counter()
    first = next(stub.ListAndWatch(pb.Empty(), timeout=60))
    law = time.perf_counter() - t0
    ids = [d.ID for d in first.devices]

    alloc: list[float] = []
    for i in range(CALLS):
        one = ids[i % len(ids)]
        t = time.perf_counter()
        stub.Allocate(pb.AllocateRequest(container_requests=[
            pb.ContainerAllocateRequest(devices_ids=[one])]), timeout=5)  # fmt: skip
        alloc.append((time.perf_counter() - t) * 1000)
    pref: list[float] = []
    for _ in range(CALLS // 5):
        t = time.perf_counter()
        stub.GetPreferredAllocation(pb.PreferredAllocationRequest(container_requests=[
            pb.ContainerPreferredAllocationRequest(available_deviceIDs=ids,
                                                   allocation_size=4)]), timeout=5)  # fmt: skip
        pref.append((time.perf_counter() - t) * 1000)
    t = time.perf_counter()
    manager.rescan()
    rescan = time.perf_counter() - t
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    manager.stop()
    kubelet.server.stop(0)

    a50, a99 = pct(alloc, 50), pct(alloc, 99)
    print(f"resource {req.resource_name}: {len(ids)} device IDs (8 GPUs x 7 MIG x {REPLICAS})")
    print(
        f"start to registered: {registered * 1000:.0f} ms"
        f" (target {TARGET_REGISTER_S:.0f} s, ratio {registered / TARGET_REGISTER_S:.3f})"
    )
    print(f"first ListAndWatch: {law * 1000:.1f} ms")
    print(
        f"Allocate: p50 {a50:.2f} ms, p99 {a99:.2f} ms"
        f" (target p99 {TARGET_ALLOCATE_P99_MS:.0f} ms, ratio {a99 / TARGET_ALLOCATE_P99_MS:.3f})"
    )
    print(
        f"GetPreferredAllocation(4 of {len(ids)}): p50 {pct(pref, 50):.2f} ms,"
        f" p99 {pct(pref, 99):.2f} ms"
    )
    print(f"rescan (NVML discovery + diff): {rescan * 1000:.1f} ms")
    print(f"peak RSS (plugin + this client): {rss:.0f} MiB")


if __name__ == "__main__":
    main()
