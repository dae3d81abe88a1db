"""NVIDIA's ResourceSlice device-name rule, built and parsed in one place (contracts.dra)."""

from __future__ import annotations

import re

import pytest

from gpukit.contracts import dra


def test_a_whole_gpu_is_named_by_its_minor() -> None:
    assert dra.gpu_device_name(3) == "gpu-3"
    assert dra.parse_device_name("gpu-3") == dra.DeviceName(3)
    assert not dra.DeviceName(3).is_mig


@pytest.mark.parametrize(("profile", "gi", "start", "name", "part"), [
    ("1g.5gb", 19, 4, "gpu-0-mig-1g5gb-19-4", "1g5gb"),
    ("3g.20gb", 9, 4, "gpu-0-mig-3g20gb-9-4", "3g20gb"),
    ("1g.10gb+me", 20, 6, "gpu-0-mig-1g10gb-me-20-6", "1g10gb-me"),
    ("7g.80gb", 0, 0, "gpu-0-mig-7g80gb-0-0", "7g80gb"),
])
def test_a_mig_device_round_trips(profile: str, gi: int, start: int, name: str,
                                  part: str) -> None:
    assert dra.mig_device_name(0, profile, gi, start) == name
    parsed = dra.parse_device_name(name)
    assert parsed == dra.DeviceName(0, part, gi, start)
    assert parsed is not None and parsed.is_mig
    assert re.fullmatch(dra.device_name_pattern(profile, gi), name)
    assert not re.fullmatch(dra.device_name_pattern(), name)


@pytest.mark.parametrize("name", ["gpu", "gpu-", "gpu-x", "mig-0", "gpu-0-mig-1g5gb",
                                  "gpu-0-mig-1g5gb-19", "GPU-0", "gpu-0-extra", "nvidia0"])
def test_other_names_are_not_device_names(name: str) -> None:
    assert dra.parse_device_name(name) is None


def test_the_pattern_tells_profiles_and_gi_ids_apart() -> None:
    name = dra.mig_device_name(1, "1g.5gb", 19, 6)
    assert re.fullmatch(dra.device_name_pattern(), "gpu-12")
    assert not re.fullmatch(dra.device_name_pattern("1g.5gb", 20), name)
    assert not re.fullmatch(dra.device_name_pattern("1g.10gb", 19), name)
