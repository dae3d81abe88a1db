"""`gpukit_dra_shares`: a DRA node's devices shared by that many claims each (consumable
capacity), validated by the model (one line naming host, variable and value), turned into the
label the DRA plugin reads (role node_labels: gpukit.provision.nodes.with_allocation, filter
gpukit.gpu.node_labels) and into the `shares` capacity the oracle expects on every device."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import pytest

from gpukit import inventory as inv
from gpukit.conformance import expect
from gpukit.provision import declaration, nodes
from gpukit.provision.nodes import NodeSpecError

SHARES_LABEL = "gpukit.io/dra.shares"
T4: dict[str, Any] = {"gpukit_gpu": {"product": "Tesla T4", "count": 2, "memory_mib": 15360},
                      "gpukit_runtime_accept_envvar_unprivileged": True}


def _decl(**raw: Any) -> inv.NodeDecl:
    return inv.node_from_vars("n1", {**T4, **raw})


def test_a_shared_dra_node_expects_a_shares_capacity_on_every_device() -> None:
    d = _decl(gpukit_gpu_allocation="dra", gpukit_dra_shares=4)
    assert d.dra_shares == 4
    assert [x.capacity() for x in expect.expected_dra_devices(d)] == \
        [{"memory": "15Gi", "shares": "4"}] * 2
    assert _decl(gpukit_gpu_allocation="dra").dra_shares is None
    assert _decl(gpukit_gpu_allocation="dra", gpukit_dra_shares=None).dra_shares is None


@pytest.mark.parametrize("value", [1, 0, 65, -2, "4", 2.5, True, [2]])
def test_a_bad_count_is_refused_in_one_line_naming_host_variable_and_value(value: object
                                                                           ) -> None:
    with pytest.raises(inv.InventoryError) as exc:
        _decl(gpukit_gpu_allocation="dra", gpukit_dra_shares=value)
    lines = str(exc.value).splitlines()
    assert [ln for ln in lines if "gpukit_dra_shares" in ln] == [
        f"host n1: gpukit_dra_shares: {value!r} is not an integer from 2 to 64"], lines


def test_shares_on_a_device_plugin_node_are_refused() -> None:
    with pytest.raises(inv.InventoryError) as exc:
        _decl(gpukit_dra_shares=2)
    assert "host n1: gpukit_dra_shares: 2 shares DRA devices: it needs gpukit_gpu_allocation " \
           "dra (this node is on device-plugin" in str(exc.value)


def _filter(plugin: str) -> Any:
    collections = str(Path(__file__).resolve().parents[2] / "collections")
    if collections not in sys.path:
        sys.path.append(collections)
    return importlib.import_module(f"ansible_collections.gpukit.gpu.plugins.filter.{plugin}")


def test_the_label_the_dra_plugin_reads() -> None:
    assert nodes.with_allocation({}, "dra", 4)[SHARES_LABEL] == "4"
    assert SHARES_LABEL not in nodes.with_allocation({}, "dra")
    with pytest.raises(NodeSpecError, match="gpukit_dra_shares: 1 is not an integer from 2 "
                                            "to 64"):
        nodes.with_allocation({}, "dra", 1)
    with pytest.raises(NodeSpecError, match="gpukit_dra_shares: 3 shares DRA devices: it "
                                            "needs gpukit_gpu_allocation dra"):
        nodes.with_allocation({}, "device-plugin", 3)
    f = _filter("nodes")
    fact = declaration.for_vars("n1", {**T4, "gpukit_gpu_allocation": "dra",
                                       "gpukit_dra_shares": 3})
    assert fact["dra_shares"] == 3
    # The rolling upgrade's plan passes neither: the preflight's declaration says both.
    assert f.node_labels({}, declaration=fact)[SHARES_LABEL] == "3"
    # The role passes both (node_labels_gpu_allocation, node_labels_dra_shares).
    assert f.node_labels({}, gpu_allocation="dra", dra_shares=2)[SHARES_LABEL] == "2"
    assert SHARES_LABEL not in f.node_labels({}, gpu_allocation="dra", dra_shares=None)
