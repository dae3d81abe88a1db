"""Served vs declared (issue 30): the pure comparison the agent's watchdog reports."""

from __future__ import annotations

from gpukit.contracts import node_declaration as nd
from gpukit.plugin.metrics import PluginMetrics
from gpukit.plugin.served import Served, compare

T4 = nd.NodeDeclaration("gpu-t4", {"nvidia.com/gpu": 8}, "ts")
A100 = nd.NodeDeclaration("gpu-a100", {"nvidia.com/gpu": 4, "nvidia.com/mig-1g.5gb": 14},
                          "mixed")


def test_a_node_serving_its_declaration_is_no_mismatch() -> None:
    v = compare(T4, Served({"nvidia.com/gpu": 8}))
    assert not v.mismatch
    assert v.reason == nd.REASON_OK
    assert v.message == "node gpu-t4 serves its declaration: nvidia.com/gpu 8"
    assert v.declared == v.served == {"nvidia.com/gpu": 8}


def test_fewer_devices_name_node_resource_declared_and_served() -> None:
    v = compare(T4, Served({"nvidia.com/gpu": 6}))
    assert v.mismatch
    assert v.reason == nd.REASON_DEVICES
    assert v.message == "node gpu-t4: nvidia.com/gpu declared 8, served 6"
    assert (v.declared, v.served) == ({"nvidia.com/gpu": 8}, {"nvidia.com/gpu": 6})


def test_a_drifted_mig_layout_names_every_resource_that_differs() -> None:
    # GPU 0 and 1 repartitioned as 3g.20gb: the 1g.5gb devices gone, a resource not declared.
    v = compare(A100, Served({"nvidia.com/gpu": 4, "nvidia.com/mig-3g.20gb": 4}))
    assert v.mismatch and v.reason == nd.REASON_DEVICES
    assert v.message == ("node gpu-a100: nvidia.com/mig-1g.5gb declared 14, served 0; "
                         "nvidia.com/mig-3g.20gb declared 0, served 4")
    assert v.declared == {"nvidia.com/gpu": 4, "nvidia.com/mig-1g.5gb": 14,
                          "nvidia.com/mig-3g.20gb": 0}
    assert v.served["nvidia.com/mig-1g.5gb"] == 0


def test_no_gpus_served_at_all_is_a_mismatch_per_declared_resource() -> None:
    v = compare(A100, Served({}))
    assert v.mismatch
    assert v.served == {"nvidia.com/gpu": 0, "nvidia.com/mig-1g.5gb": 0}


def test_a_config_fallback_is_a_mismatch_even_with_equal_counts() -> None:
    v = compare(T4, Served({"nvidia.com/gpu": 8}, config_refused="unknown config 'tss'"))
    assert v.mismatch
    assert v.reason == nd.REASON_CONFIG
    assert v.message == ("node gpu-t4: config 'ts' declared, refused (unknown config 'tss'); "
                         "an earlier config is served")


def test_a_fallback_with_other_counts_names_both() -> None:
    v = compare(T4, Served({"nvidia.com/gpu": 2}, config_refused="bad"))
    assert v.reason == nd.REASON_CONFIG
    assert "nvidia.com/gpu declared 8, served 2; config 'ts' declared, refused" in v.message


def test_a_node_declared_without_gpus_serving_none_is_fine() -> None:
    v = compare(nd.NodeDeclaration("cpu-1"), Served({}))
    assert not v.mismatch
    assert v.message == "node cpu-1 serves its declaration: no GPU resources"


def test_the_gauges_carry_declared_and_served_per_resource_and_go_with_the_declaration(
) -> None:
    m = PluginMetrics()
    v = compare(A100, Served({"nvidia.com/gpu": 3}))
    m.set_declared_served(v.declared, v.served)
    get = m.registry.get_sample_value
    assert get("gpukit_node_gpus_declared", {"resource": "nvidia.com/mig-1g.5gb"}) == 14
    assert get("gpukit_node_gpus_served", {"resource": "nvidia.com/mig-1g.5gb"}) == 0
    assert get("gpukit_node_gpus_served", {"resource": "nvidia.com/gpu"}) == 3
    m.set_declared_served({}, {})
    assert get("gpukit_node_gpus_declared", {"resource": "nvidia.com/gpu"}) is None
