"""Factories for the device plugin tests: hand-made inventories (no NVML needed)."""

from __future__ import annotations

import queue
import subprocess
import threading
from collections.abc import Callable
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from gpukit.contracts.plugin_config import Config, parse_config
from gpukit.plugin.api import deviceplugin_grpc
from gpukit.plugin.api import deviceplugin_pb2 as pb
from gpukit.plugin.devices import (
    TOPOLOGY_NODE,
    TOPOLOGY_SINGLE,
    TOPOLOGY_SYSTEM,
    Gpu,
    Link,
    MigDevice,
    NodeDevices,
)

A100 = "NVIDIA A100-SXM4-40GB"
T4 = "Tesla T4"
MIG_SHAPES = {  # profile -> (memory MB, SMs, gi slices)
    "1g.5gb": (4864, 14, 1),
    "2g.10gb": (9856, 28, 2),
    "3g.20gb": (19968, 42, 3),
    "7g.40gb": (40192, 98, 7),
}


def gpu_uuid(i: int) -> str:
    return f"GPU-{i:08x}-1111-2222-3333-444444444444"


def mig_uuid(i: int, j: int) -> str:
    return f"MIG-{i:08x}-{j:04x}-2222-3333-444444444444"


def make_gpu(index: int, name: str = A100, migs: tuple[str, ...] | None = None,
             numa: int | None = 0) -> Gpu:
    devices = []
    for j, profile in enumerate(migs or ()):
        mem, sms, g = MIG_SHAPES[profile]
        devices.append(MigDevice(
            uuid=mig_uuid(index, j), parent_uuid=gpu_uuid(index), parent_index=index, index=j,
            gi=j + 1, ci=0, profile=profile, memory_mb=mem, multiprocessors=sms, slices_gi=g,
            slices_ci=g, engines_copy=g, engines_decoder=0, engines_encoder=0, engines_jpeg=0,
            engines_ofa=0,
        ))
    is_a100 = name == A100
    return Gpu(
        index=index, uuid=gpu_uuid(index), minor=index, name=name,
        memory_mb=40960 if is_a100 else 15360, pci_bus_id=f"0000:{index + 7:02x}:00.0",
        numa_node=numa, compute_major=8 if is_a100 else 7, compute_minor=0 if is_a100 else 5,
        architecture="ampere" if is_a100 else "turing", mig_capable=is_a100,
        mig_enabled=migs is not None, mig_devices=tuple(devices),
    )


def make_inventory(gpus: list[Gpu], links: dict[frozenset[str], Link] | None = None
                   ) -> NodeDevices:
    return NodeDevices(gpus=tuple(gpus), driver_version="550.54.15", cuda_driver_version=12040,
                     links=links or {})


def dgx_links(n: int = 8) -> dict[frozenset[str], Link]:
    """GPUs 0-3 on NUMA 0 and 4-7 on NUMA 1; NVLink pairs (0,1), (2,3), (4,5), (6,7) with 2
    links each, plus one link between 1 and 2; same PCIe switch for pairs."""
    links: dict[frozenset[str], Link] = {}
    for a in range(n):
        for b in range(a + 1, n):
            same_numa = (a < 4) == (b < 4)
            ancestor = TOPOLOGY_NODE if same_numa else TOPOLOGY_SYSTEM
            nv = 0
            if b == a + 1 and a % 2 == 0:
                nv, ancestor = 2, TOPOLOGY_SINGLE
            if (a, b) == (1, 2):
                nv = 1
            links[frozenset((gpu_uuid(a), gpu_uuid(b)))] = Link(nvlinks=nv, ancestor=ancestor)
    return links


def cfg(doc: dict[str, Any] | None = None) -> Config:
    return parse_config(doc or {})


class FakeKubelet:
    """Implements only Registration.Register, recording every request."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / "kubelet.sock"
        self.requests: queue.Queue[Any] = queue.Queue()
        self.server: Any = None

    def Register(self, request: Any, context: Any) -> Any:
        self.requests.put(request)
        return pb.Empty()

    def start(self) -> None:
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        deviceplugin_grpc.add_RegistrationServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"unix://{self.path}")
        self.server.start()

    def stop(self) -> None:
        self.server.stop(0).wait()
        self.path.unlink(missing_ok=True)

    def next_request(self, timeout: float = 10) -> Any:
        return self.requests.get(timeout=timeout)


class FakeBackend:
    def __init__(self, inv: NodeDevices) -> None:
        self.inv = inv

    def init(self) -> None:
        pass

    def discover(self, with_topology: bool) -> NodeDevices:
        return self.inv

    def shutdown(self) -> None:
        pass


def dial(path: str) -> tuple[Any, Any]:
    channel = grpc.insecure_channel(f"unix://{path}")
    return channel, deviceplugin_grpc.DevicePluginStub(channel)


class FakeNode:
    """Stands in for the Kubernetes API: one node's labels, the Events recorded on it, and a
    watch of its labels driven by the test (`touch` edits as a person would)."""

    def __init__(self, labels: dict[str, str]) -> None:
        self.labels_now = labels
        self.patches: list[dict[str, str | None]] = []
        self.events: list[tuple[str, str, str]] = []  # (reason, message, type)
        self.conditions: list[dict[str, Any]] = []  # every condition set, in order
        self._seen: Callable[[dict[str, str]], None] | None = None

    def labels(self, node: str) -> dict[str, str]:
        return dict(self.labels_now)

    def patch_labels(self, node: str, changes: dict[str, str | None]) -> None:
        self.patches.append(dict(changes))
        for k, v in changes.items():
            if v is None:
                self.labels_now.pop(k, None)
            else:
                self.labels_now[k] = v

    def event(self, node: str, reason: str, message: str, type_: str = "Warning") -> None:
        self.events.append((reason, message, type_))

    def set_condition(self, node: str, condition: dict[str, Any]) -> None:
        self.conditions.append(dict(condition))

    def watch_labels(self, node: str, seen: Callable[[dict[str, str]], None],
                     stop: threading.Event) -> None:
        self._seen = seen
        stop.wait()

    def touch(self, changes: dict[str, str | None]) -> None:
        """Someone else edits the node; the watch tells the agent."""
        for k, v in changes.items():
            if v is None:
                self.labels_now.pop(k, None)
            else:
                self.labels_now[k] = v
        if self._seen is not None:
            self._seen(dict(self.labels_now))


class ScriptedMpsControl:
    """Stands in for nvidia-cuda-mps-control: daemons per pipe directory, commands logged."""

    def __init__(self) -> None:
        self.daemons: dict[str, dict[str, str]] = {}  # pipe dir -> settings
        self.visible: dict[str, str] = {}  # pipe dir -> CUDA_VISIBLE_DEVICES at start
        self.calls: list[tuple[str, str]] = []
        self.fail_start = False
        self.fail_command = ""

    def __call__(self, argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        pipe = kw["env"]["CUDA_MPS_PIPE_DIRECTORY"]
        if argv[1:] == ["-d"]:
            self.calls.append((pipe, "-d"))
            if self.fail_start or pipe in self.daemons:
                return subprocess.CompletedProcess(argv, 1, "", "cannot start")
            self.daemons[pipe] = {}
            self.visible[pipe] = kw["env"]["CUDA_VISIBLE_DEVICES"]
            return subprocess.CompletedProcess(argv, 0, "", "")
        line = kw["input"].strip()
        self.calls.append((pipe, line))
        if pipe not in self.daemons:
            return subprocess.CompletedProcess(argv, 1, "", "Cannot find MPS control daemon")
        words = line.split()
        if self.fail_command and words[0] == self.fail_command:
            return subprocess.CompletedProcess(argv, 1, "", "refused")
        if words[0] == "quit":
            del self.daemons[pipe]
        elif words[0].startswith("set_default"):
            self.daemons[pipe][words[0]] = " ".join(words[1:])
        return subprocess.CompletedProcess(argv, 0, "100\n", "")
