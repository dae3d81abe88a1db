"""MPS sharing in the device plugin: replicas, Allocate answers, GFD labels and the per-GPU
control daemons (against a scripted control binary; the lab's stand-in is tested with the lab)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from plugin_testlib import A100, T4, cfg, gpu_uuid, make_gpu, make_inventory

from gpukit.contracts import label_names as ln
from gpukit.plugin.allocate import AllocationError, Allocator, Mount
from gpukit.plugin.labels import SYSFS_ROOT_ENV, compute_labels
from gpukit.plugin.mps import MpsLayout, mps_layout
from gpukit.plugin.mps_daemons import MpsDaemons
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


class ScriptedControl:
    """Stands in for nvidia-cuda-mps-control: daemons per pipe directory, commands logged."""

    def __init__(self) -> None:
        self.daemons: dict[str, dict[str, str]] = {}  # pipe dir -> settings
        self.calls: list[tuple[str, str]] = []
        self.fail_start = False

    def __call__(self, argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        pipe = kw["env"]["CUDA_MPS_PIPE_DIRECTORY"]
        assert kw["env"]["CUDA_VISIBLE_DEVICES"] in pipe
        if argv[1:] == ["-d"]:
            self.calls.append((pipe, "-d"))
            if self.fail_start or pipe in self.daemons:
                return subprocess.CompletedProcess(argv, 1, "", "cannot start")
            self.daemons[pipe] = {}
            return subprocess.CompletedProcess(argv, 0, "", "")
        line = kw["input"].strip()
        self.calls.append((pipe, line))
        if pipe not in self.daemons:
            return subprocess.CompletedProcess(argv, 1, "", "Cannot find MPS control daemon")
        words = line.split()
        if words[0] == "quit":
            del self.daemons[pipe]
        elif words[0].startswith("set_default"):
            self.daemons[pipe][words[0]] = " ".join(words[1:])
        return subprocess.CompletedProcess(argv, 0, "100\n", "")


def daemons_for(tmp_path: Path) -> tuple[MpsDaemons, ScriptedControl, dict[str, bool]]:
    control = ScriptedControl()
    modes: dict[str, bool] = {}
    return MpsDaemons(lambda uuid, ex: modes.__setitem__(uuid, ex), run=control), control, modes


def layout_of(doc: dict[str, Any], root: Path) -> Any:
    config = cfg({"flags": {"mpsRoot": str(root)}, **doc})
    node = make_inventory([make_gpu(0, T4), make_gpu(1, T4)])
    return mps_layout(build_resources(node, config), str(root))


def test_daemons_started_configured_and_stopped_per_gpu(tmp_path: Path) -> None:
    root = tmp_path / "mps"
    daemons, control, modes = daemons_for(tmp_path)
    assert daemons.reconcile(layout_of(MPS4, root)) == {}
    pipe0 = str(root / gpu_uuid(0) / "pipe")
    assert control.daemons[pipe0] == {
        "set_default_device_pinned_mem_limit": "0 3840M",
        "set_default_active_thread_percentage": "25",
    }
    assert modes == {gpu_uuid(0): True, gpu_uuid(1): True}
    assert (root / "shm").is_dir() and (root / gpu_uuid(1) / "log").is_dir()
    # Unchanged and answering: nothing started again.
    control.calls.clear()
    daemons.check()
    assert [c for _, c in control.calls] == ["get_default_active_thread_percentage"] * 2
    # GPU 1 leaves MPS: its daemon quits, compute mode back to DEFAULT, directory gone.
    one = {"sharing": {"mps": {"resources": [{"name": "gpu", "replicas": 4, "devices": [0]}]}}}
    daemons.reconcile(layout_of(one, root))
    assert str(root / gpu_uuid(1) / "pipe") not in control.daemons
    assert modes[gpu_uuid(1)] is False and not (root / gpu_uuid(1)).exists()
    assert pipe0 in control.daemons


def test_a_daemon_that_stopped_answering_is_started_again(tmp_path: Path) -> None:
    root = tmp_path / "mps"
    daemons, control, _ = daemons_for(tmp_path)
    daemons.reconcile(layout_of(MPS4, root))
    pipe0 = str(root / gpu_uuid(0) / "pipe")
    del control.daemons[pipe0]  # the daemon died
    assert daemons.check() == {}
    assert control.daemons[pipe0]["set_default_active_thread_percentage"] == "25"


def test_a_daemon_that_cannot_start_is_a_readiness_problem(tmp_path: Path) -> None:
    root = tmp_path / "mps"
    daemons, control, _ = daemons_for(tmp_path)
    control.fail_start = True
    problems = daemons.reconcile(layout_of(MPS4, root))
    assert set(problems) == {gpu_uuid(0), gpu_uuid(1)}
    assert "the MPS control daemon did not start: cannot start" in problems[gpu_uuid(0)]


def test_daemons_a_previous_agent_left_are_stopped_when_mps_is_off(tmp_path: Path) -> None:
    root = tmp_path / "mps"
    first, control, _ = daemons_for(tmp_path)
    first.reconcile(layout_of(MPS4, root))
    # A new agent with a time-slicing config: the leftovers go, with their directories.
    modes: dict[str, bool] = {}
    second = MpsDaemons(lambda uuid, ex: modes.__setitem__(uuid, ex), run=control)
    ts = {"sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 4}]}}}
    config = cfg({"flags": {"mpsRoot": str(root)}, **ts})
    assert config.sharing_strategy == "time-slicing"
    second.reconcile(MpsLayout(root=str(root), shares={}))
    assert control.daemons == {}
    assert modes == {gpu_uuid(0): False, gpu_uuid(1): False}
    assert sorted(p.name for p in root.iterdir()) == ["shm"]
