"""Dynamic MIG publishing (KEP-4815 partitionable devices): a dynamic GPU's counter set, every
allowed profile x placement consuming its figures and memory slices, the whole GPU consuming
all of it; counter sets in slices of their own, consuming devices at most 64 to a slice; a
static MIG layout on another GPU of the node published as before, and the MIG manager's list
of dynamic GPUs written beside the checkpoint."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from dra_testlib import FakeResourceApi
from plugin_testlib import make_gpu, make_inventory

from gpukit.contracts import dra_dynamic_mig as contract
from gpukit.contracts import mig_profiles
from gpukit.plugin.dra.dynamic_mig import publish_gpu
from gpukit.plugin.dra.slices import desired_slices

A100 = mig_profiles.for_product("NVIDIA A100-SXM4-40GB")


def _counters(entry: dict[str, Any]) -> dict[str, str]:
    return {k: v["value"] for k, v in entry["counters"].items()}


def test_the_counter_set_holds_the_gpus_figures_and_one_counter_per_memory_slice() -> None:
    gpu = make_gpu(2)
    cset, _ = publish_gpu(gpu, make_inventory([gpu]), ["1g.5gb"])
    assert cset["name"] == "gpu-2-counter-set"
    assert _counters(cset) == {
        "multiprocessors": "98", "copy-engines": "7", "decoders": "5", "encoders": "0",
        "jpeg-engines": "1", "ofa-engines": "1", "memory": "40192Mi",
        **{f"memory-slice-{i}": "1" for i in range(8)}}
    assert len(cset["counters"]) <= contract.MAX_COUNTERS_PER_SET


def test_every_allowed_profile_and_placement_is_a_device_consuming_its_slices() -> None:
    gpu = make_gpu(0)
    _, devices = publish_gpu(gpu, make_inventory([gpu]), ["1g.10gb", "3g.20gb"])
    names = [d.name for d in devices]
    assert names == ["gpu-0", "gpu-0-mig-1g10gb-15-0", "gpu-0-mig-1g10gb-15-2",
                     "gpu-0-mig-1g10gb-15-4", "gpu-0-mig-1g10gb-15-6",
                     "gpu-0-mig-3g20gb-9-0", "gpu-0-mig-3g20gb-9-4"]
    by = {d.name: d for d in devices}
    mig = by["gpu-0-mig-3g20gb-9-4"]
    attrs = {k: next(iter(v.values())) for k, v in mig.body["attributes"].items()}
    assert {k: attrs[k] for k in ("type", "profile", "parentUUID", "parentIndex",
                                  "placementStart", "placementSize", "productName",
                                  "resource.kubernetes.io/pciBusID")} == {
        "type": "mig", "profile": "3g.20gb", "parentUUID": gpu.uuid, "parentIndex": 0,
        "placementStart": 4, "placementSize": 4, "productName": gpu.name,
        "resource.kubernetes.io/pciBusID": gpu.pci_bus_id}
    assert "uuid" not in attrs  # none until prepare carves it
    [consumed] = mig.body["consumesCounters"]
    assert consumed["counterSet"] == "gpu-0-counter-set"
    assert _counters(consumed) == {
        "multiprocessors": "42", "copy-engines": "3", "decoders": "2", "encoders": "0",
        "jpeg-engines": "0", "ofa-engines": "0", "memory": "19968Mi",
        **{f"memory-slice-{i}": "1" for i in range(4, 8)}}
    assert mig.carve is not None and (mig.carve.start, mig.carve.size) == (4, 4)
    assert mig.body["capacity"]["memorySlice7"] == {"value": "1"}
    whole = by["gpu-0"]
    assert whole.carve is None
    assert whole.body["attributes"]["type"] == {"string": "gpu"}
    assert whole.body["attributes"]["uuid"] == {"string": gpu.uuid}
    cset, _ = publish_gpu(gpu, make_inventory([gpu]), ["1g.10gb"])
    assert whole.body["consumesCounters"] == [{"counterSet": cset["name"],
                                               "counters": cset["counters"]}]


def test_all_profiles_and_an_unknown_profile() -> None:
    gpu = make_gpu(0)
    _, devices = publish_gpu(gpu, make_inventory([gpu]), ["all"])
    assert A100 is not None
    assert len(devices) == 1 + sum(len(p.placements) for p in A100.gpu_instance_profiles)
    with pytest.raises(KeyError, match=r"9g\.99gb"):
        publish_gpu(gpu, make_inventory([gpu]), ["9g.99gb"])


def test_counter_sets_get_slices_of_their_own_and_consuming_devices_64_to_a_slice() -> None:
    gpus = [make_gpu(i) for i in range(3)]
    node = make_inventory(gpus)
    sets, bodies = [], []
    for g in gpus:
        cset, devices = publish_gpu(g, node, ["all"])
        sets.append(cset)
        bodies += [d.body for d in devices]
    slices = desired_slices("n1", bodies, 3, sets)
    assert [("sharedCounters" in s["spec"], "devices" in s["spec"]) for s in slices[:3]] == \
        [(True, False)] * 3
    assert all(len(s["spec"]["sharedCounters"]) == 1 for s in slices[:3])
    device_slices = slices[3:]
    assert all("sharedCounters" not in s["spec"] for s in device_slices)
    assert max(len(s["spec"]["devices"]) for s in device_slices) == 64
    assert sum(len(s["spec"]["devices"]) for s in device_slices) == len(bodies)
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {len(slices)}
    assert len({s["metadata"]["name"] for s in slices}) == len(slices)


def test_a_dynamic_gpu_beside_a_static_layout_and_the_mig_managers_list(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpukit.contracts.plugin_config import HealthSettings
    from gpukit.plugin.dra import kubelet_plugin as plugin_mod
    from gpukit.plugin.dra.slice_devices import Placement
    from gpukit.plugin.dra.slices import SlicePublisher

    static = make_gpu(1, migs=("3g.20gb",))
    dynamic = make_gpu(0)
    node = make_inventory([dynamic, static])
    monkeypatch.setattr(plugin_mod.nvml, "discover", lambda with_topology: node)
    monkeypatch.setattr(plugin_mod, "placements",
                        lambda devices, reader: {(static.uuid, 1): Placement(4, 4)})
    opts = plugin_mod.KubeletPluginOptions(
        node="n1", plugin_dir=str(tmp_path / "plugin"), registry_dir=str(tmp_path / "reg"),
        cdi_dir=str(tmp_path / "cdi"), health=HealthSettings(recovery_seconds=None),
        dynamic_mig={0: ("3g.20gb",)})
    (tmp_path / "plugin").mkdir()
    plugin = plugin_mod.DraKubeletPlugin(opts, api_client=None)
    api = FakeResourceApi()
    plugin.publisher = SlicePublisher(None, "n1", api=api)
    plugin.rescan()
    counter_sets = [c for s in api.slices.values() for c in s["spec"].get("sharedCounters", [])]
    assert [c["name"] for c in counter_sets] == ["gpu-0-counter-set"]
    names = sorted(d["name"] for s in api.slices.values() for d in s["spec"].get("devices", []))
    assert names == ["gpu-0", "gpu-0-mig-3g20gb-9-0", "gpu-0-mig-3g20gb-9-4",
                     "gpu-1-mig-3g20gb-9-4"]
    static_body = plugin.devices()["gpu-1-mig-3g20gb-9-4"].body
    assert "consumesCounters" not in static_body
    assert static_body["attributes"]["uuid"] == {"string": static.mig_devices[0].uuid}
    owned = json.loads((tmp_path / "plugin" / contract.OWNED_FILE).read_text())
    assert owned == {"version": "v1", "gpus": {"0": dynamic.uuid}}
    writes = api.writes
    plugin.rescan()  # nothing changed: nothing written
    assert api.writes == writes
