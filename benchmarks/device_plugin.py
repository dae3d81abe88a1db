"""Device plugin figures on the mock NVML (8x A100-40GB, every GPU split into 7x 1g.5gb,
each MIG device time-sliced 16 ways: 896 device IDs on one socket).

    .venv/bin/python benchmarks/device_plugin.py

Prints start-to-registered, first ListAndWatch, Allocate and GetPreferredAllocation
latency over the unix socket (p50/p99, with the ratio to the target), a rescan, and RSS.
The kubelet here is a stand-in that only answers Register: the figures are the plugin's own.

Then the agent as the node runs it (`python -m gpukit.plugin`, a fresh process each time, plain
8x A100 mock): start -> registered (p50 over STARTS starts, imports and NVML included),
re-registration after a simulated kubelet restart (the stand-in does what a starting kubelet
does: deletes everything in the device-plugins dir, then creates kubelet.sock; timed from
kubelet.sock serving to the agent's Register), and the idle agent's CPU over IDLE_WINDOW_S
(the scheduler's nanosecond run time of all its threads, /proc/PID/task/*/schedstat; a
ListAndWatch stream held open as the kubelet does). The agent runs with its bytecode cached
(as an installed package has it; one untimed start compiles it); the starts are also timed
without a bytecode cache (PYTHONDONTWRITEBYTECODE and no .pyc: every module compiled at every
start), which is how the agent image runs while it is built with --no-compile.
NVIDIA's device plugin is measured side by side when its binary is found (NVIDIA_PLUGIN or
PEER_CANDIDATES); otherwise the lines say the peer is absent and no ratio to it is printed.
"""

from __future__ import annotations

import os
import queue
import random
import resource
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
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
TARGET_PROCESS_REGISTER_S = 0.100  # fresh process, 8 GPUs
TARGET_REREGISTER_S = 0.5  # p50 after a kubelet restart
TARGET_IDLE_CPU_VS_PEER = 2.0
STARTS = 7
RESTARTS = 7
IDLE_WINDOW_S = 20.0
# NVIDIA's plugin as the peer lane builds it (gpukit/lab/scripts/build-nvidia-plugin.sh, from
# its Go module into the cache), or an installed one.
PEER_CANDIDATES = (
    str(Path(os.environ.get("GPUKIT_CACHE", Path.home() / ".cache" / "gpukit"))
        / "nvidia-device-plugin" / "v0.19.0" / "bin" / "nvidia-device-plugin"),
    "/usr/local/bin/nvidia-device-plugin", "/usr/bin/nvidia-device-plugin")
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


class StandInKubelet(Kubelet):
    """A kubelet that restarts like the real one: plugin sockets deleted, kubelet.sock new."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory / "kubelet.sock")
        self.directory = directory
        self.server.start()

    def restart(self) -> float:
        """Returns when the new kubelet.sock was created (perf_counter): the node is at 0 GPUs
        from then until the agent registers."""
        self.server.stop(0).wait()
        while not self.requests.empty():
            self.requests.get_nowait()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        deviceplugin_grpc.add_RegistrationServicer_to_server(self, server)
        for entry in self.directory.iterdir():  # kubelet: removeContents(pluginDir)
            if entry.is_dir():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        created = time.perf_counter()
        server.add_insecure_port(f"unix://{self.path}")  # binds: kubelet.sock exists
        server.start()
        self.server = server
        return created


def cpu_seconds(pid: int) -> float:
    """CPU time of all the process's live threads, in ns resolution (utime/stime in
    /proc/PID/stat count 10 ms ticks: too coarse for an idle process)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that ended meanwhile
    return total / 1e9


def hold_stream(directory: Path, endpoint: str) -> tuple[grpc.Channel, Any]:
    """Open ListAndWatch on the agent and keep it open, as the kubelet does."""
    channel = grpc.insecure_channel(f"unix://{directory / endpoint}")
    stream = deviceplugin_grpc.DevicePluginStub(channel).ListAndWatch(pb.Empty())
    next(stream)
    return channel, stream


def gpukit_command(directory: Path) -> list[str]:
    return [sys.executable, "-m", "gpukit.plugin", "--kubelet-dir", str(directory),
            "--metrics-address", "", "--pause-file", "", "--last-good-config", "",
            "--cdi-spec-dir", str(directory / "cdi"), "--log-level", "WARNING"]


def peer_command(directory: Path) -> list[str] | None:
    found = os.environ.get("NVIDIA_PLUGIN") or next(
        (c for c in PEER_CANDIDATES if os.access(c, os.X_OK)), None)
    if not found:
        return None
    # NVIDIA's plugin serves its sockets in the kubelet's fixed device-plugins directory (only
    # the kubelet's socket is a flag): a private mount namespace puts `directory` there, over a
    # tmpfs /var/lib that only the plugin sees.
    plugins = "/var/lib/kubelet/device-plugins"
    script = (f"mount -t tmpfs none /var/lib && mkdir -p {plugins}"
              f" && mount --bind {shlex.quote(str(directory))} {plugins} && exec \"$@\"")
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "peer",
            found, "--device-list-strategy", "envvar", "--fail-on-init-error=false",
            f"--kubelet-socket={directory / 'kubelet.sock'}"]


def agent_figures(name: str, command: Any, env: dict[str, str], starts_only: bool = False
                  ) -> dict[str, float]:
    """start -> registered (p50 of fresh processes), re-registration p50, idle CPU (ms/s)."""
    starts: list[float] = []
    start_cpu: list[float] = []
    rereg: list[float] = [0.0]
    idle = 0.0
    for i in range(STARTS):
        directory = Path(tempfile.mkdtemp(prefix="gk-dp-", dir="/tmp"))
        kubelet = StandInKubelet(directory)
        t0 = time.perf_counter()
        proc = subprocess.Popen(command(directory), env=env, cwd=directory,  # PYTHONPATH decides
                                stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        try:
            try:
                req = kubelet.requests.get(timeout=60)
            except queue.Empty:
                proc.kill()
                raise SystemExit(
                    f"{name} never registered: {proc.communicate()[1][-2000:]}") from None
            starts.append(time.perf_counter() - t0)
            start_cpu.append(cpu_seconds(proc.pid))
            if i == 0 and not starts_only:  # restarts and the idle window on the first one
                time.sleep(1.0)  # settled
                phases = random.Random(31)
                rereg.clear()
                for _ in range(RESTARTS):
                    # at a random phase of any polling loop (a fixed pause locks onto it)
                    time.sleep(phases.uniform(0.5, 1.5))
                    t = kubelet.restart()
                    req = kubelet.requests.get(timeout=60)
                    rereg.append(time.perf_counter() - t)
                channel, stream = hold_stream(directory, req.endpoint)
                time.sleep(2.0)
                before = cpu_seconds(proc.pid)
                time.sleep(IDLE_WINDOW_S)
                idle = (cpu_seconds(proc.pid) - before) / IDLE_WINDOW_S * 1000
                stream.cancel()
                channel.close()
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            kubelet.server.stop(0).wait()
            shutil.rmtree(directory, ignore_errors=True)
    return {"start": statistics.median(starts), "start_max": max(starts),
            "start_cpu": statistics.median(start_cpu),
            "rereg": statistics.median(rereg), "rereg_max": max(rereg), "idle": idle}


def node_agent() -> None:
    state = Path(tempfile.mkdtemp(prefix="gpukit-bench-nvml-"))
    env = mock.env("a100-sxm4-40gb-x8", state)
    env.setdefault("PYTHONPATH", str(Path(__file__).resolve().parent.parent))
    cold = dict(env, PYTHONDONTWRITEBYTECODE="1")
    cold.pop("PYTHONPYCACHEPREFIX", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(state / "pycache")  # .pyc as an installed package has
    subprocess.run([sys.executable, "-c", "import gpukit.plugin.cli"], env=env, check=True)
    ours = agent_figures("gpukit", gpukit_command, env)
    uncached = agent_figures("gpukit", gpukit_command, cold, starts_only=True)
    print(f"node agent at 8 GPUs (fresh processes: {STARTS} starts, {RESTARTS} kubelet restarts,"
          f" idle over {IDLE_WINDOW_S:.0f} s with a ListAndWatch stream open)")
    print(f"  gpukit start to registered: p50 {ours['start'] * 1000:.0f} ms,"
          f" max {ours['start_max'] * 1000:.0f} ms (target {TARGET_PROCESS_REGISTER_S * 1000:.0f}"
          f" ms, ratio {ours['start'] / TARGET_PROCESS_REGISTER_S:.2f})")
    print(f"  gpukit CPU spent by then (user+system, all threads; what a loaded host cannot"
          f" hide): p50 {ours['start_cpu'] * 1000:.0f} ms"
          f" (ratio to the start target {ours['start_cpu'] / TARGET_PROCESS_REGISTER_S:.2f})")
    print(f"  gpukit start to registered without a bytecode cache: p50"
          f" {uncached['start'] * 1000:.0f} ms, max {uncached['start_max'] * 1000:.0f} ms,"
          f" CPU p50 {uncached['start_cpu'] * 1000:.0f} ms"
          f" (ratio to target {uncached['start'] / TARGET_PROCESS_REGISTER_S:.2f})")
    print(f"  gpukit re-registration after a kubelet restart: p50 {ours['rereg'] * 1000:.0f} ms,"
          f" max {ours['rereg_max'] * 1000:.0f} ms (target {TARGET_REREGISTER_S * 1000:.0f} ms,"
          f" ratio {ours['rereg'] / TARGET_REREGISTER_S:.2f})")
    print(f"  gpukit idle CPU: {ours['idle']:.2f} ms per s")
    peer = peer_command(Path("/"))
    if peer is None:
        print("  NVIDIA device plugin: absent on this machine (no binary at NVIDIA_PLUGIN or "
              f"{', '.join(PEER_CANDIDATES)}): no ratio to NVIDIA's; the idle CPU target"
              f" ({TARGET_IDLE_CPU_VS_PEER:.0f}x NVIDIA's) is not computed")
        return
    theirs = agent_figures("NVIDIA", peer_command, env)
    print(f"  NVIDIA start to registered: p50 {theirs['start'] * 1000:.0f} ms"
          f" (gpukit/NVIDIA {ours['start'] / theirs['start']:.2f}), CPU by then p50"
          f" {theirs['start_cpu'] * 1000:.0f} ms"
          f" (gpukit/NVIDIA {ours['start_cpu'] / max(theirs['start_cpu'], 1e-6):.2f})")
    print(f"  NVIDIA re-registration: p50 {theirs['rereg'] * 1000:.0f} ms"
          f" (gpukit/NVIDIA {ours['rereg'] / theirs['rereg']:.2f})")
    ratio = ours["idle"] / max(theirs["idle"], 1e-3)
    print(f"  NVIDIA idle CPU: {theirs['idle']:.2f} ms per s (gpukit/NVIDIA {ratio:.2f}, target"
          f" {TARGET_IDLE_CPU_VS_PEER:.0f}, ratio {ratio / TARGET_IDLE_CPU_VS_PEER:.2f})")


if __name__ == "__main__":
    main()
    node_agent()
