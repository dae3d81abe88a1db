"""The suite's oracle (gpukit.conformance.expect): what a node must serve, from its
declaration alone, and the declarations it refuses (host, variable, value)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from gpukit import inventory as inv
from gpukit.conformance import expect

REPO = Path(__file__).resolve().parents[2]
LAB = REPO / "inventories" / "lab"
A100 = "NVIDIA A100-SXM4-40GB"
A100_GPU = {"product": A100, "count": 8}

OPT_OUT = "gpukit_runtime_accept_envvar_unprivileged"


def _decl(**raw: Any) -> inv.NodeDecl:
    raw.setdefault("gpukit_gpu", {"product": "Tesla T4", "count": 2})
    # These declarations are about what a node serves, not the runtime's hardening: their
    # configs keep NVIDIA's default strategy (envvar), which needs the opt-out.
    raw.setdefault(OPT_OUT, True)
    return inv.node_from_vars("n1", raw)


def _mig(layout: list[dict[str, Any]], **raw: Any) -> dict[str, Any]:
    return {"gpukit_gpu": A100_GPU, "gpukit_mig_configs": {"l": layout},
            "gpukit_mig_config": "l", OPT_OUT: True, **raw}


def test_lab_expectations() -> None:
    lab = inv.load(LAB)
    assert expect.expected_resources(lab.node("gpu-a100")) == {
        "nvidia.com/gpu": 6, "nvidia.com/mig-1g.5gb": 4, "nvidia.com/mig-2g.10gb": 2,
        "nvidia.com/mig-3g.20gb": 2,
    }
    t4 = lab.node("gpu-t4")
    assert expect.expected_resources(t4) == {"nvidia.com/gpu": 8}
    assert expect.replicas_per_gpu(t4, "nvidia.com/gpu") == {0: 4, 1: 4}
    labels = expect.expected_labels(t4)
    assert labels["nvidia.com/gpu.product"] == "Tesla-T4-SHARED"
    assert (labels["nvidia.com/gpu.count"], labels["nvidia.com/gpu.replicas"]) == ("2", "4")
    assert labels["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    assert labels["nvidia.com/mig.capable"] == "false"
    assert "nvidia.com/mig.strategy" not in labels
    a100 = expect.expected_labels(lab.node("gpu-a100"))
    assert a100["nvidia.com/mig.strategy"] == "mixed"
    assert a100["nvidia.com/mig-1g.5gb.count"] == "4"
    assert a100["nvidia.com/mig-3g.20gb.memory"] == "19968"
    assert a100["nvidia.com/mig-3g.20gb.product"] == "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb"
    assert a100["nvidia.com/gpu.count"] == "8"  # GFD counts every GPU of the model



def _configs(**cfgs: dict[str, Any]) -> dict[str, Any]:
    return {name: {"version": "v1", **doc} for name, doc in cfgs.items()}


def test_strategy_none_serves_whole_gpus_even_with_mig_on() -> None:
    layout = [{"devices": "all", "mig-enabled": True, "mig-devices": {"3g.20gb": 2}}]
    decl = inv.node_from_vars("n1", _mig(layout))
    assert expect.expected_resources(decl) == {"nvidia.com/gpu": 8}


def test_strategy_single() -> None:
    layout = [{"devices": "all", "mig-enabled": True, "mig-devices": {"3g.20gb": 2}}]
    cfg = _configs(s={"flags": {"migStrategy": "single"}})
    decl = inv.node_from_vars("n1", _mig(layout, gpukit_device_plugin_configs=cfg,
                                         gpukit_device_plugin_config="s"))
    assert expect.expected_resources(decl) == {"nvidia.com/gpu": 16}
    labels = expect.expected_labels(decl)
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb"
    assert (labels["nvidia.com/gpu.count"], labels["nvidia.com/gpu.memory"]) == ("16", "19968")
    assert labels["nvidia.com/mig.strategy"] == "single"


def test_strategy_single_with_a_mixed_layout_is_inconsistent() -> None:
    decl = inv.load(LAB).node("gpu-a100")
    flags = dataclasses.replace(decl.plugin_config.flags, mig_strategy="single")
    single = dataclasses.replace(
        decl, plugin_config=dataclasses.replace(decl.plugin_config, flags=flags))
    with pytest.raises(inv.InventoryError) as exc:
        expect.expected_resources(single)
    assert "host gpu-a100: gpukit_mig_config: 'mixed-a100' leaves MIG disabled on GPU(s)" in str(
        exc.value)
    assert "uses migStrategy single" in str(exc.value)


def test_mixed_with_media_extension_profile_and_all_gpus_mig() -> None:
    layout = [{"devices": "all", "mig-enabled": True,
               "mig-devices": {"1g.5gb+me": 1, "3g.20gb": 1, "2g.10gb": 1}}]
    cfg = _configs(m={"flags": {"migStrategy": "mixed"}})
    decl = inv.node_from_vars("n1", _mig(layout, gpukit_device_plugin_configs=cfg,
                                         gpukit_device_plugin_config="m"))
    assert expect.expected_resources(decl) == {
        "nvidia.com/mig-1g.5gb.me": 8, "nvidia.com/mig-2g.10gb": 8, "nvidia.com/mig-3g.20gb": 8}
    labels = expect.expected_labels(decl)
    assert labels["nvidia.com/gpu.replicas"] == "0"  # no full GPU left: GFD's MIG-only form
    # GFD (lm/resource.go) names the profile with '+' as '.' in the product.
    assert labels["nvidia.com/mig-1g.5gb.me.product"] == "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb.me"


def test_sharing_strategy_is_per_resource_as_gfd_writes_it() -> None:
    """Only a MIG profile time-sliced: GFD says time-slicing for that profile and none for
    the GPUs (issue 14 point 11; before, the oracle said time-slicing node-wide)."""
    layout = [{"devices": [0, 1, 2, 3], "mig-enabled": False},
              {"devices": [4, 5, 6, 7], "mig-enabled": True, "mig-devices": {"1g.5gb": 7}}]
    cfg = _configs(m={"flags": {"migStrategy": "mixed"}, "sharing": {"timeSlicing": {
        "resources": [{"name": "nvidia.com/mig-1g.5gb", "replicas": 2}]}}})
    labels = expect.expected_labels(inv.node_from_vars(
        "n1", _mig(layout, gpukit_device_plugin_configs=cfg, gpukit_device_plugin_config="m")))
    assert labels["nvidia.com/gpu.sharing-strategy"] == "none"
    assert labels["nvidia.com/gpu.replicas"] == "1"
    assert labels["nvidia.com/mig-1g.5gb.sharing-strategy"] == "time-slicing"
    assert labels["nvidia.com/mig-1g.5gb.replicas"] == "2"
    assert labels["nvidia.com/mig-1g.5gb.product"] == "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb-SHARED"


def test_mig_enabled_gpus_under_strategy_none_have_no_replicas() -> None:
    """GFD labels MIG-enabled GPUs without sharing under every strategy: replicas 0."""
    layout = [{"devices": "all", "mig-enabled": True, "mig-devices": {"3g.20gb": 2}}]
    cfg = _configs(n={"flags": {"migStrategy": "none"}})
    labels = expect.expected_labels(inv.node_from_vars(
        "n1", _mig(layout, gpukit_device_plugin_configs=cfg, gpukit_device_plugin_config="n")))
    assert (labels["nvidia.com/gpu.replicas"], labels["nvidia.com/gpu.sharing-strategy"]) == (
        "0", "none")
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB"


@pytest.mark.parametrize(("ts", "gpus", "resources"), [
    ({"renameByDefault": True, "resources": [{"name": "nvidia.com/gpu", "replicas": 3}]}, 2,
     {"nvidia.com/gpu.shared": 6}),
    ({"resources": [{"name": "gpu", "rename": "gpu-ts", "replicas": 2}]}, 2,
     {"nvidia.com/gpu-ts": 4}),
    ({"resources": [{"name": "nvidia.com/gpu", "devices": [0], "replicas": 4},
                    {"name": "nvidia.com/gpu", "devices": [1], "replicas": 2}]}, 3,
     {"nvidia.com/gpu": 7}),
    ({"resources": [{"name": "nvidia.com/gpu", "devices": 1, "replicas": 5}]}, 2,
     {"nvidia.com/gpu": 6}),
    ({"resources": [{"name": "nvidia.com/gpu", "devices": [1], "replicas": 2, "rename": "x"}]},
     2, {"nvidia.com/gpu": 1, "nvidia.com/x": 2}),
    ({"resources": [{"name": "nvidia.com/mig-1g.5gb", "replicas": 2}]}, 2,
     {"nvidia.com/gpu": 2}),  # sharing for a resource the node does not have: ignored
])
def test_time_slicing(ts: dict[str, Any], gpus: int, resources: dict[str, int]) -> None:
    cfg = _configs(t={"sharing": {"timeSlicing": ts}})
    decl = _decl(gpukit_gpu={"product": "Tesla T4", "count": gpus},
                 gpukit_device_plugin_configs=cfg, gpukit_device_plugin_config="t")
    assert expect.expected_resources(decl) == resources


def test_per_gpu_replicas_spread_and_labels() -> None:
    ts = {"resources": [{"name": "nvidia.com/gpu", "devices": [0], "replicas": 4},
                        {"name": "nvidia.com/gpu", "devices": [1], "replicas": 2}]}
    decl = _decl(gpukit_device_plugin_configs=_configs(t={"sharing": {"timeSlicing": ts}}),
                 gpukit_device_plugin_config="t")
    assert expect.replicas_per_gpu(decl, "nvidia.com/gpu") == {0: 4, 1: 2}
    assert expect.shared_resources(decl) == {"nvidia.com/gpu": (4, 2)}
    assert expect.expected_labels(decl)["nvidia.com/gpu.replicas"] == "4"
    assert expect.shared_resources(dataclasses.replace(decl, gpu_allocation="dra")) == {}


def test_mps_gpus_and_each_clients_share() -> None:
    """The mps area's oracle: which GPUs run a daemon, what a client of a replica gets."""
    mps = {"resources": [{"name": "nvidia.com/gpu", "devices": [1], "replicas": 4}]}
    decl = _decl(gpukit_gpu={"product": "Tesla T4", "count": 2, "memory_mib": 15360},
                 gpukit_device_plugin_configs=_configs(m={"sharing": {"mps": mps}}),
                 gpukit_device_plugin_config="m")
    assert expect.mps_gpu_indexes(decl) == [1]
    share = expect.mps_share(decl, "nvidia.com/gpu")
    assert share is not None and share.memory_limit(15360) == "0=3840M"
    assert share.thread_percentage == "25"
    assert expect.mps_share(decl, "nvidia.com/mig-1g.5gb") is None
    ts = _decl(gpukit_device_plugin_configs=_configs(t={"sharing": {"timeSlicing": mps}}),
               gpukit_device_plugin_config="t")
    assert expect.mps_gpu_indexes(ts) == [] and expect.mps_share(ts, "nvidia.com/gpu") is None


def test_renamed_sharing_keeps_the_product_label() -> None:
    ts = {"renameByDefault": True, "resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}
    decl = _decl(gpukit_device_plugin_configs=_configs(t={"sharing": {"timeSlicing": ts}}),
                 gpukit_device_plugin_config="t")
    assert expect.expected_labels(decl)["nvidia.com/gpu.product"] == "Tesla-T4"


def test_time_sliced_mig_devices() -> None:
    layout = [{"devices": [0], "mig-enabled": True, "mig-devices": {"1g.5gb": 7}},
              {"devices": [1, 2, 3, 4, 5, 6, 7], "mig-enabled": False}]
    cfg = _configs(m={"flags": {"migStrategy": "mixed"}, "sharing": {"timeSlicing": {
        "resources": [{"name": "nvidia.com/mig-1g.5gb", "replicas": 2}]}}})
    decl = inv.node_from_vars("n1", _mig(layout, gpukit_device_plugin_configs=cfg,
                                         gpukit_device_plugin_config="m"))
    assert expect.expected_resources(decl) == {"nvidia.com/gpu": 7, "nvidia.com/mig-1g.5gb": 14}
    assert expect.replicas_per_gpu(decl, "nvidia.com/mig-1g.5gb") == {0: 14}
    assert expect.expected_labels(decl)["nvidia.com/mig-1g.5gb.product"].endswith("-SHARED")


def test_sharing_more_devices_than_the_node_has() -> None:
    ts = {"resources": [{"name": "nvidia.com/gpu", "devices": 3, "replicas": 2}]}
    decl = _decl(gpukit_device_plugin_configs=_configs(t={"sharing": {"timeSlicing": ts}}),
                 gpukit_device_plugin_config="t")
    with pytest.raises(inv.InventoryError, match=r"timeSlicing.resources\[0\].devices: 3 shares"):
        expect.expected_resources(decl)


def test_sharing_a_gpu_index_the_node_lacks() -> None:
    ts = {"resources": [{"name": "nvidia.com/gpu", "devices": [5], "replicas": 2}]}
    decl = _decl(gpukit_device_plugin_configs=_configs(t={"sharing": {"timeSlicing": ts}}),
                 gpukit_device_plugin_config="t")
    with pytest.raises(inv.InventoryError, match=r"'5' is not a nvidia\.com/gpu device"):
        expect.expected_resources(decl)


def test_no_gpus_no_labels() -> None:
    decl = _decl(gpukit_gpu={"product": "Tesla T4", "count": 0})
    assert expect.expected_resources(decl) == {}
    assert expect.expected_labels(decl) == {}
