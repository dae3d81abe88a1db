"""MPS: every GPU a node shares through MPS has its daemon (the GPU in EXCLUSIVE_PROCESS
compute mode, as NVIDIA's mps-control-daemon and gpukit's set it) and no other GPU does; every
container holding an MPS replica is that daemon's client (its pipe directory with the daemon's
control endpoint) with its replica's memory limit and thread share, and no other container is.
How many replicas run on each GPU at once is the time-slicing area's spread check (it covers
every shared resource)."""

from __future__ import annotations

from typing import Any

import pytest

from gpukit.conformance import expect
from gpukit.conformance.checks import Check
from gpukit.conformance.common import allocated_units, need_decl, need_probe

pytestmark = pytest.mark.mps

EXCLUSIVE = "EXCLUSIVE_PROCESS"


@pytest.mark.stages("probe")
def test_a_daemon_serves_every_mps_gpu_and_no_other(gpukit_suite: Any, node: str,
                                                     check: Check) -> None:
    """The GPUs in EXCLUSIVE_PROCESS compute mode are exactly those the declaration shares
    through MPS (none on a node that does not)."""
    decl = need_decl(gpukit_suite, node)
    probe = need_probe(gpukit_suite, node)
    check.equal("GPUs in EXCLUSIVE_PROCESS compute mode (MPS daemons)",
                expect.mps_gpu_indexes(decl),
                sorted(g.index for g in probe.readable if g.compute_mode == EXCLUSIVE))
    check.verify()


@pytest.mark.stages("fill", "probe")
@pytest.mark.per_resource("all")
def test_mps_clients_get_their_daemon_and_limits(gpukit_suite: Any, node: str, resource: str,
                                                 check: Check) -> None:
    """Each filler of an MPS-shared resource has CUDA_MPS_PIPE_DIRECTORY with its daemon's
    control endpoint, the pinned memory limit of its GPU's memory over the replicas and the
    thread percentage 100 / replicas; a filler of any other resource has no MPS settings."""
    decl = need_decl(gpukit_suite, node)
    probe = need_probe(gpukit_suite, node)
    share = expect.mps_share(decl, resource)
    running = gpukit_suite.fill(node).running(resource)
    if not running:
        check.record("filler pods Running", "at least one", 0, False, resource)
        check.verify()
    for s in running:
        if share is None:
            check.equal(f"pod {s.pod}: MPS settings", {}, s.mps, resource)
            continue
        check.equal(f"pod {s.pod}: MPS daemon's control endpoint in its pipe directory",
                    "control", s.mps.get("endpoint", "no CUDA_MPS_PIPE_DIRECTORY"), resource)
        gpus = {g.uuid: g for d in allocated_units(s, probe)
                if (g := probe.parent(d)) is not None}
        if len(gpus) != 1:
            check.record(f"pod {s.pod}: GPUs of its replicas", "one", sorted(gpus), False,
                         resource)
            continue
        (gpu,) = gpus.values()
        check.equal(f"pod {s.pod}: CUDA_MPS_PINNED_DEVICE_MEM_LIMIT (GPU {gpu.index})",
                    share.memory_limit(gpu.memory_mib), s.mps.get("memory_limit"), resource)
        check.equal(f"pod {s.pod}: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
                    share.thread_percentage, s.mps.get("thread_percentage"), resource)
    check.verify()
