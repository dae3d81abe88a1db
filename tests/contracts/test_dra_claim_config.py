"""NVIDIA's GpuConfig / MigDeviceConfig accepted as its driver decodes them; errors name the
config entry and the field."""

from __future__ import annotations

from typing import Any

import pytest

from gpukit.contracts import dra_claim_config as opaque

API = "resource.nvidia.com/v1beta1"


def entry(params: Any, requests: list[str] | None = None, source: str = "FromClaim",
          driver: str = "gpu.nvidia.com") -> dict[str, Any]:
    doc: dict[str, Any] = {"source": source, "opaque": {"driver": driver, "parameters": params}}
    if requests is not None:
        doc["requests"] = requests
    return doc


def gpu_config(sharing: Any = None) -> dict[str, Any]:
    doc: dict[str, Any] = {"apiVersion": API, "kind": "GpuConfig"}
    if sharing is not None:
        doc["sharing"] = sharing
    return doc


def test_time_slicing_with_an_interval() -> None:
    cfg = opaque.parse("p", gpu_config({"strategy": "TimeSlicing",
                                        "timeSlicingConfig": {"interval": "Long"}}))
    assert cfg == opaque.DeviceConfig("GpuConfig", opaque.Sharing("TimeSlicing", interval="Long"))
    assert opaque.sharing_env(cfg.sharing) == ["GPUKIT_DRA_SHARING_STRATEGY=TimeSlicing",
                                               "GPUKIT_DRA_TIMESLICE_INTERVAL=Long"]


def test_mps_limits() -> None:
    cfg = opaque.parse("p", gpu_config({"strategy": "MPS", "mpsConfig": {
        "defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "10Gi"}}))
    assert cfg.sharing == opaque.Sharing("MPS", active_thread_percentage=50,
                                         pinned_memory_limit="10Gi")
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50" in opaque.sharing_env(cfg.sharing)


@pytest.mark.parametrize(("params", "message"), [
    ({"apiVersion": "resource.nvidia.com/v1", "kind": "GpuConfig"},
     "p.apiVersion: 'resource.nvidia.com/v1' is not resource.nvidia.com/v1beta1"),
    ({"apiVersion": API, "kind": "TpuConfig"}, "p.kind: 'TpuConfig' is not one of"),
    (gpu_config({"strategy": "Fair"}), "p.sharing.strategy: 'Fair' is not one of TimeSlicing, MPS"),
    (gpu_config({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Fast"}}),
     "p.sharing.timeSlicingConfig.interval: 'Fast' is not one of Default, Short, Medium, Long"),
    (gpu_config({"strategy": "TimeSlicing", "mpsConfig": {}}),
     "p.sharing.mpsConfig: not allowed with strategy TimeSlicing"),
    (gpu_config({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 150}}),
     "p.sharing.mpsConfig.defaultActiveThreadPercentage: 150 is not an integer from 0 to 100"),
    (gpu_config({"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "lots"}}),
     "p.sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: 'lots' is not a quantity"),
    ({**gpu_config(), "replicas": 2}, "p: unknown field(s) replicas"),
    ({"apiVersion": API, "kind": "MigDeviceConfig",
      "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {}}},
     "p.sharing: unknown field(s) timeSlicingConfig"),
])
def test_bad_parameters_are_refused_naming_the_field(params: Any, message: str) -> None:
    with pytest.raises(opaque.ConfigError) as err:
        opaque.parse("p", params)
    assert message in str(err.value)


def test_the_claims_config_wins_over_the_class_and_other_drivers_are_ignored() -> None:
    entries = [
        entry(gpu_config({"strategy": "TimeSlicing"}), source="FromClaim", requests=["a"]),
        entry(gpu_config({"strategy": "MPS"}), source="FromClass"),
        entry({"anything": True}, driver="other.example.com"),
    ]
    got = opaque.configs_by_request(entries, ["a", "b"])
    assert got["a"].sharing is not None and got["a"].sharing.strategy == "TimeSlicing"
    assert got["b"].sharing is not None and got["b"].sharing.strategy == "MPS"


def test_an_error_names_the_entry() -> None:
    with pytest.raises(opaque.ConfigError, match=r"config\[1\] \(FromClaim\)\.opaque\.parameters"
                       r"\.sharing\.strategy"):
        opaque.configs_by_request([entry(gpu_config()), entry(gpu_config({"strategy": "x"}))],
                                  ["r"])


def test_a_config_kind_fits_its_device_type() -> None:
    opaque.check_kind("r", opaque.DeviceConfig("GpuConfig"), is_mig=False)
    with pytest.raises(opaque.ConfigError, match="a GpuConfig cannot configure a MIG device"):
        opaque.check_kind("r", opaque.DeviceConfig("GpuConfig"), is_mig=True)
