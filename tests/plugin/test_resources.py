"""Resource building: MIG strategies none/single/mixed and time-slicing, NVIDIA's semantics."""

from __future__ import annotations

import pytest
from plugin_testlib import T4, cfg, gpu_uuid, make_gpu, make_inventory, mig_uuid

from gpukit.plugin.resources import ResourceError, build_resources, mig_cap_nodes


def ids(rs: object, name: str) -> list[str]:
    return [d.id for d in rs.resources[name].devices]  # type: ignore[attr-defined]


def test_none_strategy_whole_gpus_even_with_mig() -> None:
    inv = make_inventory([make_gpu(0, migs=("3g.20gb",)), make_gpu(1)])
    rs = build_resources(inv, cfg())
    assert list(rs.resources) == ["nvidia.com/gpu"]
    assert ids(rs, "nvidia.com/gpu") == [gpu_uuid(0), gpu_uuid(1)]
    assert rs.resources["nvidia.com/gpu"].devices[0].unit.device_nodes == ("/dev/nvidia0",)


def test_mixed_strategy() -> None:
    inv = make_inventory([
        make_gpu(0, migs=("3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb")),
        make_gpu(1),
    ])
    rs = build_resources(inv, cfg({"flags": {"migStrategy": "mixed"}}))
    assert sorted(rs.resources) == [
        "nvidia.com/gpu", "nvidia.com/mig-1g.5gb", "nvidia.com/mig-2g.10gb",
        "nvidia.com/mig-3g.20gb"]
    assert ids(rs, "nvidia.com/gpu") == [gpu_uuid(1)]
    assert ids(rs, "nvidia.com/mig-1g.5gb") == [mig_uuid(0, 2), mig_uuid(0, 3)]
    unit = rs.resources["nvidia.com/mig-3g.20gb"].devices[0].unit
    assert (unit.index_id, unit.device_nodes) == ("0:0", ("/dev/nvidia0",))


def test_mixed_plus_profile_name() -> None:
    from gpukit.contracts.device_ids import mig_resource_name

    assert mig_resource_name("1g.5gb+me") == "nvidia.com/mig-1g.5gb.me"


def test_mixed_skips_empty_mig_gpu_with_warning() -> None:
    inv = make_inventory([make_gpu(0, migs=()), make_gpu(1)])
    rs = build_resources(inv, cfg({"flags": {"migStrategy": "mixed"}}))
    assert ids(rs, "nvidia.com/gpu") == [gpu_uuid(1)]
    assert "GPU 0" in rs.warnings[0]


def test_single_strategy() -> None:
    inv = make_inventory([make_gpu(i, migs=("3g.20gb", "3g.20gb")) for i in range(2)])
    rs = build_resources(inv, cfg({"flags": {"migStrategy": "single"}}))
    assert ids(rs, "nvidia.com/gpu") == [mig_uuid(0, 0), mig_uuid(0, 1), mig_uuid(1, 0),
                                          mig_uuid(1, 1)]


@pytest.mark.parametrize(("gpus", "message"), [
    ([make_gpu(0, migs=("3g.20gb",)), make_gpu(1)],
     "needs every GPU in MIG mode, but GPU(s) 1 have MIG disabled"),
    ([make_gpu(0, migs=("3g.20gb",)), make_gpu(1, migs=())], "GPU(s) 1 have no MIG devices"),
    ([make_gpu(0, migs=("3g.20gb", "1g.5gb"))], "found 1g.5gb, 3g.20gb"),
])
def test_single_strategy_errors(gpus: list[object], message: str) -> None:
    with pytest.raises(ResourceError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build_resources(make_inventory(gpus), cfg({"flags": {"migStrategy": "single"}}))  # type: ignore[arg-type]


def test_single_without_mig_is_like_none() -> None:
    inv = make_inventory([make_gpu(0), make_gpu(1)])
    rs = build_resources(inv, cfg({"flags": {"migStrategy": "single"}}))
    assert ids(rs, "nvidia.com/gpu") == [gpu_uuid(0), gpu_uuid(1)]


def test_time_slicing_all() -> None:
    inv = make_inventory([make_gpu(0, T4), make_gpu(1, T4)])
    rs = build_resources(inv, cfg({"sharing": {"timeSlicing": {"resources": [
        {"name": "nvidia.com/gpu", "replicas": 3}]}}}))
    assert ids(rs, "nvidia.com/gpu") == [f"{gpu_uuid(i)}::{n}" for i in range(2) for n in range(3)]
    assert all(d.is_replica for d in rs.resources["nvidia.com/gpu"].devices)


def test_time_slicing_rename_by_default_and_subset() -> None:
    inv = make_inventory([make_gpu(0, T4), make_gpu(1, T4)])
    rs = build_resources(inv, cfg({"sharing": {"timeSlicing": {
        "renameByDefault": True,
        "resources": [{"name": "nvidia.com/gpu", "replicas": 2, "devices": [1]}]}}}))
    assert ids(rs, "nvidia.com/gpu") == [gpu_uuid(0)]
    assert ids(rs, "nvidia.com/gpu.shared") == [f"{gpu_uuid(1)}::0", f"{gpu_uuid(1)}::1"]


def test_time_slicing_count_and_uuid_refs() -> None:
    inv = make_inventory([make_gpu(i, T4) for i in range(3)])
    rs = build_resources(inv, cfg({"sharing": {"timeSlicing": {"resources": [
        {"name": "gpu", "replicas": 2, "devices": 2}]}}}))
    assert ids(rs, "nvidia.com/gpu")[0] == gpu_uuid(2)  # unshared first, then replicas
    assert len(ids(rs, "nvidia.com/gpu")) == 5
    rs = build_resources(inv, cfg({"sharing": {"timeSlicing": {"resources": [
        {"name": "gpu", "replicas": 2, "devices": [gpu_uuid(1)]}]}}}))
    assert ids(rs, "nvidia.com/gpu") == [gpu_uuid(0), gpu_uuid(2), f"{gpu_uuid(1)}::0",
                                          f"{gpu_uuid(1)}::1"]


def test_per_gpu_replica_counts() -> None:
    inv = make_inventory([make_gpu(i, T4) for i in range(3)])
    rs = build_resources(inv, cfg({"sharing": {"timeSlicing": {"resources": [
        {"name": "gpu", "replicas": 4, "devices": [0]},
        {"name": "gpu", "replicas": 2, "devices": [1]}]}}}))
    got = ids(rs, "nvidia.com/gpu")
    assert got[0] == gpu_uuid(2)
    assert sum(i.startswith(gpu_uuid(0)) for i in got) == 4
    assert sum(i.startswith(gpu_uuid(1)) for i in got) == 2


def test_same_gpu_by_index_and_uuid_rejected() -> None:
    inv = make_inventory([make_gpu(i, T4) for i in range(2)])
    with pytest.raises(ResourceError, match=r"already shared by sharing\.timeSlicing\.resources"):
        build_resources(inv, cfg({"sharing": {"timeSlicing": {"resources": [
            {"name": "gpu", "replicas": 4, "devices": [0]},
            {"name": "gpu", "replicas": 2, "devices": [gpu_uuid(0)]}]}}}))


def test_unknown_device_ref_and_too_many() -> None:
    inv = make_inventory([make_gpu(0, T4)])
    with pytest.raises(ResourceError, match=r"'3' is not a nvidia\.com/gpu device on this node"):
        build_resources(inv, cfg({"sharing": {"timeSlicing": {"resources": [
            {"name": "gpu", "replicas": 2, "devices": [3]}]}}}))
    with pytest.raises(ResourceError, match=r"2 devices of nvidia\.com/gpu requested"):
        build_resources(inv, cfg({"sharing": {"timeSlicing": {"resources": [
            {"name": "gpu", "replicas": 2, "devices": 2}]}}}))


def test_time_slicing_mig_resource() -> None:
    inv = make_inventory([make_gpu(0, migs=("1g.5gb", "1g.5gb", "3g.20gb"))])
    rs = build_resources(inv, cfg({"flags": {"migStrategy": "mixed"}, "sharing": {"timeSlicing": {
        "resources": [{"name": "mig-1g.5gb", "replicas": 2, "devices": ["0:1"]}]}}}))
    assert ids(rs, "nvidia.com/mig-1g.5gb") == [mig_uuid(0, 0), f"{mig_uuid(0, 1)}::0",
                                                 f"{mig_uuid(0, 1)}::1"]


def test_sharing_for_absent_resource_is_ignored() -> None:
    inv = make_inventory([make_gpu(0, T4)])
    rs = build_resources(inv, cfg({"sharing": {"timeSlicing": {"resources": [
        {"name": "mig-1g.5gb", "replicas": 2}]}}}))
    assert ids(rs, "nvidia.com/gpu") == [gpu_uuid(0)]


def test_mig_cap_nodes_from_proc(tmp_path: object) -> None:
    from pathlib import Path

    root = Path(str(tmp_path))
    base = root / "proc/driver/nvidia/capabilities/gpu0/mig/gi3"
    (base / "ci0").mkdir(parents=True)
    (base / "access").write_text("DeviceFileMinor: 30\nDeviceFileMode: 292\n")
    (base / "ci0" / "access").write_text("DeviceFileMinor: 31\n")
    assert mig_cap_nodes(0, 3, 0, str(root)) == (
        "/dev/nvidia-caps/nvidia-cap30", "/dev/nvidia-caps/nvidia-cap31")
    assert mig_cap_nodes(0, 4, 0, str(root)) == ()
