"""`brand`: nvmlDeviceGetBrand read by discovery, named as NVIDIA's tools name it (go-nvlib's
GetBrandAsString) and published on every ResourceSlice device, as NVIDIA's DRA driver does."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest
from plugin_testlib import T4, make_gpu, make_inventory

from gpukit.plugin import nvml
from gpukit.plugin.dra.slice_devices import Placement, node_slice_devices

REPO = Path(__file__).resolve().parents[3]
LIB = Path(os.environ.get("GPUKIT_NVML_LIB") or REPO / "build" / "nvml" / "libnvidia-ml.so.1")


def test_gpus_and_mig_devices_carry_their_gpus_brand() -> None:
    gpu = replace(make_gpu(0, migs=("3g.20gb",)), brand="Nvidia")
    node = make_inventory([gpu, replace(make_gpu(1, name=T4), brand="Tesla"), make_gpu(2)])
    devices = {d.name: d.body["attributes"]
               for d in node_slice_devices(node, {(gpu.uuid, 1): Placement(4, 4)})}
    assert devices["gpu-0-mig-3g20gb-9-4"]["brand"] == {"string": "Nvidia"}
    assert devices["gpu-1"]["brand"] == {"string": "Tesla"}
    assert "brand" not in devices["gpu-2"]  # NVML could not tell: left out, not guessed


@pytest.mark.nvml
@pytest.mark.skipif(not LIB.exists(), reason="mock NVML not built (make nvml)")
@pytest.mark.parametrize(("brand", "expected"), [("nvidia", "Nvidia"), ("tesla", "Tesla"),
                                                 ("nvidia_rtx", "NvidiaRTX")])
def test_discovery_reads_the_brand(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                   brand: str, expected: str) -> None:
    from gpukit.lab.nvml import load_mock, profile_path

    profile = tmp_path / "profile.yaml"
    profile.write_text(profile_path("t4-x2").read_text().replace("brand: nvidia",
                                                                 f"brand: {brand}"))
    monkeypatch.setenv("GPUKIT_NVML_PROFILE", str(profile))
    monkeypatch.setenv("GPUKIT_NVML_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("GPUKIT_NVML_LIB", str(LIB))
    load_mock(LIB)
    nvml.init()
    try:
        node = nvml.discover()
    finally:
        nvml.shutdown()
    assert [g.brand for g in node.gpus] == [expected, expected]
