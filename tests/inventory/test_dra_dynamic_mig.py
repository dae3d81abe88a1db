"""`gpukit_dra_dynamic_mig`: a DRA node's GPUs carved into MIG devices on demand, validated by
the model (one line naming host, field and value), carried in the node's declaration entry to
the DRA plugin, and known to the unknown-variable check."""

from __future__ import annotations

from typing import Any

import pytest

from gpukit import inventory as inv
from gpukit.contracts import node_declaration as nd
from gpukit.inventory import known_variables
from gpukit.provision import agent, declaration

A100: dict[str, Any] = {"gpukit_gpu": {"product": "NVIDIA A100-SXM4-40GB", "count": 2},
                        "gpukit_runtime_accept_envvar_unprivileged": True}


def _decl(**raw: Any) -> inv.NodeDecl:
    return inv.node_from_vars("n1", {**A100, "gpukit_gpu_allocation": "dra", **raw})


def _problems(**raw: Any) -> list[str]:
    with pytest.raises(inv.InventoryError) as exc:
        _decl(**raw)
    return [ln for ln in str(exc.value).splitlines() if "dynamic_mig" in ln]


def test_a_dynamic_gpu_is_declared_with_its_profiles_and_travels_to_the_plugin() -> None:
    d = _decl(gpukit_dra_dynamic_mig={0: ["1g.5gb", "3g.20gb"], "1": "all"})
    assert [(g.index, g.profiles[:2]) for g in d.dra_dynamic_mig] == [
        (0, ("1g.5gb", "3g.20gb")), (1, ("1g.5gb", "1g.5gb+me"))]
    fact = declaration.fact(d, inv.expected_resources(d), inv.expected_labels(d))
    entry = agent.declaration_entry(fact)
    assert entry is not None and entry["draDynamicMig"]["0"] == ["1g.5gb", "3g.20gb"]
    parsed = nd.parse(nd.render(nd.from_dict(entry)), "entry")
    assert parsed.dra_dynamic_mig[0] == ("1g.5gb", "3g.20gb")
    assert len(parsed.dra_dynamic_mig[1]) == 7
    # the oracle expects each dynamic GPU whole (its possible MIG devices are not counted)
    assert entry["draDevices"] == {"gpu.nvidia.com/gpu": 2}
    assert _decl().dra_dynamic_mig == ()


@pytest.mark.parametrize(("value", "line"), [
    ({0: ["2g.99gb"]}, "host n1: gpukit_dra_dynamic_mig.0: '2g.99gb' is not a MIG profile of "
                       "NVIDIA A100-SXM4-40GB (known: 1g.5gb, 1g.5gb+me, 1g.10gb, 2g.10gb, "
                       "3g.20gb, 4g.20gb, 7g.40gb)"),
    ({2: "all"}, "host n1: gpukit_dra_dynamic_mig.2: GPU 2 is not among the node's 2 GPU(s) "
                 "(gpukit_gpu.count)"),
    ({"x": "all"}, "host n1: gpukit_dra_dynamic_mig.x: 'x' is not a GPU index"),
    ({0: []}, "host n1: gpukit_dra_dynamic_mig.0: [] is not a list of MIG profiles or 'all'"),
    ([0], "host n1: gpukit_dra_dynamic_mig: [0] is not a mapping of GPU index to profiles"),
])
def test_a_bad_declaration_is_one_line_naming_field_and_value(value: object, line: str) -> None:
    assert _problems(gpukit_dra_dynamic_mig=value) == [line]


def test_a_device_plugin_node_or_a_gpu_without_mig_cannot_be_dynamic() -> None:
    with pytest.raises(inv.InventoryError) as exc:
        inv.node_from_vars("n1", {**A100, "gpukit_dra_dynamic_mig": {0: "all"}})
    assert "host n1: gpukit_dra_dynamic_mig: {0: 'all'} carves MIG devices through DRA: it " \
           "needs gpukit_gpu_allocation dra (this node is on device-plugin)" in str(exc.value)
    t4 = {"gpukit_gpu": {"product": "Tesla T4", "count": 1}}
    with pytest.raises(inv.InventoryError, match="gpukit_dra_dynamic_mig: Tesla T4 is not MIG "
                                                 "capable"):
        inv.node_from_vars("n1", {**A100, **t4, "gpukit_gpu_allocation": "dra",
                                  "gpukit_dra_dynamic_mig": {0: "all"}})


def test_a_static_layout_on_the_other_gpu_is_kept_and_one_on_the_dynamic_gpu_refused() -> None:
    configs = {"one": [{"devices": [1], "mig-enabled": True,
                        "mig-devices": {"3g.20gb": 2}}],
               "all": [{"devices": "all", "mig-enabled": True,
                        "mig-devices": {"3g.20gb": 2}}]}
    d = _decl(gpukit_dra_dynamic_mig={0: "all"}, gpukit_mig_configs=configs,
              gpukit_mig_config="one")
    assert [(g.index, g.mig_enabled) for g in d.mig_gpus] == [(0, False), (1, True)]
    assert [x["type"] for x in inv.expected_dra_devices(d)] == ["gpu", "mig", "mig"]
    assert _problems(gpukit_dra_dynamic_mig={0: "all"}, gpukit_mig_configs=configs,
                     gpukit_mig_config="all") == [
        "host n1: gpukit_dra_dynamic_mig.0: GPU 0 is carved on demand, but gpukit_mig_config "
        "enables MIG on it: select the other GPUs by index in that layout"]


def test_the_variable_is_known_to_the_unknown_variable_check() -> None:
    assert known_variables.unknown({"gpukit_dra_dynamic_mig"}) == {}
    assert "gpukit_dra_dynamic_mig" in known_variables.unknown({"gpukit_dra_dynamic_mg"})[
        "gpukit_dra_dynamic_mg"]
