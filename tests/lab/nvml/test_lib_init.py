"""nvmlInit/nvmlShutdown, system queries, and what happens with a missing or malformed profile:
an NVML error code and a message naming the file and the field, never a crash."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from nvmltest import nvml_error, run_py

from gpukit.lab import nvml as mock

pytestmark = pytest.mark.nvml


def test_init_shutdown_refcount(nvml: Any) -> None:
    nvml.nvmlInit()  # second reference
    nvml.nvmlShutdown()
    assert nvml.nvmlDeviceGetCount() == 8  # still initialised
    nvml.nvmlShutdown()
    nvml_error(nvml, nvml.NVML_ERROR_UNINITIALIZED, nvml.nvmlDeviceGetCount)
    nvml_error(nvml, nvml.NVML_ERROR_UNINITIALIZED, nvml.nvmlShutdown)
    nvml.nvmlInit()  # and again (the fixture shuts down)


def test_all_init_entry_points(mock_lib: Path, nvml_env: dict[str, str]) -> None:
    lib = ctypes.CDLL(str(mock_lib))
    assert lib.nvmlInit() == 0
    assert lib.nvmlInit_v2() == 0
    assert lib.nvmlInitWithFlags(0) == 0
    count_v1, count_v2 = ctypes.c_uint(), ctypes.c_uint()
    assert lib.nvmlDeviceGetCount(ctypes.byref(count_v1)) == 0
    assert lib.nvmlDeviceGetCount_v2(ctypes.byref(count_v2)) == 0
    assert count_v1.value == count_v2.value == 8
    assert [lib.nvmlShutdown() for _ in range(4)] == [0, 0, 0, 1]  # 1: UNINITIALIZED


def test_system_versions(nvml: Any) -> None:
    assert nvml.nvmlSystemGetDriverVersion() == "550.90.07"
    assert nvml.nvmlSystemGetNVMLVersion() == "12.550.90.07"
    assert nvml.nvmlSystemGetCudaDriverVersion() == 12040
    assert nvml.nvmlSystemGetCudaDriverVersion_v2() == 12040


def test_error_strings(nvml: Any) -> None:
    assert nvml.nvmlErrorString(nvml.NVML_ERROR_NOT_SUPPORTED) == "Not Supported"
    assert nvml.nvmlErrorString(nvml.NVML_ERROR_IN_USE) == "In use by another client"
    assert nvml.nvmlErrorString(nvml.NVML_ERROR_GPU_IS_LOST) == "GPU is lost"
    assert str(nvml.NVMLError(nvml.NVML_ERROR_INSUFFICIENT_RESOURCES)) == "Insufficient resources"


def test_missing_profile(
    mock_lib: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    import pynvml

    missing = tmp_path / "nope" / "profile.yaml"
    monkeypatch.setenv(mock.ENV_PROFILE, str(missing))
    monkeypatch.setenv(mock.ENV_STATE_DIR, str(tmp_path / "state"))
    mock.load_mock(mock_lib)
    nvml_error(pynvml, pynvml.NVML_ERROR_DRIVER_NOT_LOADED, pynvml.nvmlInit)
    err = capfd.readouterr().err
    assert str(missing) in err and "No such file" in err


def test_default_profile_path_is_the_lab_nodes(
    mock_lib: Path, tmp_path: Path, nvml_env: dict[str, str]
) -> None:
    env = dict(nvml_env)
    del env[mock.ENV_PROFILE]
    proc = run_py(
        """
        import pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            print(e.value)
        """,
        env,
    )
    if Path("/etc/gpukit-lab/nvml/profile.yaml").exists():
        pytest.skip("this machine is a lab node")
    assert proc.stdout.strip() == "9"
    assert "/etc/gpukit-lab/nvml/profile.yaml" in proc.stderr


BASE: dict[str, Any] = {
    "name": "tiny",
    "driver_version": "550.90.07",
    "cuda_driver_version": "12.4",
    "numa_nodes": [{"id": 0, "cpus": "0-7"}],
    "defaults": {
        "name": "NVIDIA A100-SXM4-40GB",
        "pci_device_id": 0x20B010DE,
        "memory_mib": 40960,
        "compute_capability": "8.0",
        "architecture": "ampere",
        "mig_table": "A100-SXM4-40GB",
        "numa_node": 0,
        "nvlink_links": 12,
    },
    "gpus": [
        {"pci_bus_id": "00000000:07:00.0", "nvlink_peers": [1]},
        {"pci_bus_id": "00000000:0F:00.0", "nvlink_peers": [0]},
    ],
}


def _variant(change: str) -> str:
    doc: dict[str, Any] = yaml.safe_load(yaml.safe_dump(BASE))
    d, g0, g1 = doc["defaults"], doc["gpus"][0], doc["gpus"][1]
    if change == "syntax":
        return "name: tiny\ngpus: [\n  {pci_bus_id: 1\n"
    if change == "memory":
        g1["memory_mib"] = "lots"
    elif change == "unknown_field":
        g0["numa_nod"] = 1
    elif change == "missing_bus_id":
        del g1["pci_bus_id"]
    elif change == "mig_table":
        d["mig_table"] = "A100-SXM4-41GB"
    elif change == "duplicate_bus":
        g1["pci_bus_id"] = "0000:07:00.0"
    elif change == "asymmetric_nvlink":
        g1["nvlink_peers"] = []
    elif change == "no_driver":
        del doc["driver_version"]
    elif change == "empty_gpus":
        doc["gpus"] = []
    elif change == "uuid_in_defaults":
        d["uuid"] = "GPU-00000000-0000-0000-0000-000000000000"
    elif change == "cuda":
        doc["cuda_driver_version"] = "twelve"
    elif change == "numa":
        g1["numa_node"] = 3
    elif change == "cc":
        d["compute_capability"] = 8
    elif change == "mig_without_table":
        d["mig_table"] = None
        d["mig_enabled"] = True
    elif change == "arch":
        d["architecture"] = "fermi-ish"
    elif change == "nvlink_version":
        d["nvlink_version"] = "3.5"
    elif change == "fabric_uuid":
        d["fabric"] = {"cluster_uuid": "6f1c2a9e-3b7d", "clique_id": 1}
    elif change == "fabric_state":
        d["fabric"] = {"cluster_uuid": "6f1c2a9e-3b7d-4e58-a0c4-9d21e5b7f360", "state": "done"}
    elif change == "fabric_unknown_field":
        g0["fabric"] = {"cluster_uuid": "6f1c2a9e-3b7d-4e58-a0c4-9d21e5b7f360", "clique": 1}
    elif change == "fabric_no_uuid":
        g0["fabric"] = {"clique_id": 1}
    elif change.startswith("switch_"):
        _switch_variant(change, doc)
    return yaml.safe_dump(doc, sort_keys=False)


def _switch_variant(change: str, doc: dict[str, Any]) -> None:
    """The base wired through one NVSwitch, then broken as `change` says."""
    switch: dict[str, Any] = {"pci_bus_id": "00000000:C4:00.0", "pci_device_id": 0x1AF110DE}
    doc["nvswitches"] = [switch]
    for g in doc["gpus"]:
        g["nvlink_peers"] = []
    doc["defaults"]["nvlink_switches"] = [0]
    if change == "switch_index":
        doc["gpus"][1]["nvlink_switches"] = [0, 1]
    elif change == "switch_and_peers":
        doc["gpus"][0]["nvlink_peers"] = [1]
    elif change == "switch_bus_is_gpu":
        switch["pci_bus_id"] = "0000:0F:00.0"
    elif change == "switch_missing_id":
        del switch["pci_device_id"]
    elif change == "switch_unknown_field":
        switch["uuid"] = "NVSwitch-0"
    elif change == "switch_not_a_list":
        doc["defaults"]["nvlink_switches"] = 0
    elif change == "switch_without_links":
        del doc["defaults"]["nvlink_links"]


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ("syntax", "", "not valid YAML"),
        ("memory", "gpus[1].memory_mib", "expected a non-negative integer, got 'lots'"),
        ("unknown_field", "gpus[0].numa_nod", "unknown field"),
        ("missing_bus_id", "gpus[1].pci_bus_id", "missing"),
        ("mig_table", "defaults.mig_table", "known: A100-SXM4-40GB, A100-80GB, H100-80GB"),
        ("duplicate_bus", "gpus[1]", "also used by gpus[0]"),
        ("asymmetric_nvlink", "gpus[0]", "nvlink_peers: GPU 1 does not list 0 back"),
        ("no_driver", "driver_version", "missing"),
        ("empty_gpus", "gpus", "the list is empty"),
        ("uuid_in_defaults", "defaults", "per GPU"),
        ("cuda", "cuda_driver_version", "twelve"),
        ("numa", "gpus[1]", "numa_node 3 is not listed"),
        ("cc", "defaults.compute_capability", "MAJOR.MINOR"),
        ("mig_without_table", "gpus[0]", "needs a mig_table"),
        ("arch", "defaults.architecture", "unknown architecture 'fermi-ish'"),
        ("nvlink_version", "defaults.nvlink_version", "expected an NVLink version (1.0, 2.0"),
        ("fabric_uuid", "defaults.fabric.cluster_uuid", "expected a UUID (16 bytes)"),
        ("fabric_state", "defaults.fabric.state", "expected one of not_supported, not_started"),
        ("fabric_unknown_field", "gpus[0].fabric.clique", "unknown field (fabric fields"),
        ("fabric_no_uuid", "gpus[0].fabric", "needs cluster_uuid"),
        ("switch_index", "gpus[1]", "nvlink_switches: 1 is not an NVSwitch of this node"),
        ("switch_and_peers", "gpus[0]", "nvlink_peers and nvlink_switches are exclusive"),
        ("switch_bus_is_gpu", "nvswitches[0]", "pci_bus_id 00000000:0F:00.0 is also used by "
                                               "gpus[1]"),
        ("switch_missing_id", "nvswitches[0]", "needs both pci_bus_id and pci_device_id"),
        ("switch_unknown_field", "nvswitches[0].uuid", "unknown field (NVSwitch fields"),
        ("switch_not_a_list", "defaults.nvlink_switches", "expected a list of NVSwitch indexes"),
        ("switch_without_links", "gpus[0]", "nvlink_switches needs nvlink_links > 0"),
    ],
)
def test_malformed_profile_names_file_and_field(
    change: str,
    field: str,
    words: str,
    mock_lib: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    import pynvml

    path = tmp_path / "bad-profile.yaml"
    path.write_text(_variant(change))
    monkeypatch.setenv(mock.ENV_PROFILE, str(path))
    monkeypatch.setenv(mock.ENV_STATE_DIR, str(tmp_path / "state"))
    mock.load_mock(mock_lib)
    with pytest.raises(pynvml.NVMLError) as e:
        pynvml.nvmlInit()
    assert e.value.value == pynvml.NVML_ERROR_UNKNOWN
    err = capfd.readouterr().err
    assert err.startswith("gpukit mock NVML: ")
    assert f"{path}: {field}" in err, err
    assert words in err, err
    nvml_error(pynvml, pynvml.NVML_ERROR_UNINITIALIZED, pynvml.nvmlDeviceGetCount)


def test_valid_variant_base_profile_loads(nvml_with_profile: Callable[[dict[str, Any]], Any]
                                          ) -> None:
    """The base used above is itself valid (so each failure above is the change's)."""
    pynvml = nvml_with_profile(BASE)
    assert pynvml.nvmlDeviceGetCount() == 2
    h = pynvml.nvmlDeviceGetHandleByIndex(1)
    assert pynvml.nvmlDeviceGetPciInfo(h).busId == "00000000:0F:00.0"


def test_corrupt_state_file_is_reported(
    mock_lib: Path, nvml_env: dict[str, str], state_dir: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    import pynvml

    state_dir.mkdir(parents=True)
    (state_dir / "state").write_text("gpukit-nvml-state 1\ngpu zero\n")
    mock.load_mock(mock_lib)
    nvml_error(pynvml, pynvml.NVML_ERROR_CORRUPTED_INFOROM, pynvml.nvmlInit)
    err = capfd.readouterr().err
    assert f"{state_dir}/state: corrupt state (line 2" in err
