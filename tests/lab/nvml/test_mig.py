"""MIG through pynvml: mode (pending until reset), GPU- and compute-instance profiles (checked
against gpukit.contracts.mig_profiles, the planner's tables), placements, capacity, create/destroy/list,
MIG device handles, and the error codes real hardware gives.

As with a real driver, nvmlDeviceGetGpuInstanceProfileInfo takes an NVML_GPU_INSTANCE_PROFILE_*
constant (P1, P3, ...) and every other call that takes a profile id takes the driver's id for it
(the info's ``id``: 19 for an A100's 1g.5gb); the helpers here map one to the other as gpukit's
MIG manager does."""

from __future__ import annotations

import ctypes
import re
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from nvmltest import ci_placement, enable_mig, gi_placement, nvml_error, run_json

from gpukit.contracts import mig_profiles
from gpukit.lab import nvml as mock
from gpukit.lab.nvml.control import MockControl, MockNvmlError

pytestmark = pytest.mark.nvml
MIB = 1 << 20
P1, P2, P3, P4, P7 = 0, 1, 2, 3, 4  # NVML_GPU_INSTANCE_PROFILE_<n>_SLICE
P1_ME, P1_REV2 = 7, 9  # +me, 1g.10gb (A100-40GB) / 1g.20gb (80GB)
# The driver's ids for those constants (A100 and H100 alike), as nvidia-smi mig -lgip lists them.
DRIVER_ID = {P1: 19, P1_ME: 20, P1_REV2: 15, P2: 14, P3: 9, P4: 5, P7: 0}
C1, C2, C3, C4, C7 = 0, 1, 2, 3, 4  # NVML_COMPUTE_INSTANCE_PROFILE_<n>_SLICE
ERR = {
    "invalid": 2, "not_supported": 3, "not_found": 6, "in_use": 19, "insufficient": 23,
}


def driver_id(nvml: Any, h: Any, profile: int) -> int:
    """The driver's id for a profile constant, as gpukit's MIG manager asks for it."""
    return int(nvml.nvmlDeviceGetGpuInstanceProfileInfo(h, profile).id)


def create(nvml: Any, h: Any, profile: int, start: int | None = None) -> Any:
    """Create a GPU instance of the profile constant ``profile``."""
    pid = driver_id(nvml, h, profile)
    if start is None:
        return nvml.nvmlDeviceCreateGpuInstance(h, pid)
    size = mig_profiles.gpu("A100-SXM4-40GB").gpu_instance_profile(profile).memory_slices
    where = gi_placement(nvml, start, size)
    return nvml.nvmlDeviceCreateGpuInstanceWithPlacement(h, pid, where)


def placement_of(nvml: Any, gi: Any) -> tuple[int, int, int]:
    info = nvml.nvmlGpuInstanceGetInfo(gi)
    return info.id, info.placement.start, info.placement.size


def is_mig(nvml: Any, h: Any) -> int:
    flag = nvml.nvmlDeviceIsMigDeviceHandle(h)  # pynvml returns a c_uint
    return int(getattr(flag, "value", flag))


def remaining(nvml: Any, h: Any, profile: int) -> int:
    return int(nvml.nvmlDeviceGetGpuInstanceRemainingCapacity(h, driver_id(nvml, h, profile)))


def placements(nvml: Any, h: Any, pid: int) -> list[tuple[int, int]]:
    """nvmlDeviceGetGpuInstancePossiblePlacements_v2 for a driver profile id."""
    count = nvml.c_uint(0)
    arr = (nvml.c_nvmlGpuInstancePlacement_t * 8)()
    nvml.nvmlDeviceGetGpuInstancePossiblePlacements(h, pid, arr, nvml.byref(count))
    return [(x.start, x.size) for x in arr[: count.value]]


def instance_count(nvml: Any, h: Any, pid: int) -> int:
    count = nvml.c_uint(0)
    arr = (nvml.c_nvmlGpuInstance_t * 8)()
    nvml.nvmlDeviceGetGpuInstances(h, pid, arr, nvml.byref(count))
    return count.value


# ---- mode ----
def test_mig_mode_pending_until_reset(nvml: Any, ctl: MockControl) -> None:
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetMigMode(h) == [0, 0]
    assert nvml.nvmlDeviceSetMigMode(h, 1) == nvml.NVML_ERROR_RESET_REQUIRED
    assert nvml.nvmlDeviceGetMigMode(h) == [0, 1]
    nvml_error(nvml, ERR["not_supported"], nvml.nvmlDeviceCreateGpuInstance, h, DRIVER_ID[P1])
    assert nvml.nvmlDeviceGetMaxMigDeviceCount(h) == 0
    ctl.reset(0)
    assert nvml.nvmlDeviceGetMigMode(h) == [1, 1]
    assert nvml.nvmlDeviceGetMaxMigDeviceCount(h) == 7
    assert nvml.nvmlDeviceGetMigMode(nvml.nvmlDeviceGetHandleByIndex(1)) == [0, 0]
    # withdraw a pending change
    assert nvml.nvmlDeviceSetMigMode(h, 0) == nvml.NVML_ERROR_RESET_REQUIRED
    assert nvml.nvmlDeviceSetMigMode(h, 1) == nvml.NVML_SUCCESS
    assert nvml.nvmlDeviceGetMigMode(h) == [1, 1]
    nvml_error(nvml, ERR["invalid"], nvml.nvmlDeviceSetMigMode, h, 2)


@pytest.mark.parametrize("profile_name", ["t4-x2"])
def test_t4_is_not_mig_capable(nvml: Any) -> None:
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    ns = ERR["not_supported"]
    nvml_error(nvml, ns, nvml.nvmlDeviceGetMigMode, h)
    nvml_error(nvml, ns, nvml.nvmlDeviceSetMigMode, h, 1)
    for const in (P1, P3, 17):  # no MIG at all: not even an unknown constant is an argument error
        nvml_error(nvml, ns, nvml.nvmlDeviceGetGpuInstanceProfileInfo, h, const)
        nvml_error(nvml, ns, nvml.nvmlDeviceGetGpuInstanceProfileInfo, h, const, 1)
    for pid in (DRIVER_ID[P1], DRIVER_ID[P3]):
        nvml_error(nvml, ns, nvml.nvmlDeviceGetGpuInstanceRemainingCapacity, h, pid)
        nvml_error(nvml, ns, placements, nvml, h, pid)
        nvml_error(nvml, ns, instance_count, nvml, h, pid)
        nvml_error(nvml, ns, nvml.nvmlDeviceCreateGpuInstance, h, pid)
        nvml_error(nvml, ns, nvml.nvmlDeviceGetGpuInstanceProfileInfoByIdV, h, pid)
    nvml_error(nvml, ns, nvml.nvmlDeviceGetGpuInstanceById, h, 1)
    nvml_error(nvml, ns, nvml.nvmlDeviceGetMigDeviceHandleByIndex, h, 0)
    nvml_error(nvml, ERR["invalid"], nvml.nvmlDeviceGetGpuInstanceId, h)
    assert nvml.nvmlDeviceGetMaxMigDeviceCount(h) == 0
    assert is_mig(nvml, h) == 0


def test_mig_disabled_answers_the_profile_table_but_creates_nothing(nvml: Any) -> None:
    """A MIG-capable GPU with MIG disabled answers the profile table, placements, capacity and
    an empty instance list (as an H100 on driver 580.159.04 does); creating needs MIG enabled."""
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetMigMode(h) == [0, 0]
    info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(h, P3)
    assert (info.id, info.name, info.sliceCount) == (DRIVER_ID[P3], "MIG 3g.20gb", 3)
    assert nvml.nvmlDeviceGetGpuInstanceProfileInfo(h, P3, version=1).id == DRIVER_ID[P3]
    assert nvml.nvmlDeviceGetGpuInstanceProfileInfoByIdV(h, DRIVER_ID[P3]).name == "MIG 3g.20gb"
    assert placements(nvml, h, DRIVER_ID[P3]) == [(0, 4), (4, 4)]
    assert remaining(nvml, h, P3) == 2 and remaining(nvml, h, P1) == 7
    assert instance_count(nvml, h, DRIVER_ID[P3]) == 0
    nvml_error(nvml, ERR["not_supported"], nvml.nvmlDeviceCreateGpuInstance, h, DRIVER_ID[P3])
    nvml_error(nvml, ERR["not_supported"], nvml.nvmlDeviceCreateGpuInstanceWithPlacement, h,
               DRIVER_ID[P3], gi_placement(nvml, 0, 4))
    for gid in (0, 1, 14, 99):
        nvml_error(nvml, ERR["not_found"], nvml.nvmlDeviceGetGpuInstanceById, h, gid)


def test_profile_constants_and_driver_ids_are_not_interchangeable(nvml: Any) -> None:
    """Unknown constants are argument errors, unsupported ones NOT_SUPPORTED; a call taking a
    driver id refuses an id that names no profile of the GPU (driver 580.159.04 on an H100)."""
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    for const in (5, 6, 8, *range(10, 17)):
        nvml_error(nvml, ERR["not_supported"], nvml.nvmlDeviceGetGpuInstanceProfileInfo, h, const)
    for const in (17, 18, nvml.NVML_GPU_INSTANCE_PROFILE_COUNT, 1000):
        for version in (1, 2):
            nvml_error(nvml, ERR["invalid"], nvml.nvmlDeviceGetGpuInstanceProfileInfo, h, const,
                       version)
    known = set(DRIVER_ID.values())
    for pid in (1, 2, 3, 4, 7, 21, 255):
        assert pid not in known
        nvml_error(nvml, ERR["invalid"], placements, nvml, h, pid)
        nvml_error(nvml, ERR["invalid"], nvml.nvmlDeviceGetGpuInstanceRemainingCapacity, h, pid)
        nvml_error(nvml, ERR["invalid"], instance_count, nvml, h, pid)
        nvml_error(nvml, ERR["invalid"], nvml.nvmlDeviceGetGpuInstanceProfileInfoByIdV, h, pid)


def test_enable_refused_while_processes_run(nvml: Any, ctl: MockControl) -> None:
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    ctl.set_process(0, pid=777, mem_mb=10)
    assert nvml.nvmlDeviceSetMigMode(h, 1) == nvml.NVML_ERROR_IN_USE  # activation status
    assert nvml.nvmlDeviceGetMigMode(h) == [0, 1]
    with pytest.raises(MockNvmlError, match="In use by another client") as e:
        ctl.reset(0)  # nvidia-smi -r refuses while processes hold the GPU
    assert e.value.code == ERR["in_use"]
    assert nvml.nvmlDeviceGetMigMode(h) == [0, 1]
    ctl.clear_processes()
    ctl.reset(0)
    assert nvml.nvmlDeviceGetMigMode(h) == [1, 1]


def test_disable_refused_with_gpu_instances(nvml: Any, ctl: MockControl) -> None:
    h = enable_mig(nvml, ctl, 0)
    gi = create(nvml, h, P2)
    nvml_error(nvml, ERR["in_use"], nvml.nvmlDeviceSetMigMode, h, 0)
    nvml.nvmlGpuInstanceDestroy(gi)
    assert nvml.nvmlDeviceSetMigMode(h, 0) == nvml.NVML_ERROR_RESET_REQUIRED


def test_immediate_mode_change_profile_option(
        nvml_with_profile: Callable[[dict[str, Any]], Any]) -> None:
    doc = yaml.safe_load(mock.profile_path("h100-80gb-x8").read_text())
    doc["defaults"]["mig_mode_change"] = "immediate"
    pynvml = nvml_with_profile(doc)
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceSetMigMode(h, 1) == pynvml.NVML_SUCCESS
    assert pynvml.nvmlDeviceGetMigMode(h) == [1, 1]


# ---- profiles: C (the mock) against Python (the planner's tables) ----
@pytest.mark.parametrize(
    ("profile_name", "table"),
    [("a100-sxm4-40gb-x8", "A100-SXM4-40GB"), ("a100-80gb-x4", "A100-80GB"),
     ("h100-80gb-x8", "H100-80GB"), ("h200-x8", "H200-141GB"), ("b200-x8", "B200-180GB"),
     ("gb200-x4", "GB200")],
)
def test_profiles_match_the_planner_tables(nvml: Any, ctl: MockControl, table: str) -> None:
    h = enable_mig(nvml, ctl, 0)
    _assert_answers_table(nvml, h, mig_profiles.gpu(table))


# Tables without a lab profile of their own: one GPU of the H100 profile, renamed so that the
# mock picks the table (the name is what the planner looks the table up by).
@pytest.mark.parametrize("table", ["H100-NVL-94GB", "GH200-96GB", "RTX-PRO-6000-BSE"])
def test_other_tables_on_the_mock(nvml_with_profile: Callable[[dict[str, Any]], Any],
                                  table: str) -> None:
    t = mig_profiles.gpu(table)
    doc = yaml.safe_load(mock.profile_path("h100-80gb-x8").read_text())
    doc["defaults"].update(name=t.product_names[0], mig_table=table, mig_enabled=True,
                           multiprocessors=t.multiprocessors)
    doc["gpus"] = doc["gpus"][:1]
    pynvml = nvml_with_profile(doc)
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetMigMode(h) == [1, 1]
    _assert_answers_table(pynvml, h, t)


def _assert_answers_table(nvml: Any, h: Any, t: mig_profiles.MigGpu) -> None:
    """The mock answers every NVML MIG profile query on `h` (MIG on, no instances) with table
    `t`'s figures: counts, memory, SMs, engines, ids, names and placements."""
    assert mig_profiles.for_product(nvml.nvmlDeviceGetName(h)) == t
    seen = set()
    for const in range(nvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            v2 = nvml.nvmlDeviceGetGpuInstanceProfileInfo(h, const)
        except nvml.NVMLError as e:
            assert e.value == (ERR["not_supported"] if const < 17 else ERR["invalid"])
            continue
        seen.add(const)
        p = t.gpu_instance_profile(const)
        pid = p.driver_id
        v1 = nvml.nvmlDeviceGetGpuInstanceProfileInfo(h, const, version=1)
        by_id = nvml.nvmlDeviceGetGpuInstanceProfileInfoByIdV(h, pid)
        for info in (v1, v2, by_id):
            assert (info.id, info.sliceCount, info.instanceCount, info.multiprocessorCount,
                    info.memorySizeMB) == (p.driver_id, p.compute_slices, p.max_count,
                                           p.multiprocessors, p.memory_mb)
            assert (info.copyEngineCount, info.decoderCount, info.encoderCount, info.jpegCount,
                    info.ofaCount) == (p.engines.copy, p.engines.decoder, p.engines.encoder,
                                       p.engines.jpeg, p.engines.ofa)
        assert v2.name == by_id.name == f"MIG {p.name}"
        assert placements(nvml, h, pid) == [(pl.start, pl.size) for pl in p.placements]
        assert remaining(nvml, h, const) == p.max_count
        # compute-instance profiles inside a GPU instance of this profile
        gi = nvml.nvmlDeviceCreateGpuInstance(h, pid)
        assert nvml.nvmlGpuInstanceGetInfo(gi).profileId == pid
        assert instance_count(nvml, h, pid) == 1
        ci_seen = set()
        for cid in range(nvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
            try:
                ci = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, cid, 0)
            except nvml.NVMLError as e:
                assert e.value == ERR["not_supported"]
                continue
            cp = next(c for c in p.compute_instance_profiles if c.profile_id == cid)
            ci_seen.add(cp.compute_slices)
            assert (ci.sliceCount, ci.instanceCount, ci.multiprocessorCount) == (
                cp.compute_slices, cp.max_count, p.compute_instance_multiprocessors(cp))
            assert ci.sharedCopyEngineCount == p.engines.copy
            assert ci.name == f"MIG {cp.name_in(p)}"
            ci1 = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, cid, 0, version=1)
            assert (ci1.id, ci1.sliceCount) == (cid, cp.compute_slices)
            n = nvml.c_uint(0)
            carr = (nvml.c_nvmlComputeInstancePlacement_t * 8)()
            nvml.nvmlGpuInstanceGetComputeInstancePossiblePlacements(gi, cid, carr, nvml.byref(n))
            assert [(x.start, x.size) for x in carr[: n.value]] == [
                (pl.start, pl.size) for pl in cp.placements]
        assert ci_seen == {c.compute_slices for c in p.compute_instance_profiles}
        nvml.nvmlGpuInstanceDestroy(gi)
    assert seen == {p.profile_id for p in t.gpu_instance_profiles}
    nvml_error(nvml, ERR["invalid"], nvml.nvmlDeviceGetGpuInstanceProfileInfo, h,
               nvml.NVML_GPU_INSTANCE_PROFILE_COUNT)


def test_profile_info_v_checks_the_struct_version(nvml: Any, ctl: MockControl) -> None:
    h = enable_mig(nvml, ctl, 0)
    fn = nvml._nvmlGetFunctionPointer("nvmlDeviceGetGpuInstanceProfileInfoV")
    info = nvml.c_nvmlGpuInstanceProfileInfo_v2_t()
    info.version = 1  # driver 580.159.04 answers another version so (also 0x01000098, 0x04000098)
    assert fn(h, P1, nvml.byref(info)) == nvml.NVML_ERROR_INVALID_ARGUMENT


class _ProfileInfoV3(ctypes.Structure):
    """nvmlGpuInstanceProfileInfo_v3_t (pynvml has no binding for it)."""

    _fields_ = [(n, ctypes.c_uint) for n in (
        "version", "id", "sliceCount", "instanceCount", "multiprocessorCount", "copyEngineCount",
        "decoderCount", "encoderCount", "jpegCount", "ofaCount")] + [
        ("memorySizeMB", ctypes.c_ulonglong), ("name", ctypes.c_char * 96),
        ("capabilities", ctypes.c_uint)]


@pytest.mark.parametrize("profile_name", ["h100-80gb-x8"])
def test_profile_info_v3_and_the_deprecated_placements_call(nvml: Any) -> None:
    """As driver 580.159.04 answers on an MIG-disabled H100: v3 by constant and by driver id
    (its name left empty), and the pre-_v2 placements call refusing 1g.10gb+me (7 placements,
    1 instance) that _v2 lists."""
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    v3 = _ProfileInfoV3()
    for fn, arg in (("nvmlDeviceGetGpuInstanceProfileInfoV", P3),
                    ("nvmlDeviceGetGpuInstanceProfileInfoByIdV", DRIVER_ID[P3])):
        v3.version = ctypes.sizeof(_ProfileInfoV3) | 3 << 24
        assert nvml._nvmlGetFunctionPointer(fn)(h, arg, ctypes.byref(v3)) == 0
        assert (v3.id, v3.sliceCount, v3.multiprocessorCount, v3.memorySizeMB, v3.name,
                v3.capabilities) == (9, 3, 60, 40448, b"", 0)
    old = nvml._nvmlGetFunctionPointer("nvmlDeviceGetGpuInstancePossiblePlacements")
    count = ctypes.c_uint(0)
    arr = (nvml.c_nvmlGpuInstancePlacement_t * 8)()
    assert old(h, DRIVER_ID[P1_ME], arr, ctypes.byref(count)) == ERR["not_supported"]
    assert old(h, DRIVER_ID[P1], arr, ctypes.byref(count)) == 0 and count.value == 7
    assert placements(nvml, h, DRIVER_ID[P1_ME]) == [(i, 1) for i in range(7)]


# ---- placements and capacity (A100-SXM4-40GB) ----
def test_two_3g_at_slices_0_and_4(nvml: Any, ctl: MockControl) -> None:
    h = enable_mig(nvml, ctl, 0)
    a = create(nvml, h, P3, start=4)
    b = create(nvml, h, P3, start=0)
    assert placement_of(nvml, a) == (1, 4, 4) and placement_of(nvml, b) == (2, 0, 4)
    assert remaining(nvml, h, P3) == 0 and remaining(nvml, h, P1) == 0
    nvml_error(nvml, ERR["insufficient"], create, nvml, h, P3)
    nvml_error(nvml, ERR["insufficient"], create, nvml, h, P1)


def test_4g_then_3g(nvml: Any, ctl: MockControl) -> None:
    h = enable_mig(nvml, ctl, 0)
    g4 = create(nvml, h, P4)
    g3 = create(nvml, h, P3)
    assert placement_of(nvml, g4) == (2, 0, 4)
    assert placement_of(nvml, g3) == (1, 4, 4)
    nvml_error(nvml, ERR["insufficient"], create, nvml, h, P7)
    nvml_error(nvml, ERR["insufficient"], create, nvml, h, P4)  # only one 4g exists


def test_seven_1g_fit_the_eighth_is_refused(nvml: Any, ctl: MockControl) -> None:
    h = enable_mig(nvml, ctl, 0)
    left = []
    ids = []
    for _ in range(7):
        left.append(remaining(nvml, h, P1))
        ids.append(placement_of(nvml, create(nvml, h, P1))[0])
    assert left == [7, 6, 5, 4, 3, 2, 1] and remaining(nvml, h, P1) == 0
    assert sorted(ids) == [7, 8, 9, 11, 12, 13, 14]  # nvidia-smi's ids for slices 4-6, 0-3
    nvml_error(nvml, ERR["insufficient"], create, nvml, h, P1)


def test_plus_me_only_one_and_it_takes_a_slice(nvml: Any, ctl: MockControl) -> None:
    h = enable_mig(nvml, ctl, 0)
    assert remaining(nvml, h, P1_ME) == 1
    me = create(nvml, h, P1_ME)
    assert placement_of(nvml, me)[1:] == (0, 1)
    assert remaining(nvml, h, P1_ME) == 0
    nvml_error(nvml, ERR["insufficient"], create, nvml, h, P1_ME)
    nvml_error(nvml, ERR["insufficient"], create, nvml, h, P1_ME, 3)  # free slice, still refused
    assert remaining(nvml, h, P1) == 6  # it occupies a 1g slot
    for _ in range(6):
        create(nvml, h, P1)
    nvml_error(nvml, ERR["insufficient"], create, nvml, h, P1)
    nvml_error(nvml, ERR["insufficient"], create, nvml, h, P7)


def test_1g_10gb_on_a100_40gb(nvml: Any, ctl: MockControl) -> None:
    h = enable_mig(nvml, ctl, 0)
    info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(h, P1_REV2)
    assert (info.name, info.memorySizeMB, info.sliceCount) == ("MIG 1g.10gb", 9856, 1)
    starts = [placement_of(nvml, create(nvml, h, P1_REV2))[1:] for _ in range(4)]
    assert starts == [(0, 2), (2, 2), (4, 2), (6, 2)]
    nvml_error(nvml, ERR["insufficient"], create, nvml, h, P1_REV2)


def test_invalid_and_occupied_placements(nvml: Any, ctl: MockControl) -> None:
    h = enable_mig(nvml, ctl, 0)
    inv, full = ERR["invalid"], ERR["insufficient"]
    wp = nvml.nvmlDeviceCreateGpuInstanceWithPlacement
    d = DRIVER_ID
    nvml_error(nvml, inv, wp, h, d[P3], gi_placement(nvml, 2, 4))  # 3g starts at 0 or 4
    nvml_error(nvml, inv, wp, h, d[P2], gi_placement(nvml, 6, 2))  # 2g starts at 0, 2, 4
    nvml_error(nvml, inv, wp, h, d[P1], gi_placement(nvml, 7, 1))  # no 1g on slice 7
    nvml_error(nvml, inv, wp, h, d[P3], gi_placement(nvml, 0, 3))  # wrong size
    nvml_error(nvml, inv, wp, h, 1, gi_placement(nvml, 0, 8))  # no profile with driver id 1
    nvml_error(nvml, inv, wp, h, P3, gi_placement(nvml, 0, 4))  # the constant is no driver id
    create(nvml, h, P1, start=2)
    nvml_error(nvml, full, wp, h, d[P2], gi_placement(nvml, 2, 2))  # overlaps the 1g
    nvml_error(nvml, full, wp, h, d[P4], gi_placement(nvml, 0, 4))
    assert placement_of(nvml, create(nvml, h, P2))[1:] == (0, 2)  # first free 2g placement
    assert remaining(nvml, h, P2) == 1


def test_list_get_destroy_gpu_instances(nvml: Any, ctl: MockControl) -> None:
    h = enable_mig(nvml, ctl, 0)
    a = create(nvml, h, P2)
    b = create(nvml, h, P2)
    create(nvml, h, P1)
    count = nvml.c_uint(0)
    arr = (nvml.c_nvmlGpuInstance_t * 3)()
    nvml.nvmlDeviceGetGpuInstances(h, DRIVER_ID[P2], arr, nvml.byref(count))
    assert sorted(placement_of(nvml, arr[i])[0] for i in range(count.value)) == sorted(
        [placement_of(nvml, a)[0], placement_of(nvml, b)[0]])
    gid = placement_of(nvml, a)[0]
    same = nvml.nvmlDeviceGetGpuInstanceById(h, gid)
    info = nvml.nvmlGpuInstanceGetInfo(same)
    assert (info.profileId, nvml.nvmlDeviceGetIndex(info.device)) == (DRIVER_ID[P2], 0)
    nvml_error(nvml, ERR["not_found"], nvml.nvmlDeviceGetGpuInstanceById, h, 0)
    nvml.nvmlGpuInstanceDestroy(a)
    nvml_error(nvml, ERR["invalid"], nvml.nvmlGpuInstanceGetInfo, a)  # the handle is gone
    nvml_error(nvml, ERR["not_found"], nvml.nvmlDeviceGetGpuInstanceById, h, gid)
    assert remaining(nvml, h, P2) == 1


# ---- compute instances ----
def test_compute_instances(nvml: Any, ctl: MockControl) -> None:
    h = enable_mig(nvml, ctl, 0)
    gi = create(nvml, h, P3)
    full = ERR["insufficient"]
    assert nvml.nvmlGpuInstanceGetComputeInstanceRemainingCapacity(gi, C1) == 3
    c2 = nvml.nvmlGpuInstanceCreateComputeInstanceWithPlacement(gi, C2, ci_placement(nvml, 0, 2))
    c1 = nvml.nvmlGpuInstanceCreateComputeInstance(gi, C1)
    info = nvml.nvmlComputeInstanceGetInfo(c1)
    assert (info.id, info.profileId, info.placement.start, info.placement.size) == (1, C1, 2, 1)
    assert nvml.nvmlGpuInstanceGetInfo(info.gpuInstance).id == placement_of(nvml, gi)[0]
    assert nvml.nvmlDeviceGetIndex(info.device) == 0
    nvml_error(nvml, full, nvml.nvmlGpuInstanceCreateComputeInstance, gi, C1)
    nvml_error(nvml, full, nvml.nvmlGpuInstanceCreateComputeInstance, gi, C3)
    nvml_error(nvml, ERR["not_supported"], nvml.nvmlGpuInstanceCreateComputeInstance, gi, C4)
    nvml_error(nvml, ERR["invalid"], nvml.nvmlGpuInstanceCreateComputeInstanceWithPlacement,
               gi, C2, ci_placement(nvml, 1, 2))
    count = nvml.c_uint(0)
    arr = (nvml.c_nvmlComputeInstance_t * 3)()
    nvml.nvmlGpuInstanceGetComputeInstances(gi, C1, arr, nvml.byref(count))
    assert count.value == 1
    assert nvml.nvmlComputeInstanceGetInfo(
        nvml.nvmlGpuInstanceGetComputeInstanceById(gi, 0)).profileId == C2
    nvml_error(nvml, ERR["not_found"], nvml.nvmlGpuInstanceGetComputeInstanceById, gi, 5)
    nvml_error(nvml, ERR["in_use"], nvml.nvmlGpuInstanceDestroy, gi)  # has compute instances
    nvml.nvmlComputeInstanceDestroy(c2)
    nvml.nvmlComputeInstanceDestroy(c1)
    nvml_error(nvml, ERR["invalid"], nvml.nvmlComputeInstanceGetInfo, c1)
    nvml.nvmlGpuInstanceDestroy(gi)


def test_busy_instances_cannot_be_destroyed(nvml: Any, ctl: MockControl) -> None:
    h = enable_mig(nvml, ctl, 0)
    gi = create(nvml, h, P7)
    ci = nvml.nvmlGpuInstanceCreateComputeInstance(gi, C7)
    gid = placement_of(nvml, gi)[0]
    ctl.set_process(0, pid=4321, mem_mb=512, gi=gid, ci=0)
    nvml_error(nvml, ERR["in_use"], nvml.nvmlComputeInstanceDestroy, ci)
    with pytest.raises(MockNvmlError, match="In use"):
        ctl.reset(0)
    ctl.clear_processes(pid=4321)
    nvml.nvmlComputeInstanceDestroy(ci)
    nvml.nvmlGpuInstanceDestroy(gi)
    with pytest.raises(MockNvmlError, match="Not Found"):
        ctl.set_process(0, pid=1, gi=gid, ci=0)  # that instance is gone


# ---- MIG devices ----
def test_mig_device_handles(nvml: Any, ctl: MockControl) -> None:
    h = enable_mig(nvml, ctl, 0)
    parent_uuid = nvml.nvmlDeviceGetUUID(h)
    g3 = create(nvml, h, P3)
    nvml.nvmlGpuInstanceCreateComputeInstance(g3, C2)  # slices 0-1 (its only placement)
    nvml.nvmlGpuInstanceCreateComputeInstance(g3, C1)  # then slice 2
    g1 = create(nvml, h, P1)
    nvml.nvmlGpuInstanceCreateComputeInstance(g1, C1)
    create(nvml, h, P1)  # a GPU instance without compute instance is no MIG device
    migs = [nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, i) for i in range(3)]
    nvml_error(nvml, ERR["not_found"], nvml.nvmlDeviceGetMigDeviceHandleByIndex, h, 3)
    nvml_error(nvml, ERR["invalid"], nvml.nvmlDeviceGetMigDeviceHandleByIndex, h, 7)
    names = [nvml.nvmlDeviceGetName(m) for m in migs]
    assert names == ["NVIDIA A100-SXM4-40GB MIG 2c.3g.20gb", "NVIDIA A100-SXM4-40GB MIG 1c.3g.20gb",
                     "NVIDIA A100-SXM4-40GB MIG 1g.5gb"]
    uuids = [nvml.nvmlDeviceGetUUID(m) for m in migs]
    assert all(re.fullmatch(r"MIG-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", u) for u in uuids)
    assert len(set(uuids)) == 3
    assert [(nvml.nvmlDeviceGetGpuInstanceId(m), nvml.nvmlDeviceGetComputeInstanceId(m))
            for m in migs] == [(2, 0), (2, 1), (7, 0)]  # 1g on slice 4: id 7
    for m, u in zip(migs, uuids, strict=True):
        assert is_mig(nvml, m) == 1
        parent = nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(m)
        assert nvml.nvmlDeviceGetUUID(parent) == parent_uuid
        assert nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByUUID(u)) == u
    assert is_mig(nvml, h) == 0
    nvml_error(nvml, ERR["invalid"], nvml.nvmlDeviceGetGpuInstanceId, h)  # a full GPU's handle
    nvml_error(nvml, ERR["invalid"], nvml.nvmlDeviceGetComputeInstanceId, h)
    nvml_error(nvml, ERR["invalid"], nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle, h)
    assert nvml.nvmlDeviceGetMemoryInfo(migs[0]).total == 19968 * MIB
    assert nvml.nvmlDeviceGetMemoryInfo(migs[2]).total == 4864 * MIB
    attrs = nvml.nvmlDeviceGetAttributes(migs[0])
    assert (attrs.multiprocessorCount, attrs.gpuInstanceSliceCount,
            attrs.computeInstanceSliceCount, attrs.memorySizeMB) == (28, 3, 2, 19968)
    assert nvml.nvmlDeviceGetAttributes(migs[1]).multiprocessorCount == 14
    nvml_error(nvml, ERR["not_supported"], nvml.nvmlDeviceGetAttributes, h)
    assert nvml.nvmlDeviceGetCudaComputeCapability(migs[0]) == (8, 0)
    ctl.set_process(0, pid=55, mem_mb=100, gi=2, ci=1)
    assert [p.pid for p in nvml.nvmlDeviceGetComputeRunningProcesses(migs[1])] == [55]
    assert nvml.nvmlDeviceGetComputeRunningProcesses(migs[0]) == []
    procs = nvml.nvmlDeviceGetComputeRunningProcesses(h)
    assert [(p.pid, p.gpuInstanceId, p.computeInstanceId) for p in procs] == [(55, 2, 1)]
    assert nvml.nvmlDeviceGetMemoryInfo(migs[1], version=nvml.nvmlMemory_v2).used == 100 * MIB


def test_reset_destroys_instances_and_boot_applies_pending(nvml: Any, ctl: MockControl) -> None:
    h = enable_mig(nvml, ctl, 0)
    gi = create(nvml, h, P7)
    nvml.nvmlGpuInstanceCreateComputeInstance(gi, C7)
    ctl.reset(0)
    assert nvml.nvmlDeviceGetMigMode(h) == [1, 1]
    assert remaining(nvml, h, P7) == 1
    nvml_error(nvml, ERR["invalid"], nvml.nvmlGpuInstanceGetInfo, gi)
    h3 = nvml.nvmlDeviceGetHandleByIndex(3)
    assert nvml.nvmlDeviceSetMigMode(h3, 1) == nvml.NVML_ERROR_RESET_REQUIRED
    ctl.set_process(5, pid=9, mem_mb=1)
    ctl.lose(6)
    ctl.boot()
    assert nvml.nvmlDeviceGetMigMode(h3) == [1, 1]
    assert nvml.nvmlDeviceGetComputeRunningProcesses(nvml.nvmlDeviceGetHandleByIndex(5)) == []
    assert nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(6))


@pytest.mark.parametrize("profile_name", ["a100-sxm4-40gb-x16"])
def test_mig_beyond_gpu_8(nvml: Any, ctl: MockControl) -> None:
    h = enable_mig(nvml, ctl, 12)
    gi = create(nvml, h, P3)
    nvml.nvmlGpuInstanceCreateComputeInstance(gi, C3)
    m = nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
    assert nvml.nvmlDeviceGetIndex(nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(m)) == 12
    assert nvml.nvmlDeviceGetMigMode(nvml.nvmlDeviceGetHandleByIndex(11)) == [0, 0]


def test_mig_layout_seen_by_another_process(
    nvml: Any, ctl: MockControl, nvml_env: dict[str, str]
) -> None:
    h = enable_mig(nvml, ctl, 2)
    for p in (P3, P2, P1):
        gi = create(nvml, h, p)
        info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(h, p)
        nvml.nvmlGpuInstanceCreateComputeInstance(gi, {1: C1, 2: C2, 3: C3}[info.sliceCount])
    migs = [nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, i) for i in range(3)]
    here = [nvml.nvmlDeviceGetUUID(m) for m in migs]
    there = run_json(
        """
        import json, pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(2)
        print(json.dumps([pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, i))
                          for i in range(3)]))
        """,
        nvml_env,
    )
    assert there == here
