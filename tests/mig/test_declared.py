"""A layout against declared GPUs (gpukit.mig.declared): what the inventory model uses."""

from __future__ import annotations

from typing import Any

from gpukit.contracts import mig_parted
from gpukit.mig.declared import GpuMig, layout_gpus

A100 = "NVIDIA A100-SXM4-40GB"


def _entries(*entries: dict[str, Any]) -> Any:
    return mig_parted.parse({"l": list(entries)}).select("l")


def test_each_gpu_gets_its_entry_and_the_rest_stay_off() -> None:
    gpus, problems = layout_gpus(_entries(
        {"devices": [1], "mig-enabled": True, "mig-devices": {"3g.20gb": 1, "1g.5gb.me": 1}},
        {"devices": [2], "mig-enabled": False}), A100, 3)
    assert problems == []
    assert gpus == (GpuMig(0, False), GpuMig(1, True, ("1g.5gb+me", "3g.20gb")),
                    GpuMig(2, False))


def test_a_product_filter_selects_only_that_model() -> None:
    other = _entries({"devices": "all", "device-filter": "A100-SXM4-80GB", "mig-enabled": True,
                      "mig-devices": {"3g.40gb": 2}})
    gpus, problems = layout_gpus(other, A100, 2)
    assert problems == [] and not any(g.mig_enabled for g in gpus)
    same = _entries({"devices": "all", "device-filter": A100, "mig-enabled": True,
                     "mig-devices": {"3g.20gb": 2}})
    gpus, _ = layout_gpus(same, A100, 2)
    assert [g.profiles for g in gpus] == [("3g.20gb", "3g.20gb")] * 2


def test_problems_name_the_entry_field_and_value() -> None:
    _, problems = layout_gpus(_entries(
        {"devices": [0, 4], "mig-enabled": True, "mig-devices": {"3g.40gb": 1}},
        {"devices": [0], "mig-enabled": True, "mig-devices": {"4g.20gb": 1, "3g.20gb": 2}}),
        A100, 2)
    texts = [f"{p.path}: {p.value!r} {p.message}" for p in problems]
    assert texts[0] == ("mig-configs.l[0].devices: 4 is not a GPU of this node "
                        "(gpukit_gpu.count is 2: indices 0-1)")
    assert texts[1].startswith("mig-configs.l[0].mig-devices: '3g.40gb' is not a MIG profile "
                               "of A100-SXM4-40GB (known: 1g.5gb")
    assert texts[2] == "mig-configs.l[1].devices: 0 is already laid out by mig-configs.l[0]"
    assert texts[3].startswith("mig-configs.l[1].mig-devices: {'4g.20gb': 1, '3g.20gb': 2} "
                               "does not fit on one A100-SXM4-40GB (")
    assert len(texts) == 4


def test_mig_on_a_model_without_a_table() -> None:
    _, problems = layout_gpus(_entries({"devices": "all", "mig-enabled": True}), "Tesla T4", 1)
    assert [(p.path, p.message) for p in problems] == [
        ("mig-configs.l[0].mig-enabled", "but Tesla T4 is not MIG capable")]
