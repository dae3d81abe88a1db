"""Device queries through pynvml: identity, memory, PCI, NUMA/affinity, topology, NVLink,
telemetry, processes, more than 8 GPUs, lost GPUs."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from nvmltest import nvml_error, run_json

from gpukit.lab import nvml as mock
from gpukit.lab.nvml.control import MockControl, MockNvmlError

pytestmark = pytest.mark.nvml
UUID_RE = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
MIB = 1 << 20


def test_handles_by_index_uuid_pci_and_serial(nvml: Any) -> None:
    assert nvml.nvmlDeviceGetCount() == 8
    for i in range(8):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        assert nvml.nvmlDeviceGetIndex(h) == i
        uuid = nvml.nvmlDeviceGetUUID(h)
        bus = nvml.nvmlDeviceGetPciInfo(h).busId
        assert nvml.nvmlDeviceGetIndex(nvml.nvmlDeviceGetHandleByUUID(uuid)) == i
        assert nvml.nvmlDeviceGetIndex(nvml.nvmlDeviceGetHandleByPciBusId(bus)) == i
        short = bus[4:].lower()  # 0000:07:00.0 works too, as on real NVML
        assert nvml.nvmlDeviceGetIndex(nvml.nvmlDeviceGetHandleByPciBusId(short)) == i
        serial = nvml.nvmlDeviceGetSerial(h)
        assert re.fullmatch(r"1\d{12}", serial)
        assert nvml.nvmlDeviceGetIndex(nvml.nvmlDeviceGetHandleBySerial(serial)) == i
    nvml_error(nvml, nvml.NVML_ERROR_INVALID_ARGUMENT, nvml.nvmlDeviceGetHandleByIndex, 8)
    nvml_error(nvml, nvml.NVML_ERROR_NOT_FOUND, nvml.nvmlDeviceGetHandleByUUID,
               "GPU-00000000-0000-0000-0000-000000000000")
    nvml_error(nvml, nvml.NVML_ERROR_NOT_FOUND, nvml.nvmlDeviceGetHandleByPciBusId,
               "00000000:08:00.0")


def test_identity_a100(nvml: Any) -> None:
    h = nvml.nvmlDeviceGetHandleByIndex(5)
    assert nvml.nvmlDeviceGetName(h) == "NVIDIA A100-SXM4-40GB"
    assert nvml.nvmlDeviceGetMinorNumber(h) == 5
    assert nvml.nvmlDeviceGetBrand(h) == nvml.NVML_BRAND_NVIDIA
    assert nvml.nvmlDeviceGetArchitecture(h) == nvml.NVML_DEVICE_ARCH_AMPERE
    assert nvml.nvmlDeviceGetCudaComputeCapability(h) == (8, 0)
    assert nvml.nvmlDeviceGetVbiosVersion(h) == "92.00.45.00.03"
    assert nvml.nvmlDeviceGetBoardPartNumber(h) == "692-2G506-0200-002"


@pytest.mark.parametrize(
    ("profile_name", "name", "arch", "cc", "mem_mib"),
    [
        ("h100-80gb-x8", "NVIDIA H100 80GB HBM3", 9, (9, 0), 81559),
        ("a100-80gb-x4", "NVIDIA A100-SXM4-80GB", 7, (8, 0), 81920),
        ("t4-x2", "Tesla T4", 6, (7, 5), 15360),
    ],
)
def test_identity_other_profiles(
    nvml: Any, name: str, arch: int, cc: tuple[int, int], mem_mib: int
) -> None:
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetName(h) == name
    assert nvml.nvmlDeviceGetArchitecture(h) == arch
    assert nvml.nvmlDeviceGetCudaComputeCapability(h) == cc
    assert nvml.nvmlDeviceGetMemoryInfo(h).total == mem_mib * MIB


def _uuids(env: dict[str, str]) -> list[str]:
    return list(run_json(
        """
        import json, pynvml
        pynvml.nvmlInit()
        print(json.dumps([pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))
                          for i in range(pynvml.nvmlDeviceGetCount())]))
        """,
        env,
    ))


def test_uuids_are_stable_and_seeded(nvml: Any, nvml_env: dict[str, str]) -> None:
    here = [nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(8)]
    assert all(UUID_RE.match(u) for u in here)
    assert len(set(here)) == 8
    assert _uuids(nvml_env) == here  # another process: the same GPUs
    node2 = _uuids({**nvml_env, mock.ENV_SEED: "node-2"})
    assert not set(node2) & set(here)  # same profile, another node: other GPUs
    assert _uuids({**nvml_env, mock.ENV_SEED: "node-2"}) == node2


def test_memory_v1_and_v2(nvml: Any, ctl: MockControl) -> None:
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    m1 = nvml.nvmlDeviceGetMemoryInfo(h)
    assert (m1.total, m1.used, m1.free) == (40960 * MIB, 424 * MIB, (40960 - 424) * MIB)
    m2 = nvml.nvmlDeviceGetMemoryInfo(h, version=nvml.nvmlMemory_v2)
    assert (m2.total, m2.reserved, m2.used, m2.free) == (
        40960 * MIB, 424 * MIB, 0, (40960 - 424) * MIB)
    ctl.set_process(0, pid=4242, mem_mb=1000)
    m1 = nvml.nvmlDeviceGetMemoryInfo(h)
    m2 = nvml.nvmlDeviceGetMemoryInfo(h, version=nvml.nvmlMemory_v2)
    assert m1.used == 1424 * MIB and m2.used == 1000 * MIB
    assert m2.free == (40960 - 424 - 1000) * MIB
    nvml_error(nvml, nvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH, nvml.nvmlDeviceGetMemoryInfo, h, 1)


def test_pci_info(nvml: Any) -> None:
    h = nvml.nvmlDeviceGetHandleByIndex(2)
    pci = nvml.nvmlDeviceGetPciInfo(h)
    assert pci.busId == "00000000:47:00.0"
    assert pci.busIdLegacy == "0000:47:00.0"
    assert (pci.domain, pci.bus, pci.device) == (0, 0x47, 0)
    assert (pci.pciDeviceId, pci.pciSubSystemId) == (0x20B010DE, 0x134F10DE)
    ext = nvml.nvmlPciInfoExt_v1_t()
    ext.version = nvml.nvmlPciInfoExt_v1
    nvml.nvmlDeviceGetPciInfoExt(h, nvml.byref(ext))
    assert (ext.bus, ext.pciDeviceId, ext.baseClass, ext.subClass) == (0x47, 0x20B010DE, 3, 2)
    assert ext.busId in (b"00000000:47:00.0", "00000000:47:00.0")
    bad = nvml.nvmlPciInfoExt_v1_t()
    bad.version = 1
    nvml_error(nvml, nvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH, nvml.nvmlDeviceGetPciInfoExt, h,
               nvml.byref(bad))


def _cpus(words: Any) -> set[int]:
    return {w * 64 + b for w, word in enumerate(words) for b in range(64) if word >> b & 1}


def test_numa_and_cpu_affinity(nvml: Any) -> None:
    for i in range(8):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        node = nvml.nvmlDeviceGetNumaNodeId(h)
        assert node == (0 if i < 4 else 1)
        cpus = _cpus(nvml.nvmlDeviceGetCpuAffinity(h, 4))
        expected = (set(range(0, 64)) | set(range(128, 192))) if node == 0 else (
            set(range(64, 128)) | set(range(192, 256)))
        assert cpus == expected
        scope = nvml.NVML_AFFINITY_SCOPE_NODE
        assert _cpus(nvml.nvmlDeviceGetCpuAffinityWithinScope(h, 4, scope)) == expected
        assert list(nvml.nvmlDeviceGetMemoryAffinity(h, 1, scope)) == [1 << node]


def test_topology_common_ancestor(nvml: Any) -> None:
    d = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(8)]
    level = nvml.nvmlDeviceGetTopologyCommonAncestor
    assert level(d[0], d[0]) == nvml.NVML_TOPOLOGY_INTERNAL
    assert level(d[0], d[1]) == nvml.NVML_TOPOLOGY_SINGLE  # same PCIe switch
    assert level(d[0], d[2]) == nvml.NVML_TOPOLOGY_NODE  # same NUMA node
    assert level(d[0], d[4]) == nvml.NVML_TOPOLOGY_SYSTEM  # across sockets
    near = nvml.nvmlDeviceGetTopologyNearestGpus(d[0], nvml.NVML_TOPOLOGY_NODE)
    assert sorted(nvml.nvmlDeviceGetIndex(x) for x in near) == [1, 2, 3]
    on_cpu_70 = nvml.nvmlSystemGetTopologyGpuSet(70)
    assert sorted(nvml.nvmlDeviceGetIndex(x) for x in on_cpu_70) == [4, 5, 6, 7]


@pytest.mark.parametrize("profile_name", ["a100-sxm4-40gb-x16"])
def test_nvlink_pairs(nvml: Any) -> None:
    h0 = nvml.nvmlDeviceGetHandleByIndex(0)
    bus1 = nvml.nvmlDeviceGetPciInfo(nvml.nvmlDeviceGetHandleByIndex(1)).busId
    for link in range(12):
        assert nvml.nvmlDeviceGetNvLinkState(h0, link) == nvml.NVML_FEATURE_ENABLED
        assert nvml.nvmlDeviceGetNvLinkVersion(h0, link) == nvml.NVML_NVLINK_VERSION_3_1
        assert nvml.nvmlDeviceGetNvLinkRemotePciInfo(h0, link).busId == bus1
        assert nvml.nvmlDeviceGetNvLinkRemoteDeviceType(h0, link) == (
            nvml.NVML_NVLINK_DEVICE_TYPE_GPU)
    nvml_error(nvml, nvml.NVML_ERROR_INVALID_ARGUMENT, nvml.nvmlDeviceGetNvLinkState, h0, 12)
    h1, h2 = nvml.nvmlDeviceGetHandleByIndex(1), nvml.nvmlDeviceGetHandleByIndex(2)
    nvlink, ok = nvml.NVML_P2P_CAPS_INDEX_NVLINK, nvml.NVML_P2P_STATUS_OK
    assert nvml.nvmlDeviceGetP2PStatus(h0, h1, nvlink) == ok
    assert nvml.nvmlDeviceGetP2PStatus(h0, h2, nvlink) != ok


@pytest.mark.parametrize("profile_name", ["a100-sxm4-40gb-x16"])
def test_nvlink_to_a_lost_peer_goes_down(nvml: Any, ctl: MockControl) -> None:
    ctl.lose(1)
    h0 = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetNvLinkState(h0, 0) == nvml.NVML_FEATURE_DISABLED
    assert nvml.nvmlDeviceGetNvLinkState(nvml.nvmlDeviceGetHandleByIndex(2), 0) == (
        nvml.NVML_FEATURE_ENABLED)


@pytest.mark.parametrize("profile_name", ["a100-80gb-x4"])
def test_nvlink_all_to_all(nvml: Any) -> None:
    buses = [nvml.nvmlDeviceGetPciInfo(nvml.nvmlDeviceGetHandleByIndex(i)).busId for i in range(4)]
    h = nvml.nvmlDeviceGetHandleByIndex(2)
    remote = {nvml.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId for link in range(12)}
    assert remote == {buses[0], buses[1], buses[3]}


@pytest.mark.parametrize("profile_name", ["t4-x2"])
def test_no_nvlink_on_t4(nvml: Any) -> None:
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    nvml_error(nvml, nvml.NVML_ERROR_NOT_SUPPORTED, nvml.nvmlDeviceGetNvLinkState, h, 0)


def test_telemetry(nvml: Any) -> None:
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU) == 31
    assert nvml.nvmlDeviceGetPowerUsage(h) == 62000
    assert nvml.nvmlDeviceGetEnforcedPowerLimit(h) == 400000
    assert nvml.nvmlDeviceGetPowerManagementLimit(h) == 400000
    u = nvml.nvmlDeviceGetUtilizationRates(h)
    assert (u.gpu, u.memory) == (0, 0)
    assert nvml.nvmlDeviceGetPersistenceMode(h) == nvml.NVML_FEATURE_ENABLED
    assert nvml.nvmlDeviceGetPerformanceState(h) == 0
    assert nvml.nvmlDeviceGetComputeMode(h) == nvml.NVML_COMPUTEMODE_DEFAULT
    assert nvml.nvmlDeviceGetEccMode(h) == [1, 1]
    assert nvml.nvmlDeviceGetCurrPcieLinkGeneration(h) == 4
    assert nvml.nvmlDeviceGetMaxPcieLinkWidth(h) == 16


def test_running_processes(nvml: Any, ctl: MockControl) -> None:
    h = nvml.nvmlDeviceGetHandleByIndex(3)
    assert nvml.nvmlDeviceGetComputeRunningProcesses(h) == []
    ctl.set_process(3, pid=1234, mem_mb=100, name="trainer")
    ctl.set_process(3, pid=1235, mem_mb=50)
    ctl.set_process(4, pid=999, mem_mb=1)
    procs = nvml.nvmlDeviceGetComputeRunningProcesses(h)
    assert [(p.pid, p.usedGpuMemory) for p in procs] == [(1234, 100 * MIB), (1235, 50 * MIB)]
    assert all(p.gpuInstanceId == 0xFFFFFFFF and p.computeInstanceId == 0xFFFFFFFF for p in procs)
    assert nvml.nvmlSystemGetProcessName(1234) == "trainer"
    assert nvml.nvmlDeviceGetGraphicsRunningProcesses(h) == []
    ctl.set_process(3, pid=1234, mem_mb=300)  # update, not a second entry
    assert [p.usedGpuMemory for p in nvml.nvmlDeviceGetComputeRunningProcesses(h)] == [
        300 * MIB, 50 * MIB]
    ctl.clear_processes(gpu=3, pid=1235)
    assert [p.pid for p in nvml.nvmlDeviceGetComputeRunningProcesses(h)] == [1234]
    ctl.clear_processes(gpu=3)
    assert nvml.nvmlDeviceGetComputeRunningProcesses(h) == []
    assert len(nvml.nvmlDeviceGetComputeRunningProcesses(nvml.nvmlDeviceGetHandleByIndex(4))) == 1
    with pytest.raises(MockNvmlError, match="Insufficient resources"):
        ctl.set_process(3, pid=1, mem_mb=50000)  # more than the GPU has


@pytest.mark.parametrize("profile_name", ["a100-sxm4-40gb-x16"])
def test_sixteen_gpus(nvml: Any) -> None:
    assert nvml.nvmlDeviceGetCount() == 16
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(16)]
    assert [nvml.nvmlDeviceGetMinorNumber(h) for h in handles] == list(range(16))
    assert len({nvml.nvmlDeviceGetUUID(h) for h in handles}) == 16
    h15 = handles[15]
    assert nvml.nvmlDeviceGetPciInfo(h15).busId == "00000001:C1:00.0"
    assert nvml.nvmlDeviceGetIndex(nvml.nvmlDeviceGetHandleByPciBusId("00000001:C1:00.0")) == 15
    assert nvml.nvmlDeviceGetNumaNodeId(handles[12]) == 1
    assert nvml.nvmlDeviceGetNvLinkRemotePciInfo(handles[12], 0).busId == nvml.nvmlDeviceGetPciInfo(
        handles[13]).busId


def test_lost_gpu(nvml: Any, ctl: MockControl) -> None:
    h1 = nvml.nvmlDeviceGetHandleByIndex(1)
    uuid1 = nvml.nvmlDeviceGetUUID(h1)
    ctl.lose(1)
    lost = nvml.NVML_ERROR_GPU_IS_LOST
    nvml_error(nvml, lost, nvml.nvmlDeviceGetHandleByIndex, 1)
    nvml_error(nvml, lost, nvml.nvmlDeviceGetHandleByUUID, uuid1)
    nvml_error(nvml, lost, nvml.nvmlDeviceGetName, h1)  # a handle taken before
    nvml_error(nvml, lost, nvml.nvmlDeviceGetMemoryInfo, h1)
    nvml_error(nvml, lost, nvml.nvmlDeviceGetMigMode, h1)
    assert nvml.nvmlDeviceGetCount() == 8  # still enumerated, as on a real node
    h0 = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetName(h0) == "NVIDIA A100-SXM4-40GB"
    assert nvml.nvmlDeviceGetNvLinkState(h0, 0) == nvml.NVML_FEATURE_ENABLED  # to an NVSwitch
    with pytest.raises(MockNvmlError, match="GPU is lost"):
        ctl.reset(1)
    ctl.restore(1)
    assert nvml.nvmlDeviceGetName(h1) == "NVIDIA A100-SXM4-40GB"


def test_status_json_matches_nvml(nvml: Any, ctl: MockControl, state_dir: Path) -> None:
    st = ctl.status()
    assert st["profile"] == "a100-sxm4-40gb-x8" and st["state_dir"] == str(state_dir)
    assert [g["uuid"] for g in st["gpus"]] == [
        nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(8)]
    assert st["gpus"][0]["mig"] == {"table": "A100-SXM4-40GB", "current": False,
                                    "pending": False, "gpu_instances": []}
