"""The node agent keeps serving when an older plugin for the same resource leaves.

Up to Kubernetes 1.35 the kubelet keeps one client per resource name. When a plugin's
ListAndWatch stream ends, it disconnects whichever client is current for that name, which is
the newer plugin when an older one for the same resource goes away after it registered
(kubernetes#121994: an agent pod replaced while the old one still runs). The newer plugin's
devices then stay unhealthy, 0 allocatable, until it registers again; the agent does that
once the kubelet has had no ListAndWatch stream open to it for `stream_grace_seconds`.

From 1.36 the kubelet tracks plugins by socket (kubernetes#135437): the older plugin's
departure deregisters only that plugin, and the agent's devices stay allocatable throughout.
The test asserts the behaviour of the kubelet the lab runs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from kubernetes import client
from labtools import wait_for

from gpukit.k8s import connect
from gpukit.lab import agent, nodes
from gpukit.lab.config import load_spec
from gpukit.lab.controlplane import paths
from gpukit.plugin.api import deviceplugin_grpc
from gpukit.plugin.api import deviceplugin_pb2 as pb
from gpukit.plugin.manager import ManagerOptions
from gpukit.plugin.server import register

pytestmark = pytest.mark.lab

NODE = "gpu-a100"
RESOURCE = "nvidia.com/gpu"
CONFIGS = {"default": {"version": "v1", "flags": {"migStrategy": "none"}}}
FIXED_MINOR = 36  # the first kubelet that tracks device plugins by socket
STREAM_GRACE_SECONDS = ManagerOptions().stream_grace_seconds  # the agent's default


def kubelet_minor(version: str) -> int:
    """v1.37.2 -> 37."""
    return int(version.lstrip("v").split(".")[1])


class OlderPlugin:
    """A plugin serving the same resource and devices, as an older agent instance would."""

    def __init__(self, ids: list[str]) -> None:
        self.ids = ids
        self.listed = threading.Event()
        self.leaving = threading.Event()

    def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
        return pb.DevicePluginOptions()

    def ListAndWatch(self, request: Any, context: Any) -> Iterator[Any]:
        self.listed.set()
        yield pb.ListAndWatchResponse(devices=[pb.Device(ID=i, health="Healthy")
                                               for i in self.ids])  # fmt: skip
        while context.is_active() and not self.leaving.wait(0.2):
            pass

    def GetPreferredAllocation(self, request: Any, context: Any) -> Any:
        return pb.PreferredAllocationResponse()

    def Allocate(self, request: Any, context: Any) -> Any:
        context.abort(grpc.StatusCode.UNAVAILABLE, "a test stand-in")

    def PreStartContainer(self, request: Any, context: Any) -> Any:
        return pb.PreStartContainerResponse()


def gpus(core: client.CoreV1Api) -> int | None:
    value = (core.read_node(NODE).status.allocatable or {}).get(RESOURCE)
    return None if value is None else int(value)


def diagnose() -> str:
    return agent.diagnose(load_spec(), NODE)


def test_the_agent_registers_again_after_an_older_plugin_leaves(lab_cluster: object) -> None:
    spec = load_spec()
    core = connect.core(paths().admin_kubeconfig)
    plugin_dir = nodes.root(spec.node(NODE)) / "var/lib/kubelet/device-plugins"
    older = OlderPlugin(nodes.gpu_uuids(spec.node(NODE)))
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    deviceplugin_grpc.add_DevicePluginServicer_to_server(older, server)
    sock = plugin_dir / "gpukit-test-older.sock"
    server.add_insecure_port(f"unix://{sock}")
    server.start()
    d = agent.lab_deployment(CONFIGS, default_config="default")
    try:
        # The older plugin is the kubelet's client for the resource, then the agent comes.
        register(str(plugin_dir / "kubelet.sock"), sock.name, RESOURCE)
        assert older.listed.wait(30), "the kubelet never listed the older plugin's devices"
        agent.apply(spec, d)
        agent.wait_rolled_out(spec, d, timeout=120)
        wait_for("the agent to serve", lambda: "registered nvidia.com/gpu" in agent_log(spec),
                 timeout=120, explain=diagnose)  # fmt: skip
        wait_for(f"{NODE}: 8 {RESOURCE}", lambda: gpus(core) == 8, timeout=60, explain=diagnose)

        kubelet = core.read_node(NODE).status.node_info.kubelet_version
        older.leaving.set()
        server.stop(0).wait()
        if kubelet_minor(kubelet) >= FIXED_MINOR:
            # The kubelet deregisters the older plugin only: 8 GPUs all along, beyond the
            # agent's grace period, and the agent has no reason to register again.
            deadline = time.monotonic() + STREAM_GRACE_SECONDS + 10
            while time.monotonic() < deadline:
                assert gpus(core) == 8, f"{NODE} ({kubelet}): {gpus(core)} {RESOURCE}"
                time.sleep(0.5)
            assert "registering again" not in agent_log(spec)
            return
        # The older plugin leaves: the kubelet disconnects the agent instead.
        wait_for("the kubelet to report the GPUs unhealthy", lambda: gpus(core) == 0, timeout=20,
                 explain=diagnose)
        t0 = time.monotonic()
        wait_for(f"{NODE}: 8 {RESOURCE} again", lambda: gpus(core) == 8, timeout=90,
                 explain=diagnose)
        took = time.monotonic() - t0
        assert "no ListAndWatch stream open for nvidia.com/gpu: registering again" in agent_log(
            spec)
        assert took < 60
    finally:
        older.leaving.set()
        server.stop(0)
        sock.unlink(missing_ok=True)
        agent.remove(spec, d)


def agent_log(spec: Any) -> str:
    return agent.agent_log(NODE)
