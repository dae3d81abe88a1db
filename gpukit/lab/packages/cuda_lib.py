"""The stand-in driver's libcuda.so, built from gpukit/lab/cuda/libcuda.c once per CUDA version.

Each driver branch reports its own CUDA version through cuDriverGetVersion (12.4 ->
12040), so the library is compiled per branch. Builds are cached by the source's digest
and the version; gcc without debug information gives the same bytes each time, so the
packages that ship it stay byte-identical between repository builds.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from gpukit.lab.packages.deb import PackageError
from gpukit.lab.packages.gcc import compile_once

SOURCE = Path(__file__).resolve().parent.parent / "cuda" / "libcuda.c"
SONAME = "libcuda.so.1"


def encoded(cuda_version: str) -> int:
    """"12.4" -> 12040, the form cuDriverGetVersion returns."""
    major, _, minor = cuda_version.partition(".")
    if not (major.isdigit() and minor.isdigit()):
        raise PackageError(f"cuda_version {cuda_version!r}: expected <major>.<minor>")
    return int(major) * 1000 + int(minor) * 10


def build(cuda_version: str, out_dir: Path) -> Path:
    """The stand-in libcuda for `cuda_version` (built into out_dir unless already there)."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    return compile_once(SOURCE, out_dir / f"libcuda-{cuda_version}-{digest}.so",
                        ["-shared", "-fPIC", "-O2", "-s", "-Wall", "-Werror",
                         f"-DSTANDIN_CUDA_VERSION={encoded(cuda_version)}",
                         f"-Wl,-soname,{SONAME}"], "the stand-in libcuda.so")  # fmt: skip
