"""buildah as the lab runs it: root, storage under the gpukit cache (never the checkout),
chroot isolation (no OCI runtime needed; this machine has cgroup v1), and never a pull:
every image a build starts from is in the lab's storage already."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from gpukit.lab.config import cache_dir
from gpukit.lab.controlplane import LabError

DRIVER = "overlay"


def storage() -> Path:
    return cache_dir() / "buildah"


def command(*args: str) -> list[str]:
    s = storage()
    return ["buildah", "--root", str(s / "root"), "--runroot", str(s / "run"),
            "--storage-driver", DRIVER, *args]  # fmt: skip


def run(*args: str, log: Path | None = None) -> str:
    """Run buildah; its stdout. With `log`, output goes there and a failure names it."""
    if log is None:
        r = subprocess.run(command(*args), capture_output=True, text=True)
        if r.returncode != 0:
            raise LabError(f"buildah {args[0]} failed: {r.stderr.strip()[-2000:]}")
        return r.stdout
    with open(log, "a") as f:
        f.write(f"$ buildah {' '.join(args)}\n")
        f.flush()
        r = subprocess.run(command(*args), stdout=f, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        raise LabError(f"buildah {args[0]} failed (exit {r.returncode}); see {log}")
    return ""


def image(ref: str) -> dict[str, object] | None:
    """The storage's record of an image (ID, names, its size as buildah prints it: "142 MB"),
    or None if it lacks it."""
    r = subprocess.run(command("images", "--json", ref), capture_output=True, text=True)
    if r.returncode != 0:
        return None
    found = json.loads(r.stdout or "[]")
    return found[0] if found else None


def import_root(root: Path, ref: str, skip: tuple[str, ...], log: Path) -> None:
    """An image of one layer holding the directory tree `root` (owners, modes and links
    kept), without the contents of the `skip` directories."""
    ctr = run("from", "--pull=never", "scratch").strip()
    try:
        mnt = run("mount", ctr).strip()
        excludes = [f"--exclude=./{d}/*" for d in skip]
        pack = subprocess.Popen(
            ["tar", "-C", str(root), "--numeric-owner", "--exclude=./.complete", *excludes,
             "-cf", "-", "."], stdout=subprocess.PIPE,
        )  # fmt: skip
        unpack = subprocess.run(["tar", "-C", mnt, "--numeric-owner", "-xpf", "-"],
                                stdin=pack.stdout, capture_output=True, text=True)  # fmt: skip
        assert pack.stdout is not None
        pack.stdout.close()
        if pack.wait() != 0 or unpack.returncode != 0:
            raise LabError(f"copying {root} into a buildah container failed: {unpack.stderr}")
        run("umount", ctr)
        run("commit", "--rm", "--format", "docker", ctr, ref, log=log)
    except BaseException:
        subprocess.run(command("rm", ctr), capture_output=True)
        raise
