"""gpukit.provision.driver_reload: reload or reboot, the holders named, NVML's verification."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpukit.provision import driver_reload as dr

OLD, NEW = "550.90.07", "570.86.15"
MISMATCH = "Driver/library version mismatch"


def holder(pid: int, comm: str, unit: str = "") -> dr.Holder:
    return dr.Holder(pid, comm, "/dev/nvidiactl", unit)


def test_nothing_to_do_when_the_installed_driver_runs() -> None:
    a = dr.decide("reload-else-reboot", NEW, NEW, holders=[holder(7, "python3")])
    assert a.action == "none"


def test_a_version_mismatch_is_reloaded_without_a_reboot() -> None:
    a = dr.decide("reload-else-reboot", NEW, None, MISMATCH)
    assert (a.action, MISMATCH in a.reason) == ("reload", True)


def test_services_the_role_stops_do_not_block_the_reload() -> None:
    persistenced = holder(42, "nvidia-persiste", "nvidia-persistenced.service")
    a = dr.decide("reload-else-reboot", NEW, OLD, holders=[persistenced],
                  stoppable_units=["nvidia-persistenced.service"])  # fmt: skip
    assert a.action == "reload"


def test_a_holder_makes_it_a_reboot_and_is_named() -> None:
    a = dr.decide("reload-else-reboot", NEW, OLD, holders=[holder(4242, "cuda-app")])
    assert a.action == "reboot"
    assert "pid 4242 (cuda-app) holds /dev/nvidiactl" in a.reason
    assert f"driver {NEW} is installed, {OLD} is loaded" in a.reason


def test_policy_reload_fails_instead_of_rebooting() -> None:
    a = dr.decide("reload", NEW, OLD, holders=[holder(9, "dcgm", "dcgm.scope")])
    assert a.action == "fail"
    assert "pid 9 (dcgm, dcgm.scope)" in a.reason and "no reboot" in a.reason


def test_policy_reboot_and_nouveau_always_reboot() -> None:
    assert dr.decide("reboot", NEW, OLD).action == "reboot"
    assert dr.decide("reload-else-reboot", NEW, None, None, nouveau_loaded=True).action == "reboot"


def test_an_unknown_policy_is_refused_naming_the_variable() -> None:
    with pytest.raises(ValueError, match="nvidia_driver_activation: 'later' is not one of"):
        dr.decide("later", NEW, OLD)


def test_unload_refused_reads_kmods_words() -> None:
    assert dr.unload_refused("modprobe: FATAL: Module nvidia is in use.\n") == "nvidia"
    assert dr.unload_refused("rmmod: ERROR: Module nvidia_uvm is in use\n") == "nvidia_uvm"
    assert dr.unload_refused("modprobe: FATAL: Module nvidia not found\n") is None


def test_verify_against_nvml() -> None:
    assert dr.verify(NEW, {"nvml": True, "driver_version": NEW}) is None
    stale = dr.verify(NEW, {"nvml": True, "driver_version": OLD})
    assert stale is not None and OLD in stale
    down = dr.verify(NEW, {"nvml": False, "error": MISMATCH})
    assert down is not None and MISMATCH in down


def test_device_holders_finds_a_process_holding_a_device_file(tmp_path: Path) -> None:
    """A real process with a descriptor of a /dev/nvidia* path, seen through /proc."""
    fake = tmp_path / "proc" / "4242"
    (fake / "fd").mkdir(parents=True)
    (fake / "fd" / "3").symlink_to("/dev/nvidia0")
    (fake / "fd" / "1").symlink_to("/dev/null")
    (fake / "comm").write_text("cuda-app\n")
    (fake / "cgroup").write_text("0::/system.slice/train.service\n")
    other = tmp_path / "proc" / "77"
    (other / "fd").mkdir(parents=True)
    (other / "fd" / "0").symlink_to("/dev/null")
    (other / "comm").write_text("bash\n")
    (other / "cgroup").write_text("0::/\n")
    (tmp_path / "proc" / "self").mkdir()
    found = dr.device_holders(tmp_path / "proc")
    assert found == [dr.Holder(4242, "cuda-app", "/dev/nvidia0", "train.service")]


def test_device_holders_on_this_machines_proc() -> None:
    """Nothing on a machine without the driver holds /dev/nvidia*; a live child process
    holding such a path (O_PATH, which needs no driver) is found by pid and command."""
    if not Path("/proc/self/fd").exists():
        pytest.skip("no /proc")
    dev = Path("/dev/nvidia-gpukit-test")
    if dev.exists() or not os.access("/dev", os.W_OK):
        pytest.skip("cannot create a device-like path in /dev")
    dev.touch()
    try:
        code = ("import os, sys, time; fd = os.open(sys.argv[1], os.O_PATH); "
                "print('ready', flush=True); time.sleep(60)")  # fmt: skip
        p = subprocess.Popen([sys.executable, "-c", code, str(dev)], stdout=subprocess.PIPE,
                             text=True)  # fmt: skip
        try:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
            found = [h for h in dr.device_holders() if h.pid == p.pid]
            assert found and found[0].device == str(dev)
            assert found[0].comm == Path(f"/proc/{p.pid}/comm").read_text().strip()
        finally:
            p.kill()
            p.wait()
    finally:
        dev.unlink()


class FakeNode:
    """modprobe as the kernel answers it, NVML as it reads after a load."""

    def __init__(self, refuse: str = "", nvml_after: str = NEW) -> None:
        self.calls: list[list[str]] = []
        self.refuse = refuse
        self.nvml_after = nvml_after

    def run(self, argv: list[str]) -> tuple[int, str]:
        self.calls.append(argv)
        if argv[:2] == ["modprobe", "-r"] and self.refuse:
            return 1, self.refuse
        return 0, ""

    def facts(self) -> dict[str, Any]:
        return {"nvml": True, "driver_version": self.nvml_after}


def activate(node: FakeNode, proc: Path, reload: bool = True,
             policy: str = "reload-else-reboot") -> dict[str, Any]:
    return dr.activate(policy, NEW, None, MISMATCH, False, ["nvidia-persistenced.service"],
                       reload=reload, run=node.run, facts=node.facts, proc=proc)  # fmt: skip


def test_activate_reloads_and_verifies(tmp_path: Path) -> None:
    node = FakeNode()
    out = activate(node, tmp_path)
    assert (out["action"], out["reloaded"]) == ("reload", True)
    assert node.calls == [["modprobe", "-r", *dr.UNLOAD_MODULES],
                          *(["modprobe", m] for m in dr.LOAD_MODULES)]  # fmt: skip


def test_activate_plans_only_without_reload(tmp_path: Path) -> None:
    node = FakeNode()
    out = activate(node, tmp_path, reload=False)
    assert (out["action"], out["reloaded"], node.calls) == ("reload", False, [])


def test_activate_reboots_when_the_kernel_refuses_the_unload(tmp_path: Path) -> None:
    fake = tmp_path / "900"
    (fake / "fd").mkdir(parents=True)
    (fake / "comm").write_text("late-client\n")
    (fake / "cgroup").write_text("0::/\n")
    node = FakeNode(refuse="modprobe: FATAL: Module nvidia is in use.")

    def run(argv: list[str]) -> tuple[int, str]:
        # The holder opened the device after the plan.
        (fake / "fd" / "5").symlink_to("/dev/nvidia0")
        return node.run(argv)

    out = dr.activate("reload-else-reboot", NEW, None, MISMATCH, False, [], reload=True,
                      run=run, facts=node.facts, proc=tmp_path)  # fmt: skip
    assert (out["action"], out["reloaded"]) == ("reboot", False)
    assert "module nvidia is in use: pid 900 (late-client) holds /dev/nvidia0" in out["reason"]


def test_activate_reboots_when_nvml_still_reports_the_old_driver(tmp_path: Path) -> None:
    out = activate(FakeNode(nvml_after=OLD), tmp_path)
    assert out["action"] == "reboot" and f"NVML reports {OLD}" in out["reason"]
