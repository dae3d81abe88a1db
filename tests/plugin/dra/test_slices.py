"""The node's pool: generations bumped on change only, stale slices deleted, wiped ones back."""

from __future__ import annotations

from typing import Any

from dra_testlib import FakeResourceApi

from gpukit.plugin.dra.slices import MAX_DEVICES_PER_SLICE, SlicePublisher, desired_slices


def dev(name: str) -> dict[str, Any]:
    return {"name": name, "attributes": {"type": {"string": "gpu"}},
            "capacity": {"memory": {"value": "40Gi"}}}


def test_publish_bumps_the_generation_only_on_change_and_deletes_stale_slices() -> None:
    api = FakeResourceApi()
    stale = desired_slices("n1", [dev("gpu-9")], 4)[0]
    stale["metadata"]["name"] = "n1-gpu.nvidia.com-old"
    api._store(stale)
    api._store(desired_slices("n2", [dev("gpu-0")], 1)[0])  # another node's: not ours
    pub = SlicePublisher(None, "n1", api=api)
    assert pub.sync([dev("gpu-0"), dev("gpu-1")]) is True
    assert sorted(api.slices) == ["n1-gpu.nvidia.com-0", "n2-gpu.nvidia.com-0"]
    mine = api.slices["n1-gpu.nvidia.com-0"]["spec"]
    assert mine["pool"] == {"name": "n1", "generation": 5, "resourceSliceCount": 1}
    assert [d["name"] for d in mine["devices"]] == ["gpu-0", "gpu-1"]
    writes = api.writes
    assert pub.sync([dev("gpu-0"), dev("gpu-1")]) is False and api.writes == writes
    pub.sync([dev("gpu-0")])
    assert api.slices["n1-gpu.nvidia.com-0"]["spec"]["pool"]["generation"] == 6
    del api.slices["n1-gpu.nvidia.com-0"]  # the kubelet wiped it
    pub.sync([dev("gpu-0")])
    assert api.slices["n1-gpu.nvidia.com-0"]["spec"]["pool"]["generation"] == 7


def test_many_devices_split_into_slices_of_one_pool() -> None:
    devices = [dev(f"gpu-{i}") for i in range(MAX_DEVICES_PER_SLICE + 1)]
    slices = desired_slices("n1", devices, 3)
    assert [len(s["spec"]["devices"]) for s in slices] == [MAX_DEVICES_PER_SLICE, 1]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {2}


def test_a_taint_is_a_change_and_splits_slices_at_the_apis_64() -> None:
    """The API allows 64 devices per slice once one has taints; a taint, its removal, or a
    device turning shared is a change to publish; the API's timeAdded is not."""
    devices = [dev(f"gpu-{i}") for i in range(65)]
    devices[3] = {**devices[3], "taints": [{"key": "gpu.nvidia.com/xid", "value": "79",
                                            "effect": "NoSchedule"}]}
    assert [len(s["spec"]["devices"]) for s in desired_slices("n1", devices, 1)] == [64, 1]
    api = FakeResourceApi()
    pub = SlicePublisher(None, "n1", api=api)
    pub.sync([dev("gpu-0")])
    tainted = {**dev("gpu-0"), "taints": [{"key": "gpu.nvidia.com/gpu-lost",
                                           "effect": "NoSchedule"}]}
    assert pub.sync([tainted]) is True
    api.slices["n1-gpu.nvidia.com-0"]["spec"]["devices"][0]["taints"][0]["timeAdded"] = \
        "2026-11-28T17:00:00Z"  # as the API fills it in
    assert pub.sync([tainted]) is False
    assert pub.sync([dev("gpu-0")]) is True  # recovered: the taint goes
    assert pub.sync([{**dev("gpu-0"), "allowMultipleAllocations": True}]) is True
