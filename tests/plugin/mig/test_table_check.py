"""The MIG table held to the driver before a GPU is planned (gpukit/plugin/nvml/mig.py check_table),
against the mock NVML, in-process: the shipped tables agree with it; a table the driver
contradicts (sliceCount, instanceCount, memorySizeMB, placements) is refused for that GPU with
the profile, field and both values named (CLI: exit 2); multiprocessor and engine counts only
warn; a table profile the driver does not offer cannot be planned, by name, while the rest plans
and applies.

The mock is built from the shipped gpukit/contracts/mig_profiles.yaml; the Python side is given a
modified copy (``mig_profiles.load`` of a file, patched in for ``mig_profiles.tables``), so the
two disagree exactly where a test says."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest
import yaml
from migtest import MockNode

from gpukit.contracts import mig_parted as schema
from gpukit.contracts import mig_profiles
from gpukit.mig.planner import LayoutError, plan
from gpukit.mig.state import TableMismatch
from gpukit.plugin.mig import cli
from gpukit.plugin.mig.applier import apply
from gpukit.plugin.mig.export import export_warnings
from gpukit.plugin.nvml.mig import TableCheck, check_table, compare_profile

pytestmark = pytest.mark.nvml

H100 = "GPU 0 (NVIDIA H100 80GB HBM3)"


def use_table(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
              change: Callable[[dict[str, Any]], None]) -> mig_profiles.MigTables:
    """Make the Python side read a copy of the shipped table file changed by ``change``."""
    doc = yaml.safe_load(mig_profiles.DATA_FILE.read_text())
    change(doc)
    path = tmp_path / "mig_profiles.yaml"
    path.write_text(yaml.safe_dump(doc))
    tables = mig_profiles.load(path)
    monkeypatch.setattr(mig_profiles, "tables", lambda: tables)
    return tables


def profile_of(doc: dict[str, Any], gpu: str, name: str) -> dict[str, Any]:
    (p,) = [p for p in doc["gpus"][gpu]["gpu_instance_profiles"] if p["name"] == name]
    return p


def setter(name: str, key: str, value: object) -> Callable[[dict[str, Any]], None]:
    def change(doc: dict[str, Any]) -> None:
        profile_of(doc, "H100-80GB", name)[key] = value
    return change


def one(devices: object, layout: dict[str, int]) -> schema.MigConfigs:
    return schema.parse({"x": [{"devices": devices, "mig-enabled": True, "mig-devices": layout}]})


def problems_of(configs: schema.MigConfigs, node: MockNode) -> list[str]:
    with pytest.raises(LayoutError) as e:
        plan(configs, "x", node.gpus())
    return e.value.problems


@pytest.mark.parametrize("profile", ["a100-sxm4-40gb-x8", "a100-80gb-x4", "h100-80gb-x8", "h200-x8",
                                     "b200-x8", "gb200-x4"])
def test_the_shipped_tables_agree_with_the_driver(
    node_factory: Callable[..., MockNode], profile: str, caplog: pytest.LogCaptureFixture
) -> None:
    node = node_factory(profile)
    caplog.set_level(logging.WARNING, logger="gpukit.plugin.mig")
    gpus = node.gpus()
    for g in gpus:
        assert g.table is not None
        assert (g.unavailable_profiles, g.table_mismatches) == ((), ()), g.label()
    assert check_table(0, pynvml.nvmlDeviceGetHandleByIndex(0), gpus[0].table) == TableCheck()
    assert caplog.records == []  # not even an informational difference
    # every profile of the table plans on every GPU
    for p in gpus[0].table.gpu_instance_profiles:
        assert plan(one("all", {p.name: 1}), "x", gpus).changed


@pytest.mark.parametrize(
    ("change", "field", "table_value", "driver_value"),
    [
        (setter("3g.40gb", "memory_mb", 40960), "memorySizeMB", "40960", "40448"),
        (setter("1g.20gb", "max_count", 3), "instanceCount", "3", "4"),
        (setter("2g.20gb", "compute_slices", 3), "sliceCount", "3", "2"),
        (setter("3g.40gb", "placements", [4]), "placements", "[4/4] (start/size)",
         "[0/4, 4/4] (start/size)"),
    ],
    ids=["memory", "instances", "slices", "placements"],
)
def test_a_table_the_driver_contradicts_is_refused(
    h100: MockNode, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
    change: Callable[[dict[str, Any]], None], field: str, table_value: str, driver_value: str,
) -> None:
    use_table(monkeypatch, tmp_path, change)
    name = {"memorySizeMB": "3g.40gb", "instanceCount": "1g.20gb", "sliceCount": "2g.20gb",
            "placements": "3g.40gb"}[field]
    g0 = h100.gpus()[0]
    assert g0.table_mismatches == (
        TableMismatch("H100-80GB", name, field, table_value, driver_value),)
    # refused whatever the layout asks for, on every GPU the config selects; nothing changes
    found = problems_of(one("all", {"7g.80gb": 1}), h100)
    assert len(found) == 8
    assert found[0] == (
        f"{H100}: MIG table H100-80GB, profile {name}: {field} is {table_value} in the table, "
        f"{driver_value} by the driver; the table does not describe this GPU, refusing to plan "
        "mig-configs.x[0] on it")
    with pytest.raises(LayoutError):
        apply(one([0], {"7g.80gb": 1}), "x", h100.backend, h100.reset)
    assert h100.layout()[0] == (False, False, ())
    # leaving MIG off where it is off needs no table; export says what is wrong
    off = schema.parse({"off": [{"devices": "all", "mig-enabled": False}]})
    assert not plan(off, "off", h100.gpus()).changed
    assert any(w.startswith(f"{H100}: MIG table H100-80GB, profile {name}: {field}")
               for w in export_warnings(h100.gpus()))


def test_the_cli_refuses_with_exit_2(
    h100: MockNode, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    use_table(monkeypatch, tmp_path, setter("3g.40gb", "memory_mb", 40960))
    configs = json.dumps({"x": [{"devices": [0], "mig-enabled": True,
                                 "mig-devices": {"3g.40gb": 2}}]})
    for command in ("plan", "apply"):
        capsys.readouterr()
        rc = cli.main([command, "--configs-json", configs, "--selected", "x", "--json",
                       "--pause-file", ""])
        doc = json.loads(capsys.readouterr().out)
        assert rc == 2 and doc["exit_code"] == 2 and doc["failed"] is True
        assert doc["problems"] == [
            f"{H100}: MIG table H100-80GB, profile 3g.40gb: memorySizeMB is 40960 in the table, "
            "40448 by the driver; the table does not describe this GPU, refusing to plan "
            "mig-configs.x[0] on it"]
    assert h100.layout()[0] == (False, False, ())


def test_informational_differences_are_logged_once_not_refused(
    h100: MockNode, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def change(doc: dict[str, Any]) -> None:
        p = profile_of(doc, "H100-80GB", "3g.40gb")
        p["multiprocessors"] = 63
        p["engines"]["jpeg"] = 2

    use_table(monkeypatch, tmp_path, change)
    caplog.set_level(logging.WARNING, logger="gpukit.plugin.mig")
    gpus = h100.gpus()
    assert all(g.table_mismatches == () for g in gpus)
    h100.gpus()  # read again: checked once per GPU
    texts = [r.getMessage() for r in caplog.records]
    assert len(texts) == 16
    assert texts[0] == (f"{H100}: MIG table H100-80GB, profile 3g.40gb: multiprocessorCount is "
                        "63 in the table, 60 by the driver (informational)")
    assert texts[1] == (f"{H100}: MIG table H100-80GB, profile 3g.40gb: jpegCount is 2 in the "
                        "table, 3 by the driver (informational)")
    assert plan(one("all", {"3g.40gb": 2}), "x", gpus).changed


def _extra_profile(doc: dict[str, Any]) -> None:
    """A profile the (mock's) driver does not offer: NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1."""
    doc["gpus"]["H100-80GB"]["gpu_instance_profiles"].append({
        "name": "2g.20gb+me", "nvml_constant": "NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1",
        "profile_id": 8, "driver_id": 21, "compute_slices": 2, "memory_slices": 2,
        "multiprocessors": 32, "memory_mb": 20096, "max_count": 1, "placements": [0, 2, 4],
        "engines": {"copy": 2, "decoder": 2, "encoder": 0, "jpeg": 2, "ofa": 1}})


def _without_1g_20gb(monkeypatch: pytest.MonkeyPatch) -> None:
    """An older driver: NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2 (1g.20gb) NOT_SUPPORTED."""
    real = pynvml.nvmlDeviceGetGpuInstanceProfileInfo

    def info(handle: Any, profile: int, version: int = 2) -> Any:
        if profile == pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return real(handle, profile, version)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetGpuInstanceProfileInfo", info)


@pytest.mark.parametrize(("missing", "offered"), [
    ("2g.20gb+me", "1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb"),
    ("1g.20gb", "1g.10gb, 1g.10gb+me, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb"),
], ids=["table-profile-the-driver-lacks", "older-driver"])
def test_a_profile_the_driver_does_not_offer_is_unavailable(
    h100: MockNode, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, missing: str, offered: str,
) -> None:
    if missing == "2g.20gb+me":
        use_table(monkeypatch, tmp_path, _extra_profile)
    else:
        _without_1g_20gb(monkeypatch)
    g0 = h100.gpus()[0]
    assert (g0.unavailable_profiles, g0.table_mismatches) == ((missing,), ())
    # a layout asking for it is refused by name...
    found = problems_of(one([0], {missing: 1, "3g.40gb": 1}), h100)
    assert found == [
        f"mig-configs.x[0].mig-devices.{missing}: {H100}: the driver does not offer MIG profile "
        f"{missing} on this GPU (NOT_SUPPORTED; an older driver may lack it; offered: "
        f"{offered})"]
    # ...while the others plan and apply
    p = plan(one([0], {"3g.40gb": 1, "2g.20gb": 2}), "x", h100.gpus())
    assert p.to_json()["gpus"][0]["unavailable_profiles"] == [missing]
    apply(one([0], {"3g.40gb": 1, "2g.20gb": 2}), "x", h100.backend, h100.reset)
    assert h100.layout()[0] == (True, True, ("2g.20gb@0/1ci", "2g.20gb@2/1ci", "3g.40gb@4/1ci"))


def test_compare_profile_without_placements_warns() -> None:
    table = mig_profiles.gpu("H100-80GB")
    p = table.gpu_instance_profile("1g.10gb")
    info = SimpleNamespace(
        id=19, sliceCount=1, instanceCount=7, memorySizeMB=9984, multiprocessorCount=16,
        copyEngineCount=1, decoderCount=1, encoderCount=0, jpegCount=1, ofaCount=0,
        name=b"MIG 1g.10gb")
    assert compare_profile(table, p, info, [(i, 1) for i in range(7)]) == ([], [])
    mismatches, warnings = compare_profile(table, p, info, None)
    assert mismatches == [] and warnings == [
        "MIG table H100-80GB, profile 1g.10gb: the driver did not report its possible "
        "placements; placements not checked"]
    info.name, info.id = b"MIG 1g.12gb", 20
    mismatches, warnings = compare_profile(table, p, info, [(i, 1) for i in range(6)])
    assert [m.field for m in mismatches] == ["placements"]
    assert warnings == [
        "MIG table H100-80GB, profile 1g.10gb: id (the driver's profile id) is 19 in the table, "
        "20 by the driver (informational)",
        "MIG table H100-80GB, profile 1g.10gb: name is MIG 1g.10gb in the table, MIG 1g.12gb by "
        "the driver (informational)"]
