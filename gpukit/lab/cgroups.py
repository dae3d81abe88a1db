"""Per-node cgroup subtrees, nested under the cgroup the lab was started in.

Each node's init moves itself into its subtree and unshares a cgroup namespace,
so inside the node the subtree is the root: its systemd and kubelet manage their
own cpu/memory/pids/... hierarchies, and two nodes never touch each other's pods.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from gpukit.lab.config import load_spec, state_dir

CGROUP_ROOT = Path("/sys/fs/cgroup")


def hierarchies() -> dict[str, Path]:
    """Mount point of each hierarchy keyed by the name in /proc/self/cgroup."""
    found: dict[str, Path] = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        pre, _, post = line.partition(" - ")
        fstype, _src, opts = post.split()[:3]
        mnt = Path(pre.split()[4])
        if fstype == "cgroup2":
            found[""] = mnt
        elif fstype == "cgroup":
            names = [o for o in opts.split(",") if o not in ("rw", "ro", "relatime")]
            keys = [o for o in names if o.startswith("name=")] or [
                ",".join(sorted(n for n in names if "=" not in n))
            ]
            found[keys[0]] = mnt
    return found


def own_paths() -> dict[str, str]:
    """The current process's cgroup path in each hierarchy."""
    paths: dict[str, str] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _id, ctrls, path = line.split(":", 2)
        paths[",".join(sorted(ctrls.split(","))) if not ctrls.startswith("name=") else ctrls] = path
    return paths


def _record(node: str) -> Path:
    return state_dir() / "cgroups" / f"{node}.json"


def node_dirs(node: str) -> dict[str, Path]:
    """The node's directory in every hierarchy (parent: the lab's own cgroup).

    Recorded at creation, because a later `lab down` may run in another cgroup.
    """
    rec = _record(node)
    if rec.exists():
        return {k: Path(v) for k, v in json.loads(rec.read_text()).items()}
    mounts = hierarchies()
    own = own_paths()
    dirs: dict[str, Path] = {}
    for key, mnt in mounts.items():
        base = own.get(key, "/").lstrip("/")
        dirs[key] = mnt / base / f"{load_spec().prefix}-lab" / node
    return dirs


def create(node: str) -> dict[str, Path]:
    dirs = node_dirs(node)
    rec = _record(node)
    rec.parent.mkdir(parents=True, exist_ok=True)
    rec.write_text(json.dumps({k: str(v) for k, v in dirs.items()}))
    for key, d in dirs.items():
        for part in (d.parent, d):
            if not part.exists():
                part.mkdir()
                if key == "cpuset":
                    # A new cpuset is empty until given its parent's cpus and mems.
                    for f in ("cpuset.cpus", "cpuset.mems"):
                        (part / f).write_text((part.parent / f).read_text())
    return dirs


def enter(node: str) -> None:
    """Move the calling process into the node's cgroups (all hierarchies)."""
    pid = str(os.getpid())
    for d in node_dirs(node).values():
        (d / "cgroup.procs").write_text(pid)


def procs(node: str) -> set[int]:
    """Every PID left anywhere in the node's subtrees."""
    found: set[int] = set()
    for d in node_dirs(node).values():
        if d.exists():
            for f in d.rglob("cgroup.procs"):
                try:
                    found.update(int(x) for x in f.read_text().split())
                except OSError:
                    continue
    return found


def remove(node: str) -> list[Path]:
    """Remove the node's subtrees deepest first; return the ones still busy."""
    busy: list[Path] = []
    for d in node_dirs(node).values():
        if not d.exists():
            continue
        for sub in sorted((p for p in d.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            try:
                sub.rmdir()
            except OSError:
                busy.append(sub)
        try:
            d.rmdir()
        except OSError:
            busy.append(d)
        try:
            d.parent.rmdir()
        except OSError:
            pass
    if not busy:
        _record(node).unlink(missing_ok=True)
    return busy
