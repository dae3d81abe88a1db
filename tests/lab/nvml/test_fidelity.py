"""The mock NVML held to a real driver: what an NVIDIA H100 80GB HBM3 on driver 580.159.04 (MIG
disabled) answered to gpukit.lab.nvml.fidelity's read-only calls, recorded in
data/h100-80gb-hbm3.driver-580.159.04.json, must be what the mock's h100-80gb-x8 node answers,
by the rules recorded with each answer; and gpukit/contracts/mig_profiles.yaml's H100-80GB table must
say what that driver says, field by field, so the table itself is held to the driver, not only
the mock built from it."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpukit.contracts import mig_profiles
from gpukit.lab import nvml as mock
from gpukit.lab.nvml import fidelity

pytestmark = pytest.mark.nvml

REAL_RECORD = Path(__file__).parent / "data" / "h100-80gb-hbm3.driver-580.159.04.json"
MOCK_PROFILE = "h100-80gb-x8"


@pytest.fixture(scope="module")
def real() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(REAL_RECORD.read_text())
    return doc


@pytest.fixture(scope="module")
def mock_record(mock_lib: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The recorder run against the mock in its own process (pynvml finds the mock through
    LD_LIBRARY_PATH), on GPU 0 of the H100 node, with a fresh state dir."""
    tmp = tmp_path_factory.mktemp("fidelity")
    out = tmp / "mock.json"
    env = mock.env(MOCK_PROFILE, tmp / "state", library=mock_lib)
    proc = subprocess.run(
        [sys.executable, "-m", "gpukit.lab.nvml.fidelity", "record", "--out", str(out),
         "--index", "0"],
        env=env, cwd=mock.REPO_ROOT, capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc: dict[str, Any] = json.loads(out.read_text())
    return doc


def entries(record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["key"]: e for e in record["entries"]}


# ---- the mock against the driver --------------------------------------------------------------


def test_the_mock_answers_as_the_real_h100_does(
    real: dict[str, Any], mock_record: dict[str, Any]
) -> None:
    assert fidelity.compare(real, mock_record) == []


def test_the_record_takes_nvlink_version_and_fabric_info(
    real: dict[str, Any], mock_record: dict[str, Any]
) -> None:
    """The recorder asks the NVLink version (held exactly: the model fixes it) and the fabric
    info (info: the machine decides). The H100 record predates both; a new record from a real
    H100 or H200 will hold the mock's NVML_NVLINK_VERSION_4_0 (6) to the driver's answer."""
    got = entries(mock_record)
    assert got["device.nvlink_version[0]"]["rule"] == "exact"
    assert got["device.nvlink_version[0]"]["value"] == 6
    assert got["device.gpu_fabric_info"]["rc"] == "NVML_ERROR_NOT_SUPPORTED"
    assert got["device.gpu_fabric_info_v.v2"]["rule"] == "info"
    # Not in the 580.159.04 record: nothing to compare yet (compare skips what the driver's
    # record lacks). When a record has it, test_the_mock_answers_as_the_real_h100_does checks it.
    recorded = entries(real).get("device.nvlink_version[0]")
    if recorded is not None and recorded["rc"] == "NVML_SUCCESS":
        assert recorded["value"] == got["device.nvlink_version[0]"]["value"]


def test_the_record_is_a_real_h100_with_mig_disabled(real: dict[str, Any]) -> None:
    e = entries(real)
    assert e["device.name"]["value"] == "NVIDIA H100 80GB HBM3"
    assert e["system.driver_version"]["value"] == "580.159.04"
    assert e["mig.mode"]["value"] == [0, 0]
    # what the comparison rests on: exact answers for the MIG table of every profile constant
    for const in range(18):
        for version in (1, 2):
            assert e[f"mig.gi_profile[{const}].v{version}"]["rule"] == "exact"


def test_compare_catches_a_mock_that_answers_otherwise(
    real: dict[str, Any], mock_record: dict[str, Any]
) -> None:
    """The comparison can fail: each kind of deviation in a mock record is reported."""
    assert fidelity.compare(real, real) == []
    bad = copy.deepcopy(mock_record)
    e = entries(bad)
    e["mig.gi_profile[2].v2"]["value"]["multiprocessorCount"] = 48  # the table's old SM count
    e["mig.gi_profile[0].v1"]["value"]["id"] = 0  # the constant where the driver's id belongs
    e["mig.gi_profile[17].v1"]["rc"] = "NVML_ERROR_NOT_SUPPORTED"  # wrong error code
    e["device.supported_event_types"]["value"] = 31
    e["device.uuid"]["value"] = "GPU-not-a-uuid"  # breaks the recorded pattern
    e["device.minor_number"]["value"] = "0"  # another type than the driver's
    e["device.temperature"]["value"] = 99  # a `code` entry: drift is fine
    bad["entries"] = [x for x in bad["entries"] if x["key"] != "mig.gi_profile[9].placements"]
    problems = fidelity.compare(real, bad)
    assert len(problems) == 7, problems
    want = [
        r"^mig\.gi_profile\[2\]\.v2: .*'multiprocessorCount': 48.*, the driver .*: 60",
        r"^mig\.gi_profile\[0\]\.v1: .*'id': 0.*, the driver .*'id': 19",
        r"^mig\.gi_profile\[17\]\.v1: returns NVML_ERROR_NOT_SUPPORTED, "
        r"the driver NVML_ERROR_INVALID_ARGUMENT$",
        r"^device\.supported_event_types: 31, the driver 65439$",
        r"^device\.uuid: 'GPU-not-a-uuid' does not match ",
        r"^device\.minor_number: shaped str, the driver's int$",
        r"^mig\.gi_profile\[9\]\.placements: not answered by the mock$",
    ]
    for pattern in want:
        assert any(re.search(pattern, p) for p in problems), (pattern, problems)


def test_compare_cli_exit_status(
    real: dict[str, Any], mock_record: dict[str, Any], tmp_path: Path
) -> None:
    good = tmp_path / "mock.json"
    good.write_text(json.dumps(mock_record))
    assert fidelity.main(["compare", str(REAL_RECORD), str(good)]) == 0
    bad_doc = copy.deepcopy(mock_record)
    entries(bad_doc)["mig.gi_profile[4].placements"]["value"] = [[0, 7]]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(bad_doc))
    assert fidelity.main(["compare", str(REAL_RECORD), str(bad)]) == 1


# ---- the table against the driver -------------------------------------------------------------


def _table_info(p: mig_profiles.GpuInstanceProfile, version: int) -> dict[str, Any]:
    """What the table says NVML's profile info is (nvmlGpuInstanceProfileInfo_t / _v2_t)."""
    info: dict[str, Any] = {
        "id": p.driver_id,
        "isP2pSupported": 0,  # the table has no P2P profile; the mock answers 0 for all
        "sliceCount": p.compute_slices,
        "instanceCount": p.max_count,
        "multiprocessorCount": p.multiprocessors,
        "copyEngineCount": p.engines.copy,
        "decoderCount": p.engines.decoder,
        "encoderCount": p.engines.encoder,
        "jpegCount": p.engines.jpeg,
        "ofaCount": p.engines.ofa,
        "memorySizeMB": p.memory_mb,
    }
    if version == 2:
        info["name"] = f"MIG {p.name}"
    return info


def test_the_h100_table_is_what_the_driver_says(real: dict[str, Any]) -> None:
    e = entries(real)
    table = mig_profiles.for_product(e["device.name"]["value"])
    assert table is not None and table.key == "H100-80GB"
    answered = {
        const for const in range(18)
        if e[f"mig.gi_profile[{const}].v2"]["rc"] == "NVML_SUCCESS"
    }
    assert answered == {p.profile_id for p in table.gpu_instance_profiles}
    for p in table.gpu_instance_profiles:
        key = f"mig.gi_profile[{p.profile_id}]"
        for version in (1, 2):
            driver = e[f"{key}.v{version}"]["value"]
            assert driver == _table_info(p, version), (p.name, version)
        assert e[f"{key}.placements"]["value"] == [[pl.start, pl.size] for pl in p.placements]
        # MIG disabled: nothing created, so all of each profile remains
        assert e[f"{key}.remaining_capacity"]["value"] == p.max_count
        assert e[f"{key}.instances"]["value"] == 0
    # the whole GPU: the full profile owns every engine and SM the table gives the GPU
    full = table.gpu_instance_profile("7g.80gb")
    assert (full.multiprocessors, full.engines) == (table.multiprocessors, table.engines)

