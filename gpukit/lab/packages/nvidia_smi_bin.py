"""The stand-in driver's nvidia-smi binary, built from gpukit/lab/nvidia_smi.c: a program like
the driver's (libnvidia-ml.so.1 by soname, no interpreter), so it runs in a container that a
CDI spec or the runtime gives the driver's files. Cached by the source's digest; gcc without
debug information gives the same bytes each time, so the package stays byte-identical."""

from __future__ import annotations

import hashlib
from pathlib import Path

from gpukit.lab.packages.gcc import compile_once

SOURCE = Path(__file__).resolve().parent.parent / "nvidia_smi.c"


def build(out_dir: Path, lab_dir: str) -> Path:
    """The binary (built into out_dir unless already there); `lab_dir`: where the package puts
    gpukit/lab/nvidia_smi.py, run for what the binary does not answer itself."""
    digest = hashlib.sha256(SOURCE.read_bytes() + lab_dir.encode()).hexdigest()[:16]
    return compile_once(SOURCE, out_dir / f"nvidia-smi-{digest}",
                        ["-O2", "-s", "-Wall", "-Wextra", "-Werror", f'-DLAB_DIR="{lab_dir}"'],
                        "the stand-in nvidia-smi")
