"""A claim asking for MPS: its own control daemon, NVIDIA's container paths, the mpsConfig's
limits, nothing half-applied, the daemon gone on unprepare and back after a restart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from plugin_testlib import ScriptedMpsControl, gpu_uuid, mig_uuid
from test_prepare import REF, UID, Api, claim, preparer, spec_path

from gpukit.plugin.dra.checkpoint import Checkpoint
from gpukit.plugin.dra.prepare import PrepareError, Preparer
from gpukit.plugin.mps_daemons import MpsDaemons


def mps_config(kind: str = "GpuConfig", requests: tuple[str, ...] = ("gpu",),
               **mps: Any) -> dict[str, Any]:
    return {"source": "FromClaim", "requests": list(requests), "opaque": {
        "driver": "gpu.nvidia.com", "parameters": {
            "apiVersion": "resource.nvidia.com/v1beta1", "kind": kind,
            "sharing": {"strategy": "MPS", "mpsConfig": mps}}}}


def with_mps(tmp_path: Path, doc: dict[str, Any], control: ScriptedMpsControl,
             modes: dict[str, bool], checkpoint: Checkpoint | None = None) -> Preparer:
    p = preparer(tmp_path, Api(doc), checkpoint)
    p.mps = MpsDaemons(lambda uuid, ex: modes.__setitem__(uuid, ex), run=control)
    p.mps_root = str(tmp_path / "mps")
    return p


def test_a_claims_mps_daemon_serves_its_devices_with_the_configs_limits(tmp_path: Path) -> None:
    control, modes = ScriptedMpsControl(), {}
    cfg = [mps_config(defaultActiveThreadPercentage=40, defaultPinnedDeviceMemoryLimit="10Gi")]
    p = with_mps(tmp_path, claim([("gpu", "gpu-0"), ("mig", "gpu-1-mig-3g20gb-9-0")],
                                 config=[*cfg, mps_config("MigDeviceConfig", ("mig",))]),
                 control, modes)
    with pytest.raises(PrepareError, match="share through MPS with different mpsConfig"):
        p.prepare(REF)
    assert control.daemons == {} and not spec_path(tmp_path).exists()

    p = with_mps(tmp_path, claim([("gpu", "gpu-0")], config=cfg), control, modes)
    p.prepare(REF)
    pipe = str(tmp_path / "mps" / f"claim-{UID}" / "pipe")
    assert control.visible[pipe] == gpu_uuid(0)
    assert control.daemons[pipe] == {
        "set_default_device_pinned_mem_limit": f"{gpu_uuid(0)} 10240M",
        "set_default_active_thread_percentage": "40"}
    assert modes == {gpu_uuid(0): True}
    edits = json.loads(spec_path(tmp_path).read_text())["devices"][0]["containerEdits"]
    assert "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps" in edits["env"]
    assert {(m["containerPath"], m["hostPath"]) for m in edits["mounts"]} == {
        ("/tmp/nvidia-mps", pipe), ("/dev/shm", str(tmp_path / "mps" / "shm"))}

    assert p.unprepare(REF)
    assert control.daemons == {} and modes == {gpu_uuid(0): False}
    assert not (tmp_path / "mps" / f"claim-{UID}").exists()


def test_per_device_limits_by_position_and_mig_devices_keep_their_gpus_mode(
        tmp_path: Path) -> None:
    control, modes = ScriptedMpsControl(), {}
    cfg = [mps_config("MigDeviceConfig", defaultPerDevicePinnedMemoryLimit={"0": "2Gi"})]
    p = with_mps(tmp_path, claim([("gpu", "gpu-1-mig-3g20gb-9-0")], config=cfg),
                 control, modes)
    p.prepare(REF)
    pipe = str(tmp_path / "mps" / f"claim-{UID}" / "pipe")
    assert control.visible[pipe] == mig_uuid(1, 0)
    assert control.daemons[pipe] == {
        "set_default_device_pinned_mem_limit": f"{mig_uuid(1, 0)} 2048M"}
    assert modes == {}


@pytest.mark.parametrize(("mps", "message"), [
    ({"defaultPinnedDeviceMemoryLimit": "100Ki"},
     "mpsConfig.defaultPinnedDeviceMemoryLimit: '100Ki' is below 1Mi, too low for an MPS limit"),
    ({"defaultPerDevicePinnedMemoryLimit": {"3": "1Gi"}},
     "mpsConfig.defaultPerDevicePinnedMemoryLimit[3]: not one of the claim's MPS devices"),
])
def test_limits_nvidias_driver_refuses_are_refused_by_name(
        tmp_path: Path, mps: dict[str, Any], message: str) -> None:
    control, modes = ScriptedMpsControl(), {}
    p = with_mps(tmp_path, claim([("gpu", "gpu-0")], config=[mps_config(**mps)]), control, modes)
    with pytest.raises(PrepareError, match=message.replace("[", r"\[").replace("]", r"\]")):
        p.prepare(REF)
    assert control.daemons == {} and modes == {} and p.checkpoint.all() == {}


def test_a_daemon_that_cannot_start_fails_the_claim_and_changes_nothing(tmp_path: Path) -> None:
    control, modes = ScriptedMpsControl(), {}
    control.fail_start = True
    p = with_mps(tmp_path, claim([("gpu", "gpu-0")], config=[mps_config()]), control, modes)
    with pytest.raises(PrepareError, match=f"claim ns/c \\(uid {UID}\\): MPS daemon "
                       f"claim-{UID}: did not start: cannot start"):
        p.prepare(REF)
    assert modes == {gpu_uuid(0): False} and not spec_path(tmp_path).exists()
    assert p.checkpoint.all() == {}


def test_after_a_restart_prepared_claims_daemons_run_and_others_stop(tmp_path: Path) -> None:
    control, modes = ScriptedMpsControl(), {}
    checkpoint = Checkpoint(tmp_path / "plugin" / "checkpoint.json")
    p = with_mps(tmp_path, claim([("gpu", "gpu-0")], config=[mps_config(
        defaultActiveThreadPercentage=50)]), control, modes, checkpoint)
    p.prepare(REF)
    pipe = str(tmp_path / "mps" / f"claim-{UID}" / "pipe")
    control.daemons.clear()  # the plugin's container restarted: its daemons died
    (tmp_path / "mps" / "claim-gone").mkdir()  # a claim unprepared while it was down
    again = with_mps(tmp_path, claim([("gpu", "gpu-0")]), control, modes,
                     Checkpoint(tmp_path / "plugin" / "checkpoint.json"))
    assert again.restore_mps() == {}
    assert control.daemons[pipe] == {"set_default_active_thread_percentage": "50"}
    assert sorted(p.name for p in (tmp_path / "mps").iterdir()) == [f"claim-{UID}", "shm"]
