"""Compiling the lab's stand-in binaries (libcuda, nvidia-smi) with the machine's gcc, once per
source digest: without debug information gcc gives the same bytes each time, so the packages
that ship them stay byte-identical between repository builds."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from gpukit.lab.packages.deb import PackageError


def compile_once(source: Path, out: Path, flags: list[str], what: str) -> Path:
    """`source` compiled with gcc `flags` into `out`, unless `out` is already there (written
    whole, so a build cut short leaves none). PackageError naming `what` (the stand-in
    built) when gcc is missing or fails."""
    if out.exists():
        return out
    if shutil.which("gcc") is None:
        raise PackageError(f"gcc is missing: {what} is built from {source}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".partial")
    r = subprocess.run(["gcc", *flags, "-o", str(tmp), str(source)], capture_output=True,
                       text=True)  # fmt: skip
    if r.returncode != 0:
        raise PackageError(f"building {what} failed: {r.stderr.strip()}")
    tmp.replace(out)
    return out
