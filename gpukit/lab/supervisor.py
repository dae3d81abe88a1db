"""Keeps one lab node booted: `python -m gpukit.lab.supervisor NODE`.

Boots the node's init in fresh namespaces, boots it again when the node reboots
(its systemd calls reboot(2), which the kernel turns into SIGHUP of the
namespace's init), and powers it off cleanly on SIGTERM.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from gpukit.lab import cgroups
from gpukit.lab.config import load_spec, state_dir
from gpukit.lab.network import netns_path

BOOT = Path(__file__).resolve().parent / "node" / "boot.sh"
POWEROFF = signal.SIGRTMIN + 4  # systemd: power off
SHUTDOWN_TIMEOUT = 20.0


def node_dir(name: str) -> Path:
    return state_dir() / "nodes" / name


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(x) for x in text.split()]


def init_record(name: str) -> Path:
    return node_dir(name) / "init.json"


def main(name: str) -> int:
    lab = load_spec()
    node = lab.node(name)
    ndir = node_dir(name)
    gpus = int((ndir / "gpus").read_text())
    shared = state_dir() / "shared"
    stopping = False
    child: subprocess.Popen[bytes] | None = None
    init_pid: int | None = None

    def on_term(_sig: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        if init_pid is not None:
            try:
                os.kill(init_pid, POWEROFF)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    boots = 0
    while not stopping:
        boots += 1
        _power_on_gpus(ndir / "root")
        argv = [
            "nsenter", f"--net={netns_path(node, lab)}", "--",
            "unshare", "--pid", "--fork", "--mount", "--uts", "--ipc", "--cgroup",
            "--propagation", "private", "--",
            "bash", str(BOOT), name, str(ndir / "root"), str(shared), str(gpus),
        ]  # fmt: skip
        child = subprocess.Popen(argv, preexec_fn=lambda: cgroups.enter(name))
        deadline = time.monotonic() + 10
        while init_pid is None and time.monotonic() < deadline and child.poll() is None:
            kids = children(child.pid)
            if kids:
                init_pid = kids[0]
                stat = Path(f"/proc/{init_pid}/stat").read_text().rsplit(")", 1)[1].split()
                init_record(name).write_text(
                    json.dumps({"pid": init_pid, "start": int(stat[19]), "boot": boots})
                )
            else:
                time.sleep(0.02)
        if stopping and init_pid is not None:
            os.kill(init_pid, POWEROFF)
        rc = _wait(child, lambda: stopping, init_pid)
        init_pid = None
        init_record(name).unlink(missing_ok=True)
        marker = ndir / "root/var/lib/gpukit-lab/reboot-requested"
        rebooting = marker.exists() or rc == -signal.SIGHUP
        marker.unlink(missing_ok=True)
        print(
            f"gpukit-lab: node {name} init ended (status {rc}, boot {boots},"
            f" {'reboot' if rebooting else 'stop'})",
            flush=True,
        )
        if not rebooting or stopping:
            break  # poweroff, halt or a failure: the supervisor ends; `lab up` repairs
    return 0


def _power_on_gpus(root: Path) -> None:
    """A (re)boot resets the node's GPUs, as loading the driver does: pending MIG
    modes take effect, processes and lost-GPU flags are gone."""
    profile = root / "etc/gpukit-lab/nvml/profile.yaml"
    if not profile.exists():
        return
    r = subprocess.run(
        [sys.executable, "-m", "gpukit.lab.nvml", "--profile", str(profile),
         "--state-dir", str(root / "var/lib/gpukit-lab/nvml"), "boot"],
        capture_output=True, text=True,
    )  # fmt: skip
    if r.returncode != 0:
        print(f"gpukit-lab: GPU power-on failed: {r.stderr.strip()}", flush=True)


def _wait(child: subprocess.Popen[bytes], stopping: object, init_pid: int | None) -> int:
    """Wait for the node's init; after a poweroff request, kill it if it lingers."""
    asked_at: float | None = None
    while True:
        try:
            return child.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            pass
        if callable(stopping) and stopping():
            asked_at = asked_at or time.monotonic()
            if time.monotonic() - asked_at > SHUTDOWN_TIMEOUT and init_pid is not None:
                try:
                    os.kill(init_pid, signal.SIGKILL)  # ends every process of the node
                except ProcessLookupError:
                    pass


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
