"""Helpers the lab's test modules share: bounded polling, the agent's HTTP endpoint on a node,
and NVML calls against a node's mock GPUs (MIG mode and instances on GPU 0)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest

from gpukit.lab import network, nodes
from gpukit.lab.config import load_spec


def wait_for(what: str, check: Callable[[], Any], timeout: float = 60, every: float = 0.5,
             explain: Callable[[], str] | None = None) -> Any:
    """Poll `check` until it returns something truthy (bounded); on timeout, fail with
    `explain()` appended."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(every)
    more = f"\n{explain()}" if explain else ""
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r}){more}")


HTTP_GET = """
import sys, urllib.error, urllib.request
try:
    r = urllib.request.urlopen("http://127.0.0.1:9402" + sys.argv[1], timeout=5)
    print(r.status, r.read().decode())
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode())
except OSError as e:  # not listening (yet)
    print(0, e)
"""


def agent_http(node: str, path: str) -> tuple[int, str]:
    """GET the agent's HTTP endpoint on `node` (loopback in the node's network namespace,
    which the agent's hostNetwork pod shares): (status, body); status 0 when nothing answers."""
    spec = load_spec()
    r = subprocess.run(
        ["nsenter", f"--net={network.netns_path(spec.node(node), spec)}", sys.executable, "-c",
         HTTP_GET, path], capture_output=True, text=True, check=True,
    )  # fmt: skip
    status, _, body = r.stdout.partition(" ")
    return int(status), body


# MIG mode on GPU 0 (argv[1]: create or destroy; pending until the GPU is reset).
MIG_MODE = """
import sys, pynvml as n
n.nvmlInit()
n.nvmlDeviceSetMigMode(n.nvmlDeviceGetHandleByIndex(0), 1 if sys.argv[1] == "create" else 0)
"""

# Two 3g GPU instances, each with its compute instance, on GPU 0 (MIG mode on).
MIG_CREATE = """
import pynvml as n
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
info = n.nvmlDeviceGetGpuInstanceProfileInfo(h, n.NVML_GPU_INSTANCE_PROFILE_3_SLICE)
for _ in range(2):
    gi = n.nvmlDeviceCreateGpuInstance(h, info.id)
    ci = n.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, n.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE, 0)
    n.nvmlGpuInstanceCreateComputeInstance(gi, ci.id)
"""


def node_pynvml(node: str, code: str, *args: str) -> None:
    """Run `code` with pynvml against `node`'s mock GPUs (its profile and device state)."""
    from gpukit.lab import nvml

    root = nodes.root(load_spec().node(node))
    env = nvml.env(root / "etc/gpukit-lab/nvml/profile.yaml", root / "var/lib/gpukit-lab/nvml")
    subprocess.run([sys.executable, "-c", code, *args], env=env, check=True)
