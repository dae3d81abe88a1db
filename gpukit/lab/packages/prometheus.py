"""Debian's prometheus for the lab's apt repository: the lab's nodes have no network beyond
the lab bridge, so the telemetry role installs it (and the dependencies the node image lacks)
from the lab's own repository, as a node of a fleet would from its distribution's mirror.

The packages are Debian's own, fetched on the host with `apt-get download` (the host's apt
sources: the node image is the same Debian release) and kept in the cache; which ones is
apt's own answer: a simulated `apt-get install --no-install-recommends prometheus` against the
node image's dpkg status."""

from __future__ import annotations

import subprocess
from pathlib import Path

from gpukit.lab.packages.repo import RepoError

PACKAGE = "prometheus"


def _run(argv: list[str], cwd: Path | None = None) -> str:
    r = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RepoError(f"{' '.join(argv)} failed: {(r.stderr or r.stdout).strip()}")
    return r.stdout


def needed(rootfs: Path) -> list[str]:
    """The packages a node (its image's dpkg status) needs installed for prometheus."""
    status = rootfs / "var" / "lib" / "dpkg" / "status"
    if not status.exists():
        raise RepoError(f"{status} does not exist: the lab's node image is not built yet")
    out = _run(["apt-get", "install", "-s", "--no-install-recommends",
                "-o", f"Dir::State::status={status}", PACKAGE])  # fmt: skip
    names = [line.split()[1] for line in out.splitlines() if line.startswith("Inst ")]
    if PACKAGE not in names:
        raise RepoError(f"apt-get found no {PACKAGE} to install: run `apt-get update` on this "
                        "host (its Debian sources serve the lab's node release)")
    return names


def debs(cache: Path, rootfs: Path) -> tuple[Path, ...]:
    """The .deb files (downloaded once into `cache`/prometheus-debs, then kept)."""
    out = cache / "prometheus-debs"
    marker = out / ".packages"
    if marker.exists():
        files = tuple(out / n for n in marker.read_text().split())
        if files and all(f.exists() for f in files):
            return files
    out.mkdir(parents=True, exist_ok=True)
    names = needed(rootfs)
    before = set(out.glob("*.deb"))
    _run(["apt-get", "download", *names], cwd=out)
    by_name = {p.name.split("_")[0]: p for p in out.glob("*.deb")}
    missing = [n for n in names if n not in by_name]
    if missing:
        raise RepoError(f"apt-get download did not fetch {', '.join(missing)}")
    files = tuple(sorted(by_name[n] for n in names))
    for stale in before - set(files):
        stale.unlink()
    marker.write_text("\n".join(f.name for f in files) + "\n")
    return files
