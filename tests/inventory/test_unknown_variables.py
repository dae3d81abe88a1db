"""A misspelt variable in gpukit's namespaces is an error naming it, its file and line, and the
name it probably meant: `gpukit_device_plugin_confg: ts4` once passed every check and the node
served the default config (2 GPUs instead of 8)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpukit import inventory as inv
from gpukit.inventory import known_variables

REPO = Path(__file__).resolve().parents[2]
LAB = REPO / "inventories" / "lab"


def _lab_copy(tmp_path: Path) -> Path:
    root = tmp_path / "inv"
    shutil.copytree(LAB, root)
    return root


def _check(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpukit", "inventory", "check", str(root)],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("name", "meant"), [
    ("gpukit_device_plugin_confg", "gpukit_device_plugin_config"),
    ("gpukit_mig_confg", "gpukit_mig_config"),
    ("gpukit_gpu_alocation", "gpukit_gpu_allocation"),
    ("gpukit_metrics_listen_port", None),
    ("nvidia_driver_brnach", "nvidia_driver_branch"),
    ("device_plugin_imagee", "device_plugin_image"),
])
def test_a_misspelt_variable_is_refused_naming_file_and_line(tmp_path: Path, name: str,
                                                             meant: str | None) -> None:
    root = _lab_copy(tmp_path)
    t4 = root / "group_vars" / "t4_nodes.yml"
    lines = t4.read_text().splitlines()
    t4.write_text("\n".join([*lines, f"{name}: ts4", ""]))
    r = _check(root)
    assert r.returncode == 2, r.stdout + r.stderr
    out = r.stdout + r.stderr
    assert f"{name}: is not a variable gpukit knows (set in {t4}:{len(lines) + 1})" in out, out
    if meant:
        assert f"did you mean {meant!r}?" in out
    assert "Traceback" not in out


def test_a_cluster_wide_misspelling_is_reported_once(tmp_path: Path) -> None:
    root = _lab_copy(tmp_path)
    all_vars = root / "group_vars" / "all.yml"
    all_vars.write_text(all_vars.read_text() + "\ngpukit_kubeconfg: /nowhere\n")
    with pytest.raises(inv.InventoryError) as err:
        inv.load(root)
    strays = [p for p in err.value.problems if p.variable == "gpukit_kubeconfg"]
    assert len(strays) == 1 and strays[0].host is None  # two GPU hosts see it, one problem
    assert "did you mean 'gpukit_kubeconfig'?" in str(strays[0])


def test_names_outside_gpukits_namespaces_are_left_alone(tmp_path: Path) -> None:
    root = _lab_copy(tmp_path)
    all_vars = root / "group_vars" / "all.yml"
    all_vars.write_text(all_vars.read_text() + "\nmy_team_setting: 1\nansible_user_x: 2\n")
    assert inv.load(root).node("gpu-t4").node_name == "gpu-t4"


@pytest.mark.parametrize("inventory", ["lab", "example"])
def test_the_shipped_inventories_use_only_known_names(inventory: str) -> None:
    assert _check(REPO / "inventories" / inventory).returncode == 0


def test_the_shipped_reference_is_the_collections() -> None:
    # Written by `python -m gpukit.inventory.known_variables`: a role option or a name a
    # playbook reads that is missing here would be refused in every user's inventory.
    import yaml

    assert yaml.safe_load(known_variables.DATA.read_text()) == known_variables.scan()
    _, known = known_variables.reference()
    assert {"gpukit_device_plugin_config", "nvidia_driver_branch", "gpukit_upgrade_serial",
            "device_plugin_image", "container_toolkit_cdi"} <= known
