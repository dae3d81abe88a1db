"""GetPreferredAllocation: topology for whole GPUs, distributed/packed for replicas."""

from __future__ import annotations

from plugin_testlib import T4, cfg, dgx_links, gpu_uuid, make_gpu, make_inventory, mig_uuid

from gpukit.plugin.inventory import Inventory
from gpukit.plugin.preferred import preferred
from gpukit.plugin.resources import Resource, build_resources


def setup(n: int = 8, doc: dict[str, object] | None = None, name: str = "nvidia.com/gpu"
          ) -> tuple[Resource, Inventory]:
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
