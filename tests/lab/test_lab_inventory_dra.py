"""GPUKIT_LAB_DRA: the lab's switch putting groups or hosts of the lab inventory on DRA
(gpukit.lab.inventory; no cluster): the generated inventory gives their hosts
`gpukit_gpu_allocation: dra` (the T4s also `gpukit_dra_shares: 2`), the others keep the device
plugin, and without the switch the
default lab uses the checked-in inventory again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpukit import inventory as inv
from gpukit.lab import inventory as lab_inventory
from gpukit.lab.config import LabConfigError, LabSpec, parse_nodes

DEFAULT = "gpu-a100=a100-sxm4-40gb-x8,gpu-t4=t4-x2"


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LabSpec:
    monkeypatch.setenv("GPUKIT_LAB_DIR", str(tmp_path / "lab"))
    monkeypatch.delenv(lab_inventory.DRA_SETTING, raising=False)
    return LabSpec(nodes=parse_nodes(DEFAULT), instance=0)


def allocations(path: Path) -> dict[str, str]:
    return {d.node_name: d.gpu_allocation for d in inv.load(path).nodes}


def dra_files(path: Path) -> dict[str, Any]:
    """host_vars as written (Ansible's vars plugin caches which files a directory has for
    the whole process: a second load here would not see the regenerated ones)."""
    return {p.stem: yaml.safe_load(p.read_text()) for p in (path / "host_vars").glob("*.yml")}


def test_a_group_on_dra_and_back(lab: LabSpec, tmp_path: Path,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(lab_inventory.DRA_SETTING, "t4_nodes")
    path = lab_inventory.for_instance(lab)
    assert path == tmp_path / "lab" / "inventory"  # instance 0 too: the switch needs a copy
    assert allocations(path) == {"gpu-a100": "device-plugin", "gpu-t4": "dra"}
    assert inv.check(path).problems == ()  # what the preflight runs: valid as declared
    assert {d.node_name: d.dra_shares for d in inv.load(path).nodes} == {
        "gpu-a100": None, "gpu-t4": 2}  # the T4s shared by 2 claims each on DRA
    dra = {"gpukit_gpu_allocation": "dra"}
    monkeypatch.setenv(lab_inventory.DRA_SETTING, "gpu-a100, gpu-t4")
    assert dra_files(lab_inventory.for_instance(lab)) == {
        "gpu-a100": dra, "gpu-t4": {**dra, "gpukit_dra_shares": 2}}
    monkeypatch.setenv(lab_inventory.DRA_SETTING, "gpu-a100")
    assert dra_files(lab_inventory.for_instance(lab)) == {"gpu-a100": dra}
    monkeypatch.delenv(lab_inventory.DRA_SETTING)
    assert lab_inventory.for_instance(lab) == lab_inventory.LAB_INVENTORY


def test_groups_and_hosts_resolve_and_an_unknown_name_is_refused(lab: LabSpec) -> None:
    assert lab_inventory.dra_hosts(lab, "") == []
    assert lab_inventory.dra_hosts(lab, "gpu_nodes") == ["gpu-a100", "gpu-t4"]
    assert lab_inventory.dra_hosts(lab, "gpu-t4,t4_nodes") == ["gpu-t4"]
    with pytest.raises(LabConfigError, match="GPUKIT_LAB_DRA: 'h100_nodes' is neither a group "
                                             "nor a host of the lab inventory"):
        lab_inventory.dra_hosts(lab, "h100_nodes")


def test_host_vars_of_the_inventory_s_own_are_left_alone(tmp_path: Path) -> None:
    own = tmp_path / "host_vars" / "gpu-a100.yml"
    own.parent.mkdir()
    own.write_text("gpukit_node_labels: {team: ml}\n")
    lab_inventory.write_dra_host_vars(tmp_path, ["gpu-t4"])
    lab_inventory.write_dra_host_vars(tmp_path, [])
    assert own.read_text() == "gpukit_node_labels: {team: ml}\n"
    assert not (tmp_path / "host_vars" / "gpu-t4.yml").exists()
