"""NVSwitch nodes (DGX A100, DGX H100): every GPU link ends at a switch of the baseboard, and the
mock answers as the driver does there: remote device type SWITCH, the switch's PCI info as the
remote end, NVLink P2P for every pair of GPUs, PCIe topology unchanged."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from nvmltest import nvml_error

from gpukit.lab import nvml as mock
from gpukit.lab.nvml.control import MockControl

pytestmark = pytest.mark.nvml

# profile -> (NVLink version as NVML answers it: an nvmlNvlinkVersion_t, NVML_NVLINK_VERSION_3_1
# = 5 on an A100, 4_0 = 6 on an H100; the switches' PCI device id, links per switch bus id)
NVSWITCH_NODES = {
    "a100-sxm4-40gb-x8": (5, 0x1AF110DE, {f"00000000:C{n}:00.0": 2 for n in range(4, 10)}),
    "h100-80gb-x8": (6, 0x22A310DE, {"00000000:05:00.0": 5, "00000000:06:00.0": 4,
                                     "00000000:07:00.0": 4, "00000000:08:00.0": 5}),
}

# profile -> the nvmlNvlinkVersion_t every link answers (NVLink 3 on A100 is reported as 3.1,
# NVLink 4 on H100/H200 as 4.0, NVLink 5 on B200/GB200 as 5.0); None: no NVLink
NVLINK_VERSIONS = {
    "a100-sxm4-40gb-x8": "NVML_NVLINK_VERSION_3_1",
    "a100-80gb-x4": "NVML_NVLINK_VERSION_3_1",
    "a100-sxm4-40gb-x16": "NVML_NVLINK_VERSION_3_1",
    "h100-80gb-x8": "NVML_NVLINK_VERSION_4_0",
    "h200-x8": "NVML_NVLINK_VERSION_4_0",
    "b200-x8": "NVML_NVLINK_VERSION_5_0",
    "gb200-x4": "NVML_NVLINK_VERSION_5_0",
    "t4-x2": None,
}


def test_every_profile_has_its_nvlink_version_listed() -> None:
    assert set(NVLINK_VERSIONS) == set(mock.profiles())


@pytest.mark.parametrize("profile_name", sorted(NVLINK_VERSIONS))
def test_nvlink_version_is_the_enum_the_driver_answers(nvml: Any, profile_name: str) -> None:
    """nvmlDeviceGetNvLinkVersion answers an nvmlNvlinkVersion_t, not the generation number."""
    expected = NVLINK_VERSIONS[profile_name]
    for i in range(nvml.nvmlDeviceGetCount()):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        if expected is None:
            nvml_error(nvml, nvml.NVML_ERROR_NOT_SUPPORTED, nvml.nvmlDeviceGetNvLinkVersion, h, 0)
            continue
        assert nvml.nvmlDeviceGetNvLinkVersion(h, 0) == getattr(nvml, expected)
        assert nvml.nvmlDeviceGetNvLinkVersion(h, _links(nvml, h) - 1) == getattr(nvml, expected)


def _links(nvml: Any, h: Any) -> int:
    """How many links NVML has for this GPU: the first index it refuses ends them."""
    for link in range(nvml.NVML_NVLINK_MAX_LINKS):
        try:
            nvml.nvmlDeviceGetNvLinkState(h, link)
        except nvml.NVMLError_InvalidArgument:
            return link
    return nvml.NVML_NVLINK_MAX_LINKS


@pytest.mark.parametrize("profile_name", sorted(NVSWITCH_NODES))
def test_every_link_ends_at_a_switch(nvml: Any, profile_name: str) -> None:
    version, switch_id, per_switch = NVSWITCH_NODES[profile_name]
    for i in range(nvml.nvmlDeviceGetCount()):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        n = _links(nvml, h)
        assert n == sum(per_switch.values())
        remote: Counter[str] = Counter()
        for link in range(n):
            assert nvml.nvmlDeviceGetNvLinkState(h, link) == nvml.NVML_FEATURE_ENABLED
            assert nvml.nvmlDeviceGetNvLinkVersion(h, link) == version
            assert nvml.nvmlDeviceGetNvLinkRemoteDeviceType(h, link) == (
                nvml.NVML_NVLINK_DEVICE_TYPE_SWITCH)
            pci = nvml.nvmlDeviceGetNvLinkRemotePciInfo(h, link)
            assert pci.pciDeviceId == switch_id
            assert pci.busIdLegacy == pci.busId[4:]
            remote[pci.busId] += 1
        assert remote == per_switch, f"GPU {i}"
    # A switch is no GPU: NVML has no device handle for its bus id.
    for bus in per_switch:
        nvml_error(nvml, nvml.NVML_ERROR_NOT_FOUND, nvml.nvmlDeviceGetHandleByPciBusId, bus)


@pytest.mark.parametrize("profile_name", sorted(NVSWITCH_NODES))
def test_nvlink_p2p_between_every_pair(nvml: Any) -> None:
    n = nvml.nvmlDeviceGetCount()
    h = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
    statuses = {
        (a, b): nvml.nvmlDeviceGetP2PStatus(h[a], h[b], nvml.NVML_P2P_CAPS_INDEX_NVLINK)
        for a in range(n) for b in range(n) if a != b
    }
    assert len(statuses) == 56
    assert set(statuses.values()) == {nvml.NVML_P2P_STATUS_OK}


@pytest.mark.parametrize("profile_name", sorted(NVSWITCH_NODES))
def test_pcie_topology_is_unchanged_by_the_switches(nvml: Any) -> None:
    """nvmlDeviceGetTopologyCommonAncestor is PCIe only; NVLink shows elsewhere."""
    h = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(8)]

    def level(a: int, b: int) -> int:
        return int(nvml.nvmlDeviceGetTopologyCommonAncestor(h[a], h[b]))

    assert level(0, 1) == nvml.NVML_TOPOLOGY_SINGLE
    assert level(0, 2) == nvml.NVML_TOPOLOGY_NODE
    assert level(0, 4) == nvml.NVML_TOPOLOGY_SYSTEM


@pytest.mark.parametrize("profile_name", ["h100-80gb-x8"])
def test_a_lost_gpu_leaves_the_switch_links_of_the_others_up(
    nvml: Any, ctl: MockControl
) -> None:
    h0, h3 = nvml.nvmlDeviceGetHandleByIndex(0), nvml.nvmlDeviceGetHandleByIndex(3)
    ctl.lose(3)
    assert {nvml.nvmlDeviceGetNvLinkState(h0, link) for link in range(18)} == {
        nvml.NVML_FEATURE_ENABLED}
    nvml_error(nvml, nvml.NVML_ERROR_GPU_IS_LOST, nvml.nvmlDeviceGetNvLinkState, h3, 0)
    nvml_error(nvml, nvml.NVML_ERROR_GPU_IS_LOST, nvml.nvmlDeviceGetP2PStatus, h0, h3,
               nvml.NVML_P2P_CAPS_INDEX_NVLINK)


@pytest.mark.parametrize(
    ("profile_name", "kinds"), [("a100-sxm4-40gb-x16", {0}), ("a100-80gb-x4", {0}), ("t4-x2", set())]
)
def test_pair_and_pcie_nodes_have_no_switch(nvml: Any, kinds: set[int]) -> None:
    """GPU-to-GPU NVLink answers remote type GPU (0) on every link; no NVLink, no links."""
    for i in range(nvml.nvmlDeviceGetCount()):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        try:
            n = _links(nvml, h)
        except nvml.NVMLError_NotSupported:
            n = 0
        assert {nvml.nvmlDeviceGetNvLinkRemoteDeviceType(h, link) for link in range(n)} == kinds


def _write_profile(tmp_path: Path, **defaults: Any) -> Path:
    doc: dict[str, Any] = {
        "name": "two-gpus",
        "driver_version": "550.90.07",
        "cuda_driver_version": "12.4",
        "nvswitches": [
            {"pci_bus_id": "C4:00.0", "pci_device_id": 0x1AF110DE},
            {"pci_bus_id": "00000000:C5:00.0", "pci_device_id": 0x1AF110DE,
             "pci_subsystem_id": 0x134F10DE},
        ],
        "defaults": {"name": "NVIDIA A100-SXM4-40GB", "pci_device_id": 0x20B010DE,
                     "memory_mib": 40960, "compute_capability": "8.0",
                     "architecture": "ampere", "nvlink_links": 4, **defaults},
        "gpus": [{"pci_bus_id": "00000000:07:00.0"}, {"pci_bus_id": "00000000:0F:00.0"},
                 {"pci_bus_id": "00000000:47:00.0", "nvlink_switches": [1]}],
    }
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _init(path: Path, tmp_path: Path, mock_lib: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    import pynvml

    monkeypatch.setenv(mock.ENV_PROFILE, str(path))
    monkeypatch.setenv(mock.ENV_STATE_DIR, str(tmp_path / "state"))
    mock.load_mock(mock_lib)
    pynvml.nvmlInit()
    return pynvml


def test_switch_wiring_from_the_profile(
    mock_lib: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Link i goes to nvlink_switches[i % n]; GPUs talk over NVLink where they share a switch."""
    nvml = _init(_write_profile(tmp_path, nvlink_switches=[0, 1]), tmp_path, mock_lib, monkeypatch)
    try:
        h = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(3)]
        buses = [nvml.nvmlDeviceGetNvLinkRemotePciInfo(h[0], link).busId for link in range(4)]
        assert buses == ["00000000:C4:00.0", "00000000:C5:00.0"] * 2
        pci = nvml.nvmlDeviceGetNvLinkRemotePciInfo(h[2], 0)
        assert (pci.busId, pci.pciSubSystemId) == ("00000000:C5:00.0", 0x134F10DE)
        assert (pci.domain, pci.bus, pci.device) == (0, 0xC5, 0)
        nvlink, ok = nvml.NVML_P2P_CAPS_INDEX_NVLINK, nvml.NVML_P2P_STATUS_OK
        assert nvml.nvmlDeviceGetP2PStatus(h[0], h[1], nvlink) == ok
        assert nvml.nvmlDeviceGetP2PStatus(h[2], h[0], nvlink) == ok  # both reach switch 1
    finally:
        nvml.nvmlShutdown()


def test_unwired_links_are_down_with_nothing_at_the_far_end(
    mock_lib: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GPUs 0 and 1 have links wired to nothing; GPU 2's go to switch 1, which no one shares."""
    nvml = _init(_write_profile(tmp_path), tmp_path, mock_lib, monkeypatch)
    try:
        h = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(3)]
        assert nvml.nvmlDeviceGetNvLinkState(h[0], 0) == nvml.NVML_FEATURE_DISABLED
        assert nvml.nvmlDeviceGetNvLinkRemoteDeviceType(h[0], 0) == (
            nvml.NVML_NVLINK_DEVICE_TYPE_UNKNOWN)
        nvml_error(nvml, nvml.NVML_ERROR_NOT_FOUND, nvml.nvmlDeviceGetNvLinkRemotePciInfo,
                   h[0], 0)
        nvml_error(nvml, nvml.NVML_ERROR_INVALID_ARGUMENT,
                   nvml.nvmlDeviceGetNvLinkRemoteDeviceType, h[0], 4)
        nvlink = nvml.NVML_P2P_CAPS_INDEX_NVLINK
        assert nvml.nvmlDeviceGetP2PStatus(h[2], h[0], nvlink) == (
            nvml.NVML_P2P_STATUS_NOT_SUPPORTED)
    finally:
        nvml.nvmlShutdown()


# ---- NVLink fabric (nvmlDeviceGetGpuFabricInfo / ...InfoV): GB200 NVL72 trays ----
GB200_CLUSTER = bytes.fromhex("6f1c2a9e3b7d4e58a0c49d21e5b7f360")  # gb200-x4.yaml (the lab's)
GB200_CLIQUE = 32766


@pytest.mark.parametrize("profile_name", ["gb200-x4"])
def test_fabric_info_of_a_gb200_tray(nvml: Any) -> None:
    """Every GPU: registered (state completed, status success), one cluster, one clique; the v1
    struct, the versioned call with v2 (pynvml's c_nvmlGpuFabricInfoV_t, go-nvml's V2) and v3."""
    for i in range(nvml.nvmlDeviceGetCount()):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        v1 = nvml.c_nvmlGpuFabricInfo_t()
        assert nvml.nvmlDeviceGetGpuFabricInfo(h, nvml.byref(v1)) == nvml.NVML_SUCCESS
        v2 = nvml.c_nvmlGpuFabricInfo_v2_t()
        nvml.nvmlDeviceGetGpuFabricInfoV(h, nvml.byref(v2))
        v3 = nvml.c_nvmlGpuFabricInfo_v3_t()
        nvml.nvmlDeviceGetGpuFabricInfoV(h, nvml.byref(v3))
        for info in (v1, v2, v3):
            assert bytes(info.clusterUuid) == GB200_CLUSTER
            assert info.cliqueId == GB200_CLIQUE
            assert info.state == nvml.NVML_GPU_FABRIC_STATE_COMPLETED
            assert info.status == nvml.NVML_SUCCESS
        assert (v2.version, v3.version) == (nvml.nvmlGpuFabricInfo_v2, nvml.nvmlGpuFabricInfo_v3)
        assert v2.healthMask == v3.healthMask == 0x51AA
        assert v3.healthSummary == nvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY
        degraded = (v3.healthMask >> nvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW
                    ) & nvml.NVML_GPU_FABRIC_HEALTH_MASK_WIDTH_DEGRADED_BW
        assert degraded == nvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_FALSE
        if hasattr(nvml, "nvmlDeviceGetGpuFabricInfo_v4"):
            v4 = nvml.c_nvmlGpuFabricInfo_v4_t()
            nvml.nvmlDeviceGetGpuFabricInfo_v4(h, nvml.byref(v4))
            assert bytes(v4.clusterUuid) == GB200_CLUSTER and v4.numCliques == 1
            assert (v4.cliques[0].type, v4.cliques[0].id) == (
                nvml.NVML_GPU_FABRIC_CLIQUE_TYPE_UNICAST_POINTER, GB200_CLIQUE)


@pytest.mark.parametrize("profile_name", ["gb200-x4"])
def test_fabric_info_v2_writes_no_byte_past_its_struct(nvml: Any) -> None:
    """A v2 caller's buffer is 36 bytes: v3's healthSummary (byte 36) must stay untouched."""
    import ctypes

    buf = (ctypes.c_ubyte * 48)(*([0xEE] * 48))
    ctypes.c_uint.from_buffer(buf).value = nvml.nvmlGpuFabricInfo_v2
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    nvml.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(buf))
    assert list(buf[36:]) == [0xEE] * 12
    info = nvml.c_nvmlGpuFabricInfo_v2_t.from_buffer(buf)
    assert info.cliqueId == GB200_CLIQUE


@pytest.mark.parametrize("profile_name", ["gb200-x4"])
def test_fabric_info_refuses_an_unknown_struct_version(nvml: Any) -> None:
    info = nvml.c_nvmlGpuFabricInfo_v3_t()
    info.version = 0x07000028
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    nvml_error(nvml, nvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
               nvml.nvmlDeviceGetGpuFabricInfoV, h, nvml.byref(info))


@pytest.mark.parametrize("profile_name", ["h100-80gb-x8", "b200-x8", "t4-x2"])
def test_gpus_without_a_fabric_answer_not_supported(nvml: Any) -> None:
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    nvml_error(nvml, nvml.NVML_ERROR_NOT_SUPPORTED, nvml.nvmlDeviceGetGpuFabricInfo, h,
               nvml.byref(nvml.c_nvmlGpuFabricInfo_t()))
    for cls in (nvml.c_nvmlGpuFabricInfo_v2_t, nvml.c_nvmlGpuFabricInfo_v3_t):
        nvml_error(nvml, nvml.NVML_ERROR_NOT_SUPPORTED, nvml.nvmlDeviceGetGpuFabricInfoV, h,
                   nvml.byref(cls()))


def test_fabric_from_the_profile_per_gpu(
    mock_lib: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GPU's own `fabric` replaces the defaults' (here: one still registering, one with none)."""
    path = _write_profile(tmp_path, fabric={"cluster_uuid": "00112233-4455-6677-8899-aabbccddeeff",
                                            "clique_id": 7})
    doc = yaml.safe_load(path.read_text())
    doc["gpus"][1]["fabric"] = {"cluster_uuid": "00112233445566778899aabbccddeeff",
                                "state": "in_progress"}
    doc["gpus"][2]["fabric"] = "none"
    path.write_text(yaml.safe_dump(doc))
    nvml = _init(path, tmp_path, mock_lib, monkeypatch)
    try:
        infos = []
        for i in range(2):
            info = nvml.c_nvmlGpuFabricInfo_v3_t()
            nvml.nvmlDeviceGetGpuFabricInfoV(nvml.nvmlDeviceGetHandleByIndex(i), nvml.byref(info))
            infos.append(info)
        assert bytes(infos[0].clusterUuid).hex() == "00112233445566778899aabbccddeeff"
        assert (infos[0].cliqueId, infos[0].state) == (7, nvml.NVML_GPU_FABRIC_STATE_COMPLETED)
        assert infos[0].healthSummary == nvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_NOT_SUPPORTED
        assert (infos[1].cliqueId, infos[1].state) == (0, nvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS)
        nvml_error(nvml, nvml.NVML_ERROR_NOT_SUPPORTED, nvml.nvmlDeviceGetGpuFabricInfoV,
                   nvml.nvmlDeviceGetHandleByIndex(2), nvml.byref(nvml.c_nvmlGpuFabricInfo_v3_t()))
    finally:
        nvml.nvmlShutdown()
