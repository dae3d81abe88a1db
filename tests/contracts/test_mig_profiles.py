"""gpukit.contracts.mig_profiles: the MIG tables as typed data for the planner."""

from __future__ import annotations

from pathlib import Path

import pynvml
import pytest

from gpukit.contracts import mig_profiles as mp
from gpukit.mig.placement import PlacementError, pack

pytestmark = pytest.mark.nvml


def test_tables_and_lookup() -> None:
    assert set(mp.tables().gpus) == {"A100-SXM4-40GB", "A100-80GB", "H100-80GB", "H200-141GB",
                                     "H100-NVL-94GB", "GH200-96GB", "B200-180GB", "GB200",
                                     "RTX-PRO-6000-BSE"}
    a100 = mp.for_product("NVIDIA A100-SXM4-40GB")
    assert a100 is not None and a100.key == "A100-SXM4-40GB"
    assert mp.for_product("Tesla T4") is None
    assert [p.name for p in a100.gpu_instance_profiles] == [
        "1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]
    me = a100.gpu_instance_profile("1g.5gb.me")
    assert me is a100.gpu_instance_profile("1g.5gb+me") is a100.gpu_instance_profile(7)
    assert me.media_extensions and me.resource_suffix == "1g.5gb.me"
    with pytest.raises(KeyError, match=r"known: 1g\.5gb, 1g\.5gb\+me"):
        a100.gpu_instance_profile("8g.80gb")
    h100 = mp.gpu("H100-80GB")
    plain = [p for p in h100.gpu_instance_profiles if not p.media_extensions]
    assert [(p.name, p.multiprocessors) for p in plain] == [  # as a real H100 80GB HBM3 says
        ("1g.10gb", 16), ("1g.20gb", 26), ("2g.20gb", 32), ("3g.40gb", 60), ("4g.40gb", 64),
        ("7g.80gb", 132)]
    assert [p.name for p in mp.gpu("A100-80GB").gpu_instance_profiles] == [
        "1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]


@pytest.mark.parametrize("name", [
    # other boards than the tables describe: none of them may borrow a table
    "NVIDIA H100 PCIe",  # 80 GB but 114 SMs: other per-profile SM counts
    "NVIDIA H200 NVL",  # the PCIe H200: not the board the H200 table's listing is of
    "NVIDIA A100-PCIE-40GB", "A100-PCIE-40GB", "NVIDIA A100 80GB PCIe", "A100 80GB PCIe",
    "NVIDIA GH200 144G HBM3e",  # the 144 GB GH200: 1g.18gb ... 7g.144gb, not the 96 GB table's
    "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",  # no listing of its own read
])
def test_boards_the_tables_do_not_describe_have_no_table(name: str) -> None:
    assert mp.for_product(name) is None


def test_product_names_are_the_boards_each_table_describes() -> None:
    assert {k: g.product_names for k, g in mp.tables().gpus.items()} == {
        "A100-SXM4-40GB": ("NVIDIA A100-SXM4-40GB", "A100-SXM4-40GB"),
        "A100-80GB": ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB"),
        "H100-80GB": ("NVIDIA H100 80GB HBM3",),
        "H200-141GB": ("NVIDIA H200",),
        "H100-NVL-94GB": ("NVIDIA H100 NVL",),
        "GH200-96GB": ("NVIDIA GH200 480GB",),
        "B200-180GB": ("NVIDIA B200",),
        "GB200": ("NVIDIA GB200",),
        "RTX-PRO-6000-BSE": ("NVIDIA RTX PRO 6000 Blackwell Server Edition",),
    }


def test_driver_ids() -> None:
    """The driver's profile ids (nvidia-smi mig -lgip's ID), which every 7-slice GPU's driver
    gives the same constants (the RTX PRO 6000's 4-slice set has its own: see its test); looked
    up by driver id, never by indexing with the constant."""
    want = {"NVML_GPU_INSTANCE_PROFILE_1_SLICE": 19, "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1": 20,
            "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2": 15, "NVML_GPU_INSTANCE_PROFILE_2_SLICE": 14,
            "NVML_GPU_INSTANCE_PROFILE_3_SLICE": 9, "NVML_GPU_INSTANCE_PROFILE_4_SLICE": 5,
            "NVML_GPU_INSTANCE_PROFILE_7_SLICE": 0}
    for gpu in mp.tables().gpus.values():
        if gpu.compute_slices == 7:
            assert {p.nvml_constant: p.driver_id for p in gpu.gpu_instance_profiles} == want
    a100 = mp.gpu("A100-SXM4-40GB")
    assert a100.gpu_instance_profile_by_driver_id(9).name == "3g.20gb"
    assert a100.gpu_instance_profile(9).name == "1g.10gb"  # constant 9 is another profile
    with pytest.raises(KeyError, match="no MIG profile with driver id 2"):
        a100.gpu_instance_profile_by_driver_id(2)


def test_compute_instance_multiprocessors() -> None:
    g = mp.gpu("H100-80GB").gpu_instance_profile
    assert g("7g.80gb").compute_instance_multiprocessors(
        g("7g.80gb").compute_instance_profile(7)) == 132  # all of it, not 7 x 18
    assert g("3g.40gb").compute_instance_multiprocessors(
        g("3g.40gb").compute_instance_profile(1)) == 20


def test_values_are_nvml_constants() -> None:
    for gpu in mp.tables().gpus.values():
        for p in gpu.gpu_instance_profiles:
            assert getattr(pynvml, p.nvml_constant) == p.profile_id
            for c in p.compute_instance_profiles:
                assert getattr(pynvml, c.nvml_constant) == c.profile_id


def test_design_table_a100_40gb() -> None:
    a = mp.gpu("A100-SXM4-40GB")
    rows = {p.name: (p.max_count, p.multiprocessors, p.memory_mb, [pl.start for pl in p.placements],
                     p.memory_slices) for p in a.gpu_instance_profiles}
    assert rows == {
        "1g.5gb": (7, 14, 4864, [0, 1, 2, 3, 4, 5, 6], 1),
        "1g.5gb+me": (1, 14, 4864, [0, 1, 2, 3, 4, 5, 6], 1),
        "1g.10gb": (4, 14, 9856, [0, 2, 4, 6], 2),
        "2g.10gb": (3, 28, 9856, [0, 2, 4], 2),
        "3g.20gb": (2, 42, 19968, [0, 4], 4),
        "4g.20gb": (1, 56, 19968, [0], 4),
        "7g.40gb": (1, 98, 40192, [0], 8),
    }


def test_fits() -> None:
    a = mp.gpu("A100-SXM4-40GB")
    g = a.gpu_instance_profile
    P = mp.Placement
    assert a.fits([(g("3g.20gb"), P(0, 4)), (g("3g.20gb"), P(4, 4))])
    assert a.fits([(g("4g.20gb"), P(0, 4)), (g("3g.20gb"), P(4, 4))])
    assert a.fits([(g("4g.20gb"), P(0, 4)), (g("2g.10gb"), P(4, 2)), (g("1g.5gb"), P(6, 1))])
    assert not a.fits([(g("3g.20gb"), P(2, 4))])  # not a placement of 3g
    assert not a.fits([(g("3g.20gb"), P(0, 4)), (g("2g.10gb"), P(2, 2))])  # overlap
    assert not a.fits([(g("1g.5gb+me"), P(0, 1)), (g("1g.5gb+me"), P(1, 1))])  # one +me
    assert a.fits([(g("1g.5gb+me"), P(0, 1))] + [(g("1g.5gb"), P(i, 1)) for i in range(1, 7)])
    ci = g("3g.20gb").compute_instance_profile(1)
    assert (ci.name_in(g("3g.20gb")), ci.max_count) == ("1c.3g.20gb", 3)
    assert g("3g.20gb").compute_instance_profile(3).name_in(g("3g.20gb")) == "3g.20gb"


def test_malformed_table_names_file_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "t.yaml"
    good = mp.DATA_FILE.read_text()
    bad.write_text(good.replace("memory_mb: 19968, max_count: 2", "memory_mb: many, max_count: 2"))
    with pytest.raises(mp.MigTableError) as e:
        mp.load(bad)
    field = "gpus.A100-SXM4-40GB.gpu_instance_profiles[4].memory_mb"
    assert str(e.value).startswith(f"{bad}: {field}: expected an integer, got 'many'")
    bad.write_text(good.replace("placements: [0, 4], engines", "placements: [0, 5], engines", 1))
    with pytest.raises(mp.MigTableError, match=r"placements: start 5 \(size 4\) is invalid"):
        mp.load(bad)
    bad.write_text(good.replace("profile_id: 1, driver_id: 14,", "profile_id: 1, driver_id: 9,", 1))
    with pytest.raises(mp.MigTableError, match=r"\[4\]\.driver_id: duplicate driver id 9"):
        mp.load(bad)
    bad.write_text(good.replace(" driver_id: 14,", "", 1))
    with pytest.raises(mp.MigTableError, match=r"\[3\]\.driver_id: missing"):
        mp.load(bad)


@pytest.mark.parametrize(("product", "reason"), [
    ("NVIDIA H100 PCIe", "no MIG table for 'NVIDIA H100 PCIe' in gpukit (known: NVIDIA A100-SXM4-40GB"),
    ("NVIDIA GH200 144G HBM3e", "no MIG table for 'NVIDIA GH200 144G HBM3e' in gpukit (known: "),
    ("NVIDIA L40S", "NVIDIA L40S is not MIG capable"),
    ("NVIDIA L4", "NVIDIA L4 is not MIG capable"),
    ("Tesla T4", "Tesla T4 is not MIG capable"),
])
def test_a_product_without_a_table_is_answered_honestly(product: str, reason: str) -> None:
    # "not MIG capable" only where NVIDIA says so: an H200 (before its table) once read as not
    # MIG capable.
    assert mp.for_product(product) is None
    assert reason in mp.no_table_reason(product)


# Per product: (NVML name, table key, the 1g profile, its max_count, memory_mb and SMs, the +me
# profile, the full profile's memory_mb and SMs) -- each figure from the table's cited listing.
NEW_PRODUCTS = [
    ("NVIDIA H200", "H200-141GB", "1g.18gb", 7, 16384, 16, "1g.18gb+me", "7g.141gb", 143104, 132),
    ("NVIDIA H100 NVL", "H100-NVL-94GB", "1g.12gb", 7, 11008, 16, "1g.12gb+me", "7g.94gb", 95360,
     132),
    ("NVIDIA GH200 480GB", "GH200-96GB", "1g.12gb", 7, 11264, 16, "1g.12gb+me", "7g.96gb", 95232,
     132),
    ("NVIDIA B200", "B200-180GB", "1g.23gb", 7, 20992, 18, "1g.23gb+me", "7g.180gb", 182784, 148),
    ("NVIDIA GB200", "GB200", "1g.23gb", 7, 22528, 18, "1g.23gb+me", "7g.186gb", 187904, 150),
]


@pytest.mark.parametrize(
    ("product", "key", "one_g", "count", "memory_mb", "sms", "me", "full", "full_mb", "full_sms"),
    NEW_PRODUCTS, ids=[p[1] for p in NEW_PRODUCTS])
def test_newer_products(product: str, key: str, one_g: str, count: int, memory_mb: int, sms: int,
                        me: str, full: str, full_mb: int, full_sms: int) -> None:
    gpu = mp.for_product(product)
    assert gpu is not None and gpu.key == key and gpu is mp.gpu(key)
    g = gpu.gpu_instance_profile
    p = g(one_g)
    assert (p.max_count, p.memory_mb, p.multiprocessors, p.driver_id) == (count, memory_mb, sms, 19)
    assert g(me).driver_id == 20 and g(me).max_count == 1 and g(me).engines.ofa == 1
    assert (g(full).memory_mb, g(full).multiprocessors, g(full).driver_id) == (full_mb, full_sms, 0)
    assert gpu.multiprocessors == full_sms and gpu.engines == g(full).engines
    P = mp.Placement
    ones = [(p, P(i, 1)) for i in range(count)]
    assert gpu.fits(ones)  # 7 x 1g fit
    assert not gpu.fits([*ones, (p, P(7, 1))])  # an 8th does not (no placement at slice 7)
    assert not gpu.fits([*ones, (p, P(0, 1))])  # nor on top of another
    assert gpu.fits([(g(me), P(0, 1))] + [(p, P(i, 1)) for i in range(1, count)])
    assert not gpu.fits([(g(me), P(0, 1)), (g(me), P(1, 1))])  # one +me
    # the MIG planner's placement search over the same table
    assert [s.describe() for s in pack(gpu, {one_g: 7})] == [f"{one_g}@{i}" for i in range(7)]
    with pytest.raises(PlacementError, match=f"{one_g}: 8 requested, at most 7 per GPU"):
        pack(gpu, {one_g: 8})
    plain = [q for q in gpu.gpu_instance_profiles if not q.media_extensions]
    assert [q.name.split(".")[0] for q in plain] == ["1g", "1g", "2g", "3g", "4g", "7g"]
    assert [q.max_count for q in plain] == [7, 4, 3, 2, 1, 1]


def test_rtx_pro_6000_blackwell_universal_mig() -> None:
    """The RTX PRO 6000 Blackwell Server Edition's set (NVIDIA's MIG user guide): 4 slices, the
    +gfx / +me / +me.all / -me variants, engines deciding what may share a GPU."""
    gpu = mp.for_product("NVIDIA RTX PRO 6000 Blackwell Server Edition")
    assert gpu is not None and gpu.key == "RTX-PRO-6000-BSE"
    assert (gpu.memory_slices, gpu.compute_slices, gpu.multiprocessors) == (4, 4, 188)
    g = gpu.gpu_instance_profile
    assert [(p.name, p.driver_id, p.max_count) for p in gpu.gpu_instance_profiles] == [
        ("1g.24gb", 14, 4), ("1g.24gb+me", 21, 1), ("1g.24gb+gfx", 47, 4),
        ("1g.24gb+me.all", 65, 1), ("1g.24gb-me", 67, 4), ("2g.48gb", 5, 2),
        ("2g.48gb+gfx", 35, 2), ("2g.48gb+me.all", 64, 1), ("2g.48gb-me", 66, 2),
        ("4g.96gb", 0, 1), ("4g.96gb+gfx", 32, 1)]
    assert {p.multiprocessors for p in gpu.gpu_instance_profiles} == {46, 94, 188}
    assert g("1g.24gb.me.all") is g("1g.24gb+me.all") and g("1g.24gb+me.all").media_extensions
    assert not g("1g.24gb-me").media_extensions and g("1g.24gb-me").resource_suffix == "1g.24gb-me"
    P = mp.Placement
    one = g("1g.24gb")
    assert gpu.fits([(one, P(i, 1)) for i in range(4)])
    assert not gpu.fits([(one, P(i, 1)) for i in range(4)] + [(one, P(4, 1))])
    # +me.all takes every media engine: only -me instances (none) share the GPU with it.
    all_me = g("1g.24gb+me.all")
    assert gpu.fits([(all_me, P(0, 1))] + [(g("1g.24gb-me"), P(i, 1)) for i in (1, 2, 3)])
    assert not gpu.fits([(all_me, P(0, 1)), (one, P(1, 1))])
    assert [s.describe() for s in pack(gpu, {"1g.24gb": 4})] == [f"1g.24gb@{i}" for i in range(4)]
    with pytest.raises(PlacementError, match=r"1g\.24gb: 5 requested, at most 4 per GPU"):
        pack(gpu, {"1g.24gb": 5})
