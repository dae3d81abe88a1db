"""The suite's pcieRoot check without a cluster: the check function on a stand-in suite whose
API answers with given ResourceSlices and whose node answers `readlink` as its sysfs would."""

from __future__ import annotations

from types import SimpleNamespace as NS
from typing import Any

import pytest

from gpukit import inventory as inv
from gpukit.conformance import test_dra as dra_checks
from gpukit.conformance.checks import Check

A100 = "NVIDIA A100-SXM4-40GB"
ROOT = "resource.kubernetes.io/pcieRoot"
BUS = "resource.kubernetes.io/pciBusID"


def _decl() -> inv.NodeDecl:
    return inv.node_from_vars("gpu-a", {"gpukit_gpu": {"product": A100, "count": 2},
                                        "gpukit_gpu_allocation": "dra"})


def _device(name: str, bus_id: str, root: str | None, parent: str = "") -> dict[str, Any]:
    attrs: dict[str, Any] = {BUS: {"string": bus_id}, "uuid": {"string": f"{name}-uuid"}}
    if parent:
        attrs["parentUUID"] = {"string": parent}
    if root is not None:
        attrs[ROOT] = {"string": root}
    return {"name": name, "attributes": attrs}


class _Host:
    """`readlink -m …; test -L …` as a node whose sysfs links these bus ids (bus id: the
    canonical path, or None for a plain directory)."""

    def __init__(self, links: dict[str, str | None]) -> None:
        self.links = links

    def run(self, command: str) -> Any:
        bus_id = command.split("/sys/bus/pci/devices/")[1].split(";")[0]
        target = self.links.get(bus_id)
        return NS(rc=0 if target else 1, stdout=(target or f"/sys/bus/pci/devices/{bus_id}")
                  + "\n")


def _run(monkeypatch: pytest.MonkeyPatch, devices: list[dict[str, Any]],
         host: _Host | None) -> Check:
    decl = _decl()
    slices = [{"spec": {"pool": {"name": "gpu-a", "generation": 1}, "devices": devices}}]
    monkeypatch.setattr(dra_checks, "node_slices", lambda _api, _node: slices)
    suite = NS(decl=lambda _n: decl, kube=NS(api_client=None),
               options=NS(host_access=host is not None), host=lambda _n: host)
    check = Check("gpu-a", "dra")
    dra_checks.test_devices_carry_the_pcie_root_of_their_pci_address(suite, "gpu-a", check)
    return check


SYSFS = _Host({"0000:07:00.0": "/sys/devices/pci0000:04/0000:04:1c.0/0000:05:00.0/"
                               "0000:06:00.0/0000:07:00.0",
               "0000:47:00.0": "/sys/devices/pci0000:44/0000:44:1c.0/0000:47:00.0"})


def test_roots_that_match_the_node_s_sysfs_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    devices = [_device("gpu-0-mig-3g20gb-9-4", "0000:07:00.0", "pci0000:04", parent="GPU-0"),
               _device("gpu-0-mig-1g5gb-19-0", "0000:07:00.0", "pci0000:04", parent="GPU-0"),
               _device("gpu-1", "0000:47:00.0", "pci0000:44")]
    check = _run(monkeypatch, devices, SYSFS)
    assert not check.failed() and len(check.rows) == 3 + 3 + 2


@pytest.mark.parametrize(("devices", "wrong"), [
    # no attribute though sysfs shows the root
    ([_device("gpu-1", "0000:47:00.0", None)], "expected pci0000:44, observed absent"),
    # another root than sysfs shows
    ([_device("gpu-1", "0000:47:00.0", "pci0000:04")], "expected pci0000:44, observed pci0000:04"),
    # a root guessed where sysfs shows none (a plain directory)
    ([_device("gpu-2", "0000:87:00.0", "pci0000:86")], "expected absent, observed pci0000:86"),
])
def test_a_root_other_than_the_node_s_sysfs_fails_by_name(
        monkeypatch: pytest.MonkeyPatch, devices: list[dict[str, Any]], wrong: str) -> None:
    with pytest.raises(pytest.fail.Exception, match=wrong):
        _run(monkeypatch, devices, SYSFS)


def test_without_host_access_the_form_and_one_root_per_gpu_are_still_checked(
        monkeypatch: pytest.MonkeyPatch) -> None:
    good = [_device("gpu-0-mig-3g20gb-9-4", "0000:07:00.0", "pci0000:04", parent="GPU-0"),
            _device("gpu-1", "0000:47:00.0", "pci0000:44")]
    assert not _run(monkeypatch, good, None).failed()
    for bad, why in (
        ([_device("gpu-1", "0000:47:00.0", "0000:44")], "pci<domain>:<bus>"),
        ([_device("gpu-1", "0001:47:00.0", "pci0000:44")], "0001:47:00.0's domain"),
        ([_device("gpu-1", "0000:47:00.0", "pci0000:48")], "at or above its bus"),
        ([_device("a", "0000:07:00.0", "pci0000:04", parent="GPU-0"),
          _device("b", "0000:07:00.0", "pci0000:00", parent="GPU-0")], "GPU GPU-0's devices"),
    ):
        with pytest.raises(pytest.fail.Exception, match=why):
            _run(monkeypatch, bad, None)
