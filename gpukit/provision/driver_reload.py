"""Activating an installed driver without a reboot: unload the NVIDIA kernel modules, load the
new ones, check through NVML that the loaded driver is the installed one.

After a driver package upgrade the old modules stay loaded and the new user space's nvmlInit
answers "Driver/library version mismatch" (NVML_ERROR_LIB_RM_VERSION_MISMATCH) until the
modules are reloaded. The kernel refuses to unload a module that a process holds (an open
/dev/nvidia* file: "Module nvidia is in use"), so what holds the GPUs is stopped first (the
node agent and DRA plugin by the rolling upgrade, persistenced and MPS here); a process still
holding one leaves only a reboot, and the reason names it.

The role's policy (nvidia_driver_activation): `reload` (fail rather than reboot),
`reboot` (always reboot, as before), `reload-else-reboot` (the default).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpukit.provision.driver import reboot_decision

POLICIES = ("reload", "reboot", "reload-else-reboot")

# Unload order: the modules that depend on nvidia first (as nvidia-installer and the GPU
# Operator's driver container unload them); loading nvidia and nvidia_uvm is what CUDA needs,
# the others load on demand (nvidia-modprobe, a display server).
UNLOAD_MODULES = ("nvidia_uvm", "nvidia_drm", "nvidia_modeset", "nvidia")
LOAD_MODULES = ("nvidia", "nvidia_uvm")

DEVICE_PREFIX = "/dev/nvidia"
_IN_USE = re.compile(r"Module (\S+) is in use")


@dataclass(frozen=True)
class Holder:
    """A process with a descriptor of one of the driver's device files."""

    pid: int
    comm: str
    device: str
    unit: str  # the systemd unit (or "" outside one), from the process's cgroup

    def describe(self) -> str:
        where = f", {self.unit}" if self.unit else ""
        return f"pid {self.pid} ({self.comm}{where}) holds {self.device}"


@dataclass(frozen=True)
class Activation:
    """What makes the installed driver the running one: nothing, a reload or a reboot; `fail`
    when the policy forbids the reboot a holder makes necessary."""

    action: str  # none | reload | reboot | fail
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _unit(cgroup: str) -> str:
    """The systemd unit (service or scope) a process runs in, from /proc/<pid>/cgroup."""
    for line in cgroup.splitlines():
        path = line.rsplit(":", 1)[-1]
        for part in reversed(path.split("/")):
            if part.endswith((".service", ".scope")):
                return part
    return ""


def device_holders(proc: Path = Path("/proc"), exclude: Iterable[int] = ()) -> list[Holder]:
    """Every process with a descriptor of /dev/nvidia* (one entry per process, its first
    device), sorted by pid. Processes that end while being read are skipped."""
    skip = {os.getpid(), *exclude}
    out: list[Holder] = []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) in skip:
            continue
        try:
            fds = sorted((entry / "fd").iterdir(), key=lambda p: int(p.name))
            device = next((t for t in (os.readlink(fd) for fd in fds)
                           if t.startswith(DEVICE_PREFIX)), None)  # fmt: skip
            if device is None:
                continue
            comm = (entry / "comm").read_text().strip()
            cgroup = (entry / "cgroup").read_text()
        except (OSError, ValueError):
            continue
        out.append(Holder(int(entry.name), comm, device, _unit(cgroup)))
    return sorted(out, key=lambda h: h.pid)


def unload_refused(stderr: str) -> str | None:
    """The module the kernel refused to unload (kmod's "Module X is in use"), or None."""
    m = _IN_USE.search(stderr)
    return m.group(1) if m else None


def decide(
    policy: str,
    target_version: str | None,
    loaded_version: str | None,
    nvml_error: str | None = None,
    nouveau_loaded: bool = False,
    holders: Sequence[Holder] = (),
    stoppable_units: Sequence[str] = (),
) -> Activation:
    """How the installed driver becomes the running one.

    `holders`: the processes holding a device file now; those in `stoppable_units` (the
    services the role stops before unloading) do not count, so check mode plans what the run
    will do."""
    if policy not in POLICIES:
        raise ValueError(f"nvidia_driver_activation: {policy!r} is not one of"
                         f" {', '.join(POLICIES)}")
    due = reboot_decision(target_version, loaded_version, nvml_error, nouveau_loaded)
    if not due.required:
        return Activation("none", due.reason)
    if policy == "reboot":
        return Activation("reboot", due.reason)
    if nouveau_loaded:
        # nouveau holds the GPUs from boot: the blacklist takes effect only with a reboot.
        return _no_reload(policy, due.reason)
    blocking = [h for h in holders if h.unit not in stoppable_units]
    if blocking:
        return _no_reload(policy, f"{due.reason}; the driver cannot be unloaded: "
                          + "; ".join(h.describe() for h in blocking))  # fmt: skip
    return Activation("reload", due.reason)


def _no_reload(policy: str, reason: str) -> Activation:
    if policy == "reload":
        return Activation("fail", f"{reason} (nvidia_driver_activation is reload: no reboot)")
    return Activation("reboot", reason)


def after_unload_failure(policy: str, reason: str, stderr: str,
                         holders: Sequence[Holder]) -> Activation:
    """The unload failed (a process took a device after the plan, or the kernel refused for
    another reason): reboot, or fail under policy `reload`, saying why."""
    module = unload_refused(stderr)
    what = (f"module {module} is in use" if module
            else f"unloading failed: {stderr.strip() or 'no message'}")
    who = "; ".join(h.describe() for h in holders)
    return _no_reload(policy, f"{reason}; {what}" + (f": {who}" if who else ""))


def verify(target_version: str | None, facts: Mapping[str, Any]) -> str | None:
    """After a reload: None when NVML answers and reports `target_version`, else the problem."""
    if not facts.get("nvml"):
        return f"NVML does not answer after the reload: {facts.get('error') or 'no error given'}"
    loaded = facts.get("driver_version")
    if target_version and loaded != target_version:
        return f"driver {target_version} is installed, NVML reports {loaded} after the reload"
    return None


def activate(
    policy: str,
    target_version: str | None,
    loaded_version: str | None,
    nvml_error: str | None,
    nouveau_loaded: bool,
    stoppable_units: Sequence[str],
    *,
    reload: bool,
    run: Callable[[list[str]], tuple[int, str]],
    facts: Callable[[], Mapping[str, Any]],
    proc: Path = Path("/proc"),
) -> dict[str, Any]:
    """Plan, and with `reload` carry out, the driver's activation (the role has stopped the
    `stoppable_units` before a reload). `run(argv)` -> (rc, stderr); `facts()` reads NVML.
    Returns action, reason, reloaded (whether the modules were reloaded) and holders."""
    holders = device_holders(proc)
    plan = decide(policy, target_version, loaded_version, nvml_error, nouveau_loaded,
                  holders, stoppable_units)  # fmt: skip
    if plan.action != "reload" or not reload:
        return {**plan.as_dict(), "reloaded": False, "holders": [asdict(h) for h in holders]}
    rc, err = run(["modprobe", "-r", *UNLOAD_MODULES])
    if rc != 0:
        holders = device_holders(proc)
        failed = after_unload_failure(policy, plan.reason, err, holders)
        return {**failed.as_dict(), "reloaded": False, "holders": [asdict(h) for h in holders]}
    for module in LOAD_MODULES:
        rc, err = run(["modprobe", module])
        if rc != 0:
            failed = _no_reload(policy, f"{plan.reason}; loading {module} failed: {err.strip()}")
            return {**failed.as_dict(), "reloaded": True, "holders": []}
    problem = verify(target_version, facts())
    if problem:
        return {**_no_reload(policy, problem).as_dict(), "reloaded": True, "holders": []}
    return {"action": "reload", "reason": plan.reason, "reloaded": True, "holders": []}
