"""GetPreferredAllocation: topology for whole GPUs (NVLink pairs, NVSwitch nodes from the mock
NVML), distributed/packed for replicas."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from plugin_testlib import T4, cfg, dgx_links, gpu_uuid, make_gpu, make_inventory, mig_uuid

from gpukit.plugin import nvml
from gpukit.plugin.devices import TOPOLOGY_NODE, TOPOLOGY_SINGLE, TOPOLOGY_SYSTEM, NodeDevices
from gpukit.plugin.preferred import preferred
from gpukit.plugin.resources import Resource, build_resources


def setup(n: int = 8, doc: dict[str, object] | None = None, name: str = "nvidia.com/gpu"
          ) -> tuple[Resource, NodeDevices]:
    inv = make_inventory([make_gpu(i, numa=0 if i < 4 else 1) for i in range(n)], dgx_links(n))
    return build_resources(inv, cfg(doc)).resources[name], inv


def g(*idx: int) -> list[str]:
    return [gpu_uuid(i) for i in idx]


def test_pair_prefers_nvlink() -> None:
    res, inv = setup()
    assert preferred(res, inv, g(0, 2, 4, 6, 7), [], 2) == g(6, 7)


def test_four_gpus_stay_on_one_socket() -> None:
    res, inv = setup()
    got = preferred(res, inv, g(*range(8)), [], 4)
    assert sorted(got) == g(0, 1, 2, 3)


def test_must_include_is_honoured() -> None:
    res, inv = setup()
    assert preferred(res, inv, g(*range(8)), g(5), 2) == g(5, 4)


def test_numa_without_topology() -> None:
    inv = make_inventory([make_gpu(i, numa=i % 2) for i in range(4)])
    res = build_resources(inv, cfg()).resources["nvidia.com/gpu"]
    assert preferred(res, inv, g(0, 1, 2, 3), g(1), 2) == g(1, 3)


def test_never_fails_and_never_invents() -> None:
    res, inv = setup(4)
    assert preferred(res, inv, [*g(0, 1), "GPU-unknown"], [], 5) == g(0, 1)
    assert preferred(res, inv, g(0, 1, 2), g(2, 1), 1) == g(2)


def test_greedy_for_large_searches() -> None:
    res, inv = setup(16)
    got = preferred(res, inv, g(*range(16)), [], 8)
    assert len(set(got)) == 8


def test_replicas_distributed() -> None:
    doc = {"sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 4}]}}}
    inv = make_inventory([make_gpu(i, T4) for i in range(2)])
    res = build_resources(inv, cfg(doc)).resources["nvidia.com/gpu"]
    all_ids = [d.id for d in res.devices]
    got = preferred(res, inv, all_ids, [], 2)
    assert {i.split("::")[0] for i in got} == set(g(0, 1))
    # GPU 0 already has 3 replicas in use: the next ones go to GPU 1
    avail = [f"{gpu_uuid(0)}::3"] + [f"{gpu_uuid(1)}::{n}" for n in range(4)]
    assert [i.split("::")[0] for i in preferred(res, inv, avail, [], 2)] == g(1, 1)


def test_replicas_packed() -> None:
    doc = {"sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 4}]}}}
    inv = make_inventory([make_gpu(i, T4) for i in range(2)])
    res = build_resources(inv, cfg(doc)).resources["nvidia.com/gpu"]
    avail = [f"{gpu_uuid(0)}::3"] + [f"{gpu_uuid(1)}::{n}" for n in range(4)]
    got = preferred(res, inv, avail, [], 2, policy="packed")
    assert [i.split("::")[0] for i in got] == g(0, 1)


def test_mig_devices_fill_parents_in_order() -> None:
    inv = make_inventory([make_gpu(i, migs=("1g.5gb",) * 3) for i in range(2)])
    res = build_resources(inv, cfg({"flags": {"migStrategy": "mixed"}})).resources[
        "nvidia.com/mig-1g.5gb"]
    avail = [mig_uuid(1, 0), mig_uuid(0, 2), mig_uuid(1, 1), mig_uuid(0, 1)]
    assert preferred(res, inv, avail, [], 2) == [mig_uuid(0, 1), mig_uuid(0, 2)]


# ---- NVSwitch nodes, discovered from the lab's mock NVML ----

NVSWITCH_LINKS = {"a100-sxm4-40gb-x8": 12, "h100-80gb-x8": 18}


def discover_mock(profile: str, state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> NodeDevices:
    """gpukit's discovery against the mock NVML serving this node profile (built if needed)."""
    from gpukit.lab import nvml as mock

    lib = mock.build()
    env = mock.env(profile, state_dir, library=lib)
    for key in (mock.ENV_PROFILE, mock.ENV_STATE_DIR, mock.ENV_LIB):
        monkeypatch.setenv(key, env[key])
    monkeypatch.delenv(mock.ENV_SEED, raising=False)
    mock.load_mock(lib)
    nvml.init()
    try:
        return nvml.discover()
    finally:
        nvml.shutdown()


@pytest.fixture(params=sorted(NVSWITCH_LINKS))
def switch_node(request: pytest.FixtureRequest, tmp_path: Path,
                monkeypatch: pytest.MonkeyPatch) -> tuple[str, Resource, NodeDevices]:
    inv = discover_mock(request.param, tmp_path / "nvml", monkeypatch)
    return request.param, build_resources(inv, cfg()).resources["nvidia.com/gpu"], inv


def uuids(inv: NodeDevices, *idx: int) -> list[str]:
    return [inv.gpus[i].uuid for i in idx]


@pytest.mark.nvml
def test_nvswitch_gpus_are_equally_linked(switch_node: tuple[str, Resource, NodeDevices]) -> None:
    """Every pair counts the links it has through the switches (NV12 / NV18, as nvidia-smi
    topo -m shows them); the PCIe ancestor stays what PCIe says."""
    profile, _, inv = switch_node
    pairs = list(itertools.combinations(inv.gpus, 2))
    assert len(pairs) == 28
    assert {inv.link(a.uuid, b.uuid).nvlinks for a, b in pairs} == {NVSWITCH_LINKS[profile]}
    g0, g1, g2, g4 = (inv.gpus[i].uuid for i in (0, 1, 2, 4))
    assert inv.link(g0, g1).ancestor == TOPOLOGY_SINGLE
    assert inv.link(g0, g2).ancestor == TOPOLOGY_NODE
    assert inv.link(g0, g4).ancestor == TOPOLOGY_SYSTEM


@pytest.mark.nvml
def test_allocation_on_an_nvswitch_node_follows_pcie_and_numa(
    switch_node: tuple[str, Resource, NodeDevices],
) -> None:
    """With NVLink equal for all pairs, PCIe distance and the socket decide: a pair behind one
    PCIe switch, four GPUs on one socket, never a cross-socket pick while the socket has room."""
    _, res, inv = switch_node
    every = uuids(inv, *range(8))
    assert preferred(res, inv, every, [], 2) == uuids(inv, 0, 1)
    assert sorted(preferred(res, inv, every, [], 4)) == sorted(uuids(inv, 0, 1, 2, 3))
    assert preferred(res, inv, uuids(inv, 0, 2, 5, 6, 7), uuids(inv, 5), 2) == uuids(inv, 5, 6)
    # GPU 4 is the only one left on socket 1: GPU 1's partner comes from socket 0.
    assert preferred(res, inv, uuids(inv, 1, 3, 4), uuids(inv, 1), 2) == uuids(inv, 1, 3)
    got = preferred(res, inv, every, [], 8)
    assert sorted(got) == sorted(every)


@pytest.mark.nvml
def test_pair_node_counts_only_direct_links(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """HGX-2-like x16 keeps GPU-to-GPU pairs: 12 links within a pair, none across."""
    inv = discover_mock("a100-sxm4-40gb-x16", tmp_path / "nvml", monkeypatch)
    a, b, c = uuids(inv, 0, 1, 2)
    assert (inv.link(a, b).nvlinks, inv.link(a, c).nvlinks) == (12, 0)
    res = build_resources(inv, cfg()).resources["nvidia.com/gpu"]
    assert preferred(res, inv, uuids(inv, 0, 2, 4, 14, 15), [], 2) == uuids(inv, 14, 15)
