"""resource.kubernetes.io/pcieRoot from a sysfs tree laid out as a kernel lays it out (links
from bus/pci/devices into devices/pci<domain>:<bus>/...), and nothing where sysfs cannot tell."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from plugin_testlib import make_gpu, make_inventory

from gpukit.contracts.dra import PCIE_ROOT_ATTRIBUTE
from gpukit.plugin.dra import pcie_root
from gpukit.plugin.dra.slice_devices import Placement, node_slice_devices


def kernel_sysfs(root: Path, devices: dict[str, str]) -> Path:
    """`root` as a kernel's sysfs: for each bus id, its directory at devices/<path>/<bus id>
    and the bus's relative link to it."""
    for bus_id, where in devices.items():
        d = root / "devices" / where / bus_id
        d.mkdir(parents=True)
        (d / "vendor").write_text("0x10de\n")
        link = root / "bus/pci/devices" / bus_id
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(d, link.parent))
    return root


def test_the_root_is_the_first_component_under_devices(tmp_path: Path) -> None:
    sysfs = kernel_sysfs(tmp_path, {
        "0000:07:00.0": "pci0000:04/0000:04:1c.0/0000:05:00.0/0000:06:00.0",  # behind a switch
        "0000:3b:00.0": "pci0000:3a/0000:3a:00.0",  # right under its root port
        "0001:0b:00.0": "pci0001:08/0001:08:1c.0",  # another PCI domain
    })
    assert pcie_root.read("0000:07:00.0", str(sysfs)) == "pci0000:04"
    assert pcie_root.read("0000:3b:00.0", str(sysfs)) == "pci0000:3a"
    assert pcie_root.read("0001:0b:00.0", str(sysfs)) == "pci0001:08"
    # an absolute link (a kernel's are relative, but the helper takes both)
    link = sysfs / "bus/pci/devices/0000:3b:00.0"
    link.unlink()
    link.symlink_to(sysfs / "devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0")
    assert pcie_root.read("0000:3b:00.0", str(sysfs)) == "pci0000:3a"


@pytest.mark.parametrize(("setup", "why"), [
    ("absent", "not a link"),
    ("directory", "not a link"),  # the lab's layout before issue 28: plain directories
    ("outside", "not to"),
    ("other-device", "not to"),
    ("not-pci", "not to"),
])
def test_sysfs_that_cannot_tell_gives_nothing(tmp_path: Path, setup: str, why: str) -> None:
    bus_id = "0000:07:00.0"
    link = tmp_path / "bus/pci/devices" / bus_id
    link.parent.mkdir(parents=True)
    if setup == "directory":
        link.mkdir()
    elif setup == "outside":
        (tmp_path / "elsewhere" / bus_id).mkdir(parents=True)
        link.symlink_to(f"../../../elsewhere/{bus_id}")
    elif setup == "other-device":
        link.symlink_to("../../../devices/pci0000:00/0000:00:1c.0/0000:08:00.0")
    elif setup == "not-pci":
        link.symlink_to(f"../../../devices/platform/{bus_id}")
    with pytest.raises(pcie_root.Unknown, match=why):
        pcie_root.read(bus_id, str(tmp_path))


def test_a_malformed_bus_id_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(pcie_root.Unknown, match=r"'00000000:07:00\.0' is not of the form"):
        pcie_root.read("00000000:07:00.0", str(tmp_path))


def test_gpus_and_their_mig_devices_carry_the_root_and_sysfs_that_cannot_tell_is_logged_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each GPU its own root, each MIG device its parent's; a GPU whose sysfs entry is no link
    gets no attribute (no guess from its bus id) and one warning, however many rescans."""
    a100 = make_gpu(0, migs=("3g.20gb", "1g.5gb"))  # 0000:07:00.0
    whole = make_gpu(1)  # 0000:08:00.0
    lost = make_gpu(2)  # 0000:09:00.0: a plain directory
    sysfs = kernel_sysfs(tmp_path, {"0000:07:00.0": "pci0000:04/0000:04:1c.0",
                                    "0000:08:00.0": "pci0000:44/0000:44:1c.0"})
    (sysfs / "bus/pci/devices/0000:09:00.0").mkdir()
    node = make_inventory([a100, whole, lost])
    placements = {(a100.uuid, 1): Placement(4, 4), (a100.uuid, 2): Placement(0, 1)}
    caplog.set_level(logging.WARNING, logger=pcie_root.__name__)
    for _ in range(3):
        devices = {d.name: d.body["attributes"]
                   for d in node_slice_devices(node, placements, sysfs_root=str(sysfs))}
    roots = {name: attrs.get(PCIE_ROOT_ATTRIBUTE) for name, attrs in devices.items()}
    assert roots == {"gpu-0-mig-3g20gb-9-4": {"string": "pci0000:04"},
                     "gpu-0-mig-1g5gb-19-0": {"string": "pci0000:04"},
                     "gpu-1": {"string": "pci0000:44"}, "gpu-2": None}
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "0000:09:00.0" in said[0] and PCIE_ROOT_ATTRIBUTE in said[0]
    # the default root is GPUKIT_SYSFS_ROOT, as for the agent's labels
    monkeypatch.setenv("GPUKIT_SYSFS_ROOT", str(sysfs))
    assert node_slice_devices(node, placements)[2].body["attributes"][PCIE_ROOT_ATTRIBUTE] == {
        "string": "pci0000:44"}
