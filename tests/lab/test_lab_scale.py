"""A lab of N nodes of mixed profiles: its generated inventory declares every node, in the
group of its profile, at its own address, with what the node's mock NVML has (no cluster)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpukit import inventory as inv
from gpukit.conformance import expect
from gpukit.lab import inventory as lab_inventory
from gpukit.lab.config import LabSpec, parse_nodes

EIGHT = ("n1=a100-sxm4-40gb-x8,n2=a100-80gb-x4,n3=h100-80gb-x8,n4=t4-x2,"
         "n5=a100-sxm4-40gb-x8,n6=a100-80gb-x4,n7=h100-80gb-x8,n8=t4-x2")


@pytest.fixture
def eight(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LabSpec:
    monkeypatch.setenv("GPUKIT_LAB_DIR", str(tmp_path / "lab"))
    return LabSpec(nodes=parse_nodes(EIGHT), instance=8)


def test_every_node_is_declared_at_its_own_address(eight: LabSpec) -> None:
    path = lab_inventory.for_instance(eight)
    fleet = inv.load(path)
    assert sorted(fleet.node_names()) == sorted(eight.node_names())
    hosts = yaml.safe_load((path / "hosts.yml").read_text())
    groups = hosts["all"]["children"]["gpu_nodes"]["children"]
    addresses = {name: hv["ansible_host"] for g in groups.values() for name, hv in
                 g["hosts"].items()}
    assert addresses == {n.name: n.address(eight) for n in eight.nodes}
    assert len(set(addresses.values())) == 8
    assert set(groups["a100_nodes"]["hosts"]) == {"n1", "n5"}
    assert set(groups["h100_80gb_x8_nodes"]["hosts"]) == {"n3", "n7"}
    assert hosts["all"]["vars"]["gpukit_kubeconfig"].startswith(str(Path(
        hosts["all"]["vars"]["ansible_ssh_private_key_file"]).parents[1]))


def test_each_profile_declares_the_gpus_its_mock_has(eight: LabSpec) -> None:
    path = lab_inventory.for_instance(eight)
    fleet = inv.load(path)
    h100 = fleet.node("n3")
    assert (h100.gpu.product, h100.gpu.count, h100.gpu.memory_mib) == (
        "NVIDIA H100 80GB HBM3", 8, 81559)
    assert expect.expected_resources(h100) == {"nvidia.com/gpu": 8}
    a100x4 = fleet.node("n2")
    assert expect.expected_resources(a100x4) == {"nvidia.com/gpu": 4}
    # the groups inventories/lab declares keep their declarations (MIG, time-slicing)
    assert expect.expected_resources(fleet.node("n4")) == {"nvidia.com/gpu": 8}
    assert "nvidia.com/mig-3g.20gb" in expect.expected_resources(fleet.node("n5"))
    result = inv.check(path)  # what `gpukit inventory check` runs: no problem anywhere
    assert result.problems == ()
    assert len(result.resources) == 8


def test_the_default_instance_0_lab_uses_the_checked_in_inventory(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GPUKIT_LAB_DIR", str(tmp_path / "lab"))
    spec = LabSpec(nodes=parse_nodes("gpu-a100=a100-sxm4-40gb-x8,gpu-t4=t4-x2"), instance=0)
    assert lab_inventory.for_instance(spec) == lab_inventory.LAB_INVENTORY
    bigger = LabSpec(nodes=parse_nodes(EIGHT), instance=0)
    assert lab_inventory.for_instance(bigger) == tmp_path / "lab" / "inventory"


def test_a_regenerated_inventory_drops_nodes_no_longer_in_the_lab(
        eight: LabSpec, tmp_path: Path) -> None:
    lab_inventory.for_instance(eight)
    two = LabSpec(nodes=parse_nodes("n1=a100-sxm4-40gb-x8,n4=t4-x2"), instance=8)
    fleet = inv.load(lab_inventory.for_instance(two))
    assert sorted(fleet.node_names()) == ["n1", "n4"]


def test_node_links_have_distinct_names_within_the_kernels_limit() -> None:
    from gpukit.lab import network

    spec = LabSpec(nodes=parse_nodes(
        "gpu-a100=a100-sxm4-40gb-x8,gpu-a100-80=a100-80gb-x4,gpu-a100-80-b=a100-80gb-x4,"
        "gpu-a100-80-c=a100-80gb-x4,gpu-h100-b=h100-80gb-x8"), instance=8)
    names = [network._host_if(spec, n) for n in spec.nodes]
    assert len(set(names)) == len(names)  # cut to 15, two of them were gk8-gpu-a100-80
    assert all(len(n) <= 15 for n in names)
    assert names[:2] == ["gk8-gpu-a100", "gk8-gpu-a100-80"]  # names that fit are kept


def test_the_opt_in_h200_and_b200_nodes_get_their_groups_mig_layouts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GPUKIT_LAB_NODES=...,gpu-h200=h200-x8,gpu-b200=b200-x8: each node lands in the group
    inventories/lab declares for it, with the MIG layout a team would pick; the declaration
    passes `gpukit inventory check` and the oracle expects the MIG devices of those layouts.
    (Without the A100 node the lab's team-a quota on nvidia.com/mig-1g.5gb names a resource
    no node serves, and the check says so.)"""
    monkeypatch.setenv("GPUKIT_LAB_DIR", str(tmp_path / "lab"))
    nodes = "gpu-a100=a100-sxm4-40gb-x8,gpu-t4=t4-x2,gpu-h200=h200-x8,gpu-b200=b200-x8"
    spec = LabSpec(nodes=parse_nodes(nodes), instance=2)
    path = lab_inventory.for_instance(spec)
    groups = yaml.safe_load((path / "hosts.yml").read_text())["all"]["children"]["gpu_nodes"]
    assert {g: set(v["hosts"]) for g, v in groups["children"].items()} == {
        "a100_nodes": {"gpu-a100"}, "t4_nodes": {"gpu-t4"}, "h200_nodes": {"gpu-h200"},
        "b200_nodes": {"gpu-b200"}}
    result = inv.check(path)
    assert result.problems == ()
    only_new = LabSpec(nodes=parse_nodes("gpu-h200=h200-x8,gpu-b200=b200-x8"), instance=2)
    [quota] = inv.check(lab_inventory.for_instance(only_new)).problems
    assert quota.variable == "gpukit_gpu_quotas.team-a.requests.nvidia.com/mig-1g.5gb"
    fleet = inv.load(path)
    h200, b200 = fleet.node("gpu-h200"), fleet.node("gpu-b200")
    assert (h200.gpu.product, b200.gpu.product) == ("NVIDIA H200", "NVIDIA B200")
    assert expect.expected_resources(h200) == {
        "nvidia.com/gpu": 6, "nvidia.com/mig-3g.71gb": 2, "nvidia.com/mig-2g.35gb": 2,
        "nvidia.com/mig-1g.18gb": 4}
    assert expect.expected_resources(b200) == {
        "nvidia.com/gpu": 5, "nvidia.com/mig-1g.23gb": 7, "nvidia.com/mig-4g.90gb": 2,
        "nvidia.com/mig-3g.90gb": 2}
