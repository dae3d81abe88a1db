"""The stand-in driver's nvidia-smi binary, built from gpukit/lab/nvidia_smi.c: a program like
the driver's (libnvidia-ml.so.1 by soname, no interpreter), so it runs in a container that a
CDI spec or the runtime gives the driver's files. Cached by the source's digest; gcc without
debug information gives the same bytes each time, so the package stays byte-identical."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

from gpukit.lab.packages.deb import PackageError

SOURCE = Path(__file__).resolve().parent.parent / "nvidia_smi.c"


def build(out_dir: Path, lab_dir: str) -> Path:
    """The binary (built into out_dir unless already there); `lab_dir`: where the package puts
    gpukit/lab/nvidia_smi.py, run for what the binary does not answer itself."""
    digest = hashlib.sha256(SOURCE.read_bytes() + lab_dir.encode()).hexdigest()[:16]
    out = out_dir / f"nvidia-smi-{digest}"
    if out.exists():
        return out
    if shutil.which("gcc") is None:
        raise PackageError("gcc is missing: the stand-in nvidia-smi is built from gpukit/lab")
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".partial")
    r = subprocess.run(["gcc", "-O2", "-s", "-Wall", "-Wextra", "-Werror",
                        f'-DLAB_DIR="{lab_dir}"', "-o", str(tmp), str(SOURCE)],
                       capture_output=True, text=True)  # fmt: skip
    if r.returncode != 0:
        raise PackageError(f"building the stand-in nvidia-smi failed: {r.stderr.strip()}")
    tmp.replace(out)
    return out
