"""The simulated fleet without a cluster: its generated inventory of hundreds of hosts, and
the Node and Lease objects its stand-ins register (what a kubelet and a node agent serving the
declaration would show)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from gpukit import inventory as inv
from gpukit.conformance import expect
from gpukit.contracts import label_names as ln
from gpukit.lab.fleet import inventory as fleet_inventory
from gpukit.lab.fleet import standin


@pytest.fixture(scope="module")
def fleet500(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fleet_inventory.generate(tmp_path_factory.mktemp("fleet") / "inv", 500,
                                    kubeconfig=Path("/nonexistent/kubeconfig"))


def test_an_inventory_of_500_hosts_is_valid_and_mixes_the_profiles(fleet500: Path) -> None:
    result = inv.check(fleet500)
    assert result.problems == ()
    assert result.inventory is not None
    names = result.inventory.node_names()
    assert len(names) == len(set(names)) == 500
    addresses = {n.address for n in result.inventory.nodes}
    assert len(addresses) == 500
    products = {n.gpu.product for n in result.inventory.nodes}
    assert products == {"NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-80GB",
                        "NVIDIA H100 80GB HBM3", "Tesla T4"}
    assert result.inventory.nodes[0].kubeconfig == "/nonexistent/kubeconfig"


@pytest.mark.parametrize(("count", "mix", "needle"), [
    (0, fleet_inventory.DEFAULT_MIX, "hosts: 0 is not a number of hosts"),
    (10, ("a100-sxm4-40gb-x8", "z900-x8"), "profiles: z900-x8 not among the lab's profiles"),
])
def test_bad_fleet_settings_are_refused_by_name(tmp_path: Path, count: int,
                                                mix: tuple[str, ...], needle: str) -> None:
    with pytest.raises(fleet_inventory.FleetError, match=needle):
        fleet_inventory.generate(tmp_path / "inv", count, mix)
    assert not (tmp_path / "inv").exists()  # nothing written


def test_a_stand_in_node_reports_what_the_declaration_implies(fleet500: Path) -> None:
    fleet = inv.load(fleet500)
    t = dt.datetime(2026, 11, 26, 12, 0, tzinfo=dt.UTC)
    for decl in fleet.nodes[:4]:  # one of each profile
        body = standin.node_object(decl, decl.address or "", t)
        gpus = {r: str(n) for r, n in expect.expected_resources(decl).items()}
        status = body["status"]
        assert {k: v for k, v in status["capacity"].items() if k.startswith("nvidia.com/")} \
            == gpus
        assert status["allocatable"] == status["capacity"]
        labels = body["metadata"]["labels"]
        assert expect.expected_labels(decl).items() <= labels.items()
        assert decl.selection_labels().items() <= labels.items()
        assert labels[ln.DEVICE_PLUGIN_CONFIG_STATE] == ln.CONFIG_STATE_SUCCESS
        ready = [c for c in status["conditions"] if c["type"] == "Ready"]
        assert ready and ready[0]["status"] == "True"
        assert ready[0]["lastHeartbeatTime"] == "2026-11-26T12:00:00Z"
        assert {"key": standin.SIMULATED, "value": "true", "effect": "NoSchedule"} in \
            body["spec"]["taints"]
        assert status["addresses"][0] == {"type": "InternalIP", "address": decl.address}


def test_a_lease_is_the_kubelets_and_goes_with_its_node() -> None:
    t = dt.datetime(2026, 11, 26, 12, 0, 1, 250000, tzinfo=dt.UTC)
    lease = standin.lease_object("sim-0001", "uid-1", t)
    assert lease["metadata"]["namespace"] == "kube-node-lease"
    assert lease["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "sim-0001", "uid": "uid-1"}]
    assert lease["spec"] == {"holderIdentity": "sim-0001", "leaseDurationSeconds": 40,
                             "renewTime": "2026-11-26T12:00:01.250000Z"}
