"""Placement search over the real tables, and the planner's refusals (GPU, profile, why) —
pure Python: GPUs are described by hand, no NVML needed."""

from __future__ import annotations

import dataclasses

import pytest

from gpukit.contracts import mig_parted as schema
from gpukit.contracts import mig_profiles
from gpukit.mig.placement import PlacementError, Slot, pack
from gpukit.mig.planner import LayoutError, plan
from gpukit.mig.state import GpuInstance, GpuState

A100 = mig_profiles.gpu("A100-SXM4-40GB")
H100 = mig_profiles.gpu("H100-80GB")
H200 = mig_profiles.gpu("H200-141GB")


def where(slots: list[Slot]) -> list[str]:
    return [s.describe() for s in slots]


@pytest.mark.parametrize(
    ("table", "wanted", "expected"),
    [
        (A100, {"3g.20gb": 1, "4g.20gb": 1}, ["4g.20gb@0", "3g.20gb@4"]),
        (A100, {"3g.20gb": 2}, ["3g.20gb@0", "3g.20gb@4"]),
        (A100, {"1g.5gb": 7}, [f"1g.5gb@{i}" for i in range(7)]),
        (A100, {"1g.10gb": 4}, ["1g.10gb@0", "1g.10gb@2", "1g.10gb@4", "1g.10gb@6"]),
        (A100, {"7g.40gb": 1}, ["7g.40gb@0"]),
        # needs backtracking: 3g at 0 leaves slice 7 for a 1g, which has no placement there
        (A100, {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1},
         ["2g.10gb@0", "1g.5gb@2", "1g.5gb@3", "3g.20gb@4"]),
        (A100, {"1g.5gb+me": 1, "1g.5gb": 6}, [*(f"1g.5gb@{i}" for i in range(6)), "1g.5gb+me@6"]),
        (A100, {"2g.10gb": 3, "1g.5gb": 1}, ["2g.10gb@0", "2g.10gb@2", "2g.10gb@4", "1g.5gb@6"]),
        (H100, {"1g.10gb": 7}, [f"1g.10gb@{i}" for i in range(7)]),
        (H100, {"4g.40gb": 1, "3g.40gb": 1}, ["4g.40gb@0", "3g.40gb@4"]),
        (H100, {"1g.20gb": 4}, ["1g.20gb@0", "1g.20gb@2", "1g.20gb@4", "1g.20gb@6"]),
        (H200, {"1g.18gb": 7}, [f"1g.18gb@{i}" for i in range(7)]),
        (H200, {"4g.71gb": 1, "3g.71gb": 1}, ["4g.71gb@0", "3g.71gb@4"]),
    ],
)
def test_packings(table: mig_profiles.MigGpu, wanted: dict[str, int], expected: list[str]
                  ) -> None:
    slots = pack(table, wanted)
    assert where(slots) == expected
    placed = [(table.gpu_instance_profile(s.profile),
               mig_profiles.Placement(s.start, s.size)) for s in slots]
    assert table.fits(placed)


def test_existing_instances_are_reused() -> None:
    # 1g.5gb x2 anywhere: keep the two that exist at odd places instead of moving them
    existing = [Slot(3, 1, "1g.5gb"), Slot(5, 1, "1g.5gb")]
    assert where(pack(A100, {"1g.5gb": 2}, existing)) == ["1g.5gb@3", "1g.5gb@5"]
    # a 3g at 4 is kept; the rest is packed around it
    assert where(pack(A100, {"3g.20gb": 1, "1g.5gb": 2}, [Slot(4, 4, "3g.20gb")])) == [
        "1g.5gb@0", "1g.5gb@1", "3g.20gb@4"]
    # an existing 1g at 1 keeps; a 3g is then placed at 4 (0 would overlap it)
    assert where(pack(A100, {"3g.20gb": 1, "1g.5gb": 1}, [Slot(1, 1, "1g.5gb")])) == [
        "1g.5gb@1", "3g.20gb@4"]
    # not reusable when the layout cannot keep it: 4g needs slices 0-3
    assert where(pack(A100, {"4g.20gb": 1}, [Slot(1, 1, "1g.5gb")])) == ["4g.20gb@0"]


@pytest.mark.parametrize(
    ("wanted", "why"),
    [
        ({"1g.5gb+me": 2}, "1g.5gb+me: 2 requested, at most 1 per GPU"),
        ({"1g.5gb": 8}, "1g.5gb: 8 requested, at most 7 per GPU"),
        ({"4g.20gb": 1, "3g.20gb": 2}, "needs 10 compute slices, the GPU has 7"),
        ({"3g.20gb": 2, "1g.5gb": 1}, "needs 9 memory slices, the GPU has 8"),
        ({"7g.40gb": 1, "1g.5gb+me": 1}, "needs 8 compute slices"),
        ({"9g.90gb": 1}, "9g.90gb: unknown profile (known: 1g.5gb"),
    ],
)
def test_impossible_layouts(wanted: dict[str, int], why: str) -> None:
    with pytest.raises(PlacementError, match=why.replace("+", r"\+").replace("(", r"\(")):
        pack(A100, wanted)


def test_engine_limit_alone() -> None:
    # A table where only the media engines stop two +me instances (max_count raised to 2).
    me = A100.gpu_instance_profile("1g.5gb+me")
    relaxed = dataclasses.replace(me, max_count=2)
    table = dataclasses.replace(A100, gpu_instance_profiles=tuple(
        relaxed if p.name == me.name else p for p in A100.gpu_instance_profiles))
    with pytest.raises(PlacementError, match=r"needs 2 OFA engines \(1g.5gb\+me\), the GPU has 1"):
        pack(table, {"1g.5gb+me": 2})


def a100(index: int, **kw: object) -> GpuState:
    base = GpuState(index=index, uuid=f"GPU-{index}", product="NVIDIA A100-SXM4-40GB",
                    pci_device_id=0x20B010DE, mig_current=False, mig_pending=False)
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def layout_problems(doc: dict[str, object], gpus: list[GpuState]) -> list[str]:
    with pytest.raises(LayoutError) as e:
        plan(schema.parse(doc), next(iter(doc)), gpus)
    return e.value.problems


def test_over_capacity_refused_naming_gpu_and_profile() -> None:
    found = layout_problems(
        {"big": [{"devices": "all", "mig-enabled": True,
                  "mig-devices": {"4g.20gb": 1, "3g.20gb": 2}}]},
        [a100(0), a100(1)])
    assert found == [
        f"GPU {i} (NVIDIA A100-SXM4-40GB): mig-configs.big[0].mig-devices (4g.20gb + 2 x 3g.20gb) "
        "does not fit: needs 10 compute slices, the GPU has 7; needs 12 memory slices, the GPU "
        "has 8" for i in (0, 1)]
    (me,) = layout_problems(
        {"me": [{"devices": [0], "mig-enabled": True, "mig-devices": {"1g.5gb+me": 2}}]},
        [a100(0)])
    assert me == ("GPU 0 (NVIDIA A100-SXM4-40GB): mig-configs.me[0].mig-devices (2 x 1g.5gb+me) "
                  "does not fit: 1g.5gb+me: 2 requested, at most 1 per GPU")


def test_unknown_profile_for_the_product() -> None:
    (p,) = layout_problems(
        {"mixed-a100": [{"devices": [0], "mig-enabled": True, "mig-devices": {"5g.20gb": 1}}]},
        [a100(0)])
    assert p.startswith("mig-configs.mixed-a100[0].mig-devices.5g.20gb: unknown profile for "
                        "NVIDIA A100-SXM4-40GB (GPU 0; known: 1g.5gb, 1g.5gb+me, 1g.10gb")
    (p,) = layout_problems(
        {"h": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb+me": 1}}]},
        [a100(0)])
    assert "1g.10gb+me: unknown profile for NVIDIA A100-SXM4-40GB" in p


@pytest.mark.parametrize("product", ["NVIDIA GH200 144G HBM3e", "NVIDIA H100 PCIe",
                                     "NVIDIA A100-PCIE-40GB", "NVIDIA A100 80GB PCIe"])
def test_a_board_without_its_own_table_is_refused_not_planned(product: str) -> None:
    """A MIG-capable board no table describes: a clear refusal, never another board's plan;
    leaving MIG off where it is off needs no table."""
    gpu = a100(0, product=product, pci_device_id=None)
    (p,) = layout_problems(
        {"x": [{"devices": "all", "mig-enabled": True, "mig-devices": {"3g.40gb": 2}}]}, [gpu])
    assert p.startswith(f"GPU 0 ({product}): no MIG profile table for this product, cannot plan "
                        "mig-configs.x[0]")
    off = plan(schema.parse({"off": [{"devices": "all", "mig-enabled": False}]}), "off", [gpu])
    assert not off.changed


def test_whole_layout_validated_every_gpu_reported() -> None:
    t4 = GpuState(index=2, uuid="GPU-t4", product="Tesla T4")
    found = layout_problems(
        {"x": [{"devices": [0, 1], "mig-enabled": True, "mig-devices": {"7g.40gb": 1}},
               {"devices": [1, 2, 9], "mig-enabled": True}]},
        [a100(0), a100(1), t4])
    assert found == [
        "mig-configs.x[1].devices: GPU 9 does not exist on this node (GPUs 0-2)",
        "GPU 1 (NVIDIA A100-SXM4-40GB): selected by both mig-configs.x[0] and mig-configs.x[1]; "
        "make the entries' devices or device-filter disjoint",
        "GPU 2 (Tesla T4): mig-configs.x[1] sets mig-enabled: true, but this GPU is not MIG "
        "capable (NVML reports no MIG mode); select it with mig-enabled: false or leave it out "
        "of the entry's devices/device-filter",
    ]


def test_device_filter_selects_by_pci_id_and_product() -> None:
    t4 = GpuState(index=1, uuid="GPU-t4", product="Tesla T4", pci_device_id=0x1EB810DE)
    doc = {"f": [
        {"devices": "all", "device-filter": "0x20B010DE", "mig-enabled": True,
         "mig-devices": {"7g.40gb": 1}},
        {"devices": "all", "device-filter": ["Tesla T4"], "mig-enabled": False},
    ]}
    p = plan(schema.parse(doc), "f", [a100(0), t4])
    assert [g.entry for g in p.gpus] == ["mig-configs.f[0]", "mig-configs.f[1]"]
    assert p.gpus[1].note == "not MIG capable" and not p.gpus[1].changed


def test_partial_state_plans_only_the_rest() -> None:
    gi = GpuInstance(id=1, profile="3g.20gb", profile_id=2, start=4, size=4)  # no CI yet
    g = a100(0, mig_current=True, mig_pending=True, gpu_instances=(gi,))
    doc = {"x": [{"devices": "all", "mig-enabled": True, "mig-devices": {"3g.20gb": 2}}]}
    p = plan(schema.parse(doc), "x", [g])
    assert [a.text() for a in p.actions] == [
        "GPU 0: create compute instance 3g.20gb in the GPU instance at slice 4",
        "GPU 0: create GPU instance 3g.20gb at slice 0",
        "GPU 0: create compute instance 3g.20gb in the GPU instance at slice 0",
    ]
    # mode pending: only the reset (and what follows) remains
    g = a100(0, mig_current=False, mig_pending=True)
    p = plan(schema.parse(doc), "x", [g])
    assert [a.kind.value for a in p.actions][:2] == ["reset-gpu", "create-gpu-instance"]
