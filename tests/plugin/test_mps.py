"""MPS sharing in the device plugin: replicas, Allocate answers, GFD labels and the per-GPU
control daemons (against a scripted control binary; the lab's stand-in is tested with the lab)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from plugin_testlib import A100, T4, ScriptedMpsControl, cfg, gpu_uuid, make_gpu, make_inventory

from gpukit.contracts import label_names as ln
from gpukit.plugin.allocate import AllocationError, Allocator, Mount
from gpukit.plugin.labels import SYSFS_ROOT_ENV, compute_labels
from gpukit.plugin.mps import mps_layout
from gpukit.plugin.mps_daemons import DaemonSpec, MpsDaemons
from gpukit.plugin.resources import ResourceError, build_resources

MPS4 = {"sharing": {"mps": {"resources": [{"name": "gpu", "replicas": 4}]}}}


@pytest.fixture(autouse=True)
def empty_sysfs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "sys"
    (root / "bus/pci/devices").mkdir(parents=True)
    monkeypatch.setenv(SYSFS_ROOT_ENV, str(root))


def test_replicas_and_labels_as_nvidia_writes_them() -> None:
    node = make_inventory([make_gpu(0, T4), make_gpu(1, T4)])
    config = cfg(MPS4)
    res = build_resources(node, config).resources
    assert [d.id for d in res["nvidia.com/gpu"].devices][:2] == [
        f"{gpu_uuid(0)}::0", f"{gpu_uuid(0)}::1"]
    assert len(res["nvidia.com/gpu"].devices) == 8
    labels = compute_labels(node, config)
    assert labels[ln.MPS_CAPABLE] == "true"
    assert labels[ln.SHARING_STRATEGY] == "mps"
    assert labels["nvidia.com/gpu.replicas"] == "4"
    assert labels["nvidia.com/gpu.product"] == "Tesla-T4-SHARED"
    plain = compute_labels(node, cfg())
    assert plain[ln.MPS_CAPABLE] == "false"


def test_mig_devices_are_not_shared_with_mps() -> None:
    node = make_inventory([make_gpu(0, A100, migs=("3g.20gb", "3g.20gb"))])
    doc = {"flags": {"migStrategy": "single"}, **MPS4}
    with pytest.raises(ResourceError, match=r"sharing.mps.resources\[0\]: nvidia.com/gpu is "
                       r"served by MIG devices here \(0:0, migStrategy single\); MIG devices "
                       "cannot be shared with MPS"):
        build_resources(node, cfg(doc))


def allocator(doc: dict[str, Any]) -> Allocator:
    config = cfg(doc)
    node = make_inventory([make_gpu(0, T4), make_gpu(1, T4)])
    rs = build_resources(node, config)
    return Allocator(rs.resources["nvidia.com/gpu"], config,
                     mps=mps_layout(rs, config.flags.mps_root))


def test_allocate_points_the_container_at_its_gpus_daemon() -> None:
    a = allocator(MPS4).allocate([f"{gpu_uuid(1)}::2"])
    assert a.envs == {
        "NVIDIA_VISIBLE_DEVICES": gpu_uuid(1),
        "CUDA_MPS_PIPE_DIRECTORY": "/mps/nvidia.com/gpu/pipe",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=3840M",  # 15360 MiB / 4
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
    }
    assert a.mounts == [
        Mount("/mps/nvidia.com/gpu/pipe", f"/run/nvidia/mps/{gpu_uuid(1)}/pipe"),
        Mount("/dev/shm", "/run/nvidia/mps/shm"),
    ]


def test_allocate_refuses_more_than_one_replica_by_default() -> None:
    with pytest.raises(AllocationError, match="maximum request size for shared resources is 1"):
        allocator(MPS4).allocate([f"{gpu_uuid(0)}::0", f"{gpu_uuid(0)}::1"])


def test_relaxed_requests_take_shares_of_one_gpu_only() -> None:
    doc = {"flags": {"mpsRoot": "/var/mps"}, "sharing": {"mps": {
        "failRequestsGreaterThanOne": False, "resources": [{"name": "gpu", "replicas": 4}]}}}
    a = allocator(doc).allocate([f"{gpu_uuid(0)}::0", f"{gpu_uuid(0)}::3"])
    assert a.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=7680M"
    assert a.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert a.mounts[0] == Mount("/mps/nvidia.com/gpu/pipe", f"/var/mps/{gpu_uuid(0)}/pipe")
    with pytest.raises(AllocationError, match="MPS replicas of 2 GPUs in one container"):
        allocator(doc).allocate([f"{gpu_uuid(0)}::0", f"{gpu_uuid(1)}::0"])


def test_whole_gpus_beside_mps_replicas_get_no_mps() -> None:
    doc = {"sharing": {"mps": {"resources": [{"name": "gpu", "replicas": 2, "devices": [0]}]}}}
    a = allocator(doc).allocate([gpu_uuid(1)])
    assert "CUDA_MPS_PIPE_DIRECTORY" not in a.envs and a.mounts == []


def daemons_for() -> tuple[MpsDaemons, ScriptedMpsControl, dict[str, bool]]:
    control = ScriptedMpsControl()
    modes: dict[str, bool] = {}
    return MpsDaemons(lambda uuid, ex: modes.__setitem__(uuid, ex), run=control), control, modes


def specs_of(doc: dict[str, Any], root: Path) -> dict[str, DaemonSpec]:
    config = cfg({"flags": {"mpsRoot": str(root)}, **doc})
    node = make_inventory([make_gpu(0, T4), make_gpu(1, T4)])
    return mps_layout(build_resources(node, config), str(root)).daemons()


def test_daemons_started_configured_and_stopped_per_gpu(tmp_path: Path) -> None:
    root = tmp_path / "mps"
    daemons, control, modes = daemons_for()
    assert daemons.reconcile(str(root), specs_of(MPS4, root), "GPU-") == {}
    pipe0 = str(root / gpu_uuid(0) / "pipe")
    assert control.visible[pipe0] == gpu_uuid(0)
    assert control.daemons[pipe0] == {
        "set_default_device_pinned_mem_limit": f"{gpu_uuid(0)} 3840M",
        "set_default_active_thread_percentage": "25",
    }
    assert modes == {gpu_uuid(0): True, gpu_uuid(1): True}
    assert (root / "shm").is_dir() and (root / gpu_uuid(1) / "log").is_dir()
    # Unchanged and answering: nothing started again.
    control.calls.clear()
    daemons.reconcile(str(root), specs_of(MPS4, root), "GPU-")
    assert [c for _, c in control.calls] == ["get_default_active_thread_percentage"] * 2
    # GPU 1 leaves MPS: its daemon quits, compute mode back to DEFAULT, directory gone.
    one = {"sharing": {"mps": {"resources": [{"name": "gpu", "replicas": 4, "devices": [0]}]}}}
    daemons.reconcile(str(root), specs_of(one, root), "GPU-")
    assert str(root / gpu_uuid(1) / "pipe") not in control.daemons
    assert modes[gpu_uuid(1)] is False and not (root / gpu_uuid(1)).exists()
    assert pipe0 in control.daemons


def test_a_daemon_that_stopped_answering_is_started_again(tmp_path: Path) -> None:
    root = tmp_path / "mps"
    daemons, control, _ = daemons_for()
    daemons.reconcile(str(root), specs_of(MPS4, root), "GPU-")
    pipe0 = str(root / gpu_uuid(0) / "pipe")
    del control.daemons[pipe0]  # the daemon died
    assert daemons.reconcile(str(root), specs_of(MPS4, root), "GPU-") == {}
    assert control.daemons[pipe0]["set_default_active_thread_percentage"] == "25"


def test_a_daemon_that_cannot_start_is_a_problem_and_leaves_no_mode(tmp_path: Path) -> None:
    root = tmp_path / "mps"
    daemons, control, modes = daemons_for()
    control.fail_start = True
    problems = daemons.reconcile(str(root), specs_of(MPS4, root), "GPU-")
    assert set(problems) == {gpu_uuid(0), gpu_uuid(1)}
    assert problems[gpu_uuid(0)] == f"MPS daemon {gpu_uuid(0)}: did not start: cannot start"
    assert modes == {gpu_uuid(0): False, gpu_uuid(1): False}  # set, then restored
    # Started but refusing its limits: stopped again, nothing half-applied.
    control.fail_start, control.fail_command = False, "set_default_active_thread_percentage"
    problems = daemons.reconcile(str(root), specs_of(MPS4, root), "GPU-")
    assert "control command 'set_default_active_thread_percentage': refused" in (
        problems[gpu_uuid(0)])
    assert control.daemons == {} and modes[gpu_uuid(0)] is False


def test_daemons_a_previous_plugin_left_are_stopped_when_mps_is_off(tmp_path: Path) -> None:
    root = tmp_path / "mps"
    first, control, _ = daemons_for()
    first.reconcile(str(root), specs_of(MPS4, root), "GPU-")
    (root / "claim-1234").mkdir()  # the DRA plugin's: not the device plugin's to stop
    # A new agent with a time-slicing config: the leftovers go, with their directories, and
    # their GPUs' compute mode is restored from what the daemons were started for.
    modes: dict[str, bool] = {}
    second = MpsDaemons(lambda uuid, ex: modes.__setitem__(uuid, ex), run=control)
    assert second.reconcile(str(root), {}, "GPU-") == {}
    assert control.daemons == {}
    assert modes == {gpu_uuid(0): False, gpu_uuid(1): False}
    assert sorted(p.name for p in root.iterdir()) == ["claim-1234", "shm"]
