"""The lab's mock NVML: a C ``libnvidia-ml.so.1`` that pynvml (and any NVML consumer) loads.

Build it (``make nvml`` at the top level, or :func:`build`), pick a node profile from
``gpukit/lab/profiles/`` and a state directory, and use NVML as on a real node:

* in a subprocess (what a user does)::

      subprocess.run(cmd, env=gpukit.lab.nvml.env("a100-sxm4-40gb-x8", state_dir))

* in-process, before ``pynvml.nvmlInit()``::

      os.environ.update(gpukit.lab.nvml.env("t4-x2", state_dir, library=False))
      gpukit.lab.nvml.load_mock()

The device state (MIG mode and instances, processes, lost GPUs) persists in the state directory
across processes, as on a real GPU. Lab-only operations (inject an XID, lose a GPU, reset it)
are in :mod:`gpukit.lab.nvml.control` and on the command line: ``python -m gpukit.lab.nvml``.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

LIB_NAME = "libnvidia-ml.so.1"
DEFAULT_PROFILE = Path("/etc/gpukit-lab/nvml/profile.yaml")
DEFAULT_STATE_DIR = Path("/var/lib/gpukit-lab/nvml")

_HERE = Path(__file__).resolve().parent  # gpukit/lab/nvml
REPO_ROOT = _HERE.parents[2]
PROFILES_DIR = _HERE.parent / "profiles"
DEFAULT_BUILD_DIR = REPO_ROOT / "build" / "nvml"

ENV_PROFILE = "GPUKIT_NVML_PROFILE"
ENV_STATE_DIR = "GPUKIT_NVML_STATE_DIR"
ENV_SEED = "GPUKIT_NVML_SEED"
ENV_LIB = "GPUKIT_NVML_LIB"


def profiles() -> list[str]:
    """Names of the node profiles shipped in ``gpukit/lab/profiles/``."""
    return sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))


def profile_path(name_or_path: str | os.PathLike[str]) -> Path:
    """A profile by name (``a100-sxm4-40gb-x8``) or by path."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        return p
    candidate = PROFILES_DIR / f"{name_or_path}.yaml"
    if not candidate.exists():
        raise FileNotFoundError(f"no GPU profile {name_or_path!r} (known: {', '.join(profiles())})")
    return candidate


def build(out_dir: Path | None = None, python: str | None = None) -> Path:
    """Build the library with make (a no-op when up to date); returns the ``.so.1`` path."""
    out = (out_dir or DEFAULT_BUILD_DIR).resolve()
    cmd = ["make", "-s", "-C", str(_HERE), f"PYTHON={python or sys.executable}", f"OUT={out}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"building the mock NVML failed:\n{proc.stdout}{proc.stderr}")
    return out / LIB_NAME


def library_path() -> Path | None:
    """The mock library to use: ``$GPUKIT_NVML_LIB``, else the repository's build, else None
    (meaning: the system's ``libnvidia-ml.so.1``, as installed on lab nodes)."""
    explicit = os.environ.get(ENV_LIB)
    if explicit:
        return Path(explicit)
    built = DEFAULT_BUILD_DIR / LIB_NAME
    return built if built.exists() else None


def env(
    profile: str | os.PathLike[str],
    state_dir: str | os.PathLike[str],
    *,
    seed: str | None = None,
    library: Path | bool = True,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Environment for a process that should see the mock GPUs of ``profile``.

    ``library``: True puts the directory of :func:`library_path` first on ``LD_LIBRARY_PATH``
    (so an unchanged ``CDLL("libnvidia-ml.so.1")`` finds the mock), a path uses that library's
    directory, False leaves the library search alone. ``base`` defaults to ``os.environ``.
    """
    out = dict(os.environ if base is None else base)
    out[ENV_PROFILE] = str(profile_path(profile))
    out[ENV_STATE_DIR] = str(state_dir)
    if seed is not None:
        out[ENV_SEED] = seed
    else:
        out.pop(ENV_SEED, None)
    lib: Path | None
    if library is True:
        lib = library_path()
        if lib is None:
            raise FileNotFoundError(f"mock NVML not built: run `make nvml` (or set {ENV_LIB})")
    elif library is False:
        lib = None
    else:
        lib = library
    if lib is not None:
        prev = out.get("LD_LIBRARY_PATH", "")
        out["LD_LIBRARY_PATH"] = str(lib.resolve().parent) + (os.pathsep + prev if prev else "")
        out[ENV_LIB] = str(lib.resolve())
    return out


# Every GPU split into seven 1-slice GPU instances, each with its compute instance (MIG mode on).
_SEVEN_1G = """
import pynvml as n
n.nvmlInit()
for i in range(n.nvmlDeviceGetCount()):
    h = n.nvmlDeviceGetHandleByIndex(i)
    info = n.nvmlDeviceGetGpuInstanceProfileInfo(h, n.NVML_GPU_INSTANCE_PROFILE_1_SLICE)
    for _ in range(7):
        gi = n.nvmlDeviceCreateGpuInstance(h, info.id)
        ci = n.nvmlGpuInstanceGetComputeInstanceProfileInfo(
            gi, n.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE, 0)
        n.nvmlGpuInstanceCreateComputeInstance(gi, ci.id)
"""
_MIG_ON = """
import pynvml as n
n.nvmlInit()
for i in range(n.nvmlDeviceGetCount()):
    n.nvmlDeviceSetMigMode(n.nvmlDeviceGetHandleByIndex(i), 1)
"""


def split_seven_1g(mock_env: Mapping[str, str], gpus: int) -> None:
    """MIG mode on for the `gpus` GPUs of the mock behind `mock_env` (each reset so that it
    applies), then seven 1g GPU instances with a compute instance each: the most MIG devices
    an A100/H100 can have, for benchmarks."""
    env_ = dict(mock_env)
    subprocess.run([sys.executable, "-c", _MIG_ON], env=env_, check=True)
    for gpu in range(gpus):
        subprocess.run([sys.executable, "-m", "gpukit.lab.nvml", "reset", "--gpu", str(gpu)],
                       env=env_, check=True)  # fmt: skip
    subprocess.run([sys.executable, "-c", _SEVEN_1G], env=env_, check=True)


def load_mock(lib: Path | str | None = None) -> ctypes.CDLL:
    """Make this process's pynvml use the mock library (call before ``pynvml.nvmlInit()``).

    pynvml loads ``libnvidia-ml.so.1`` on its first ``nvmlInit``; this sets its library handle
    to the mock instead. Profile and state dir still come from the environment at ``nvmlInit``.
    """
    import pynvml

    path = Path(lib) if lib is not None else library_path()
    if path is None:
        raise FileNotFoundError(f"mock NVML not built: run `make nvml` (or set {ENV_LIB})")
    handle = ctypes.CDLL(str(path.resolve()))
    with pynvml.libLoadLock:
        current = pynvml.nvmlLib
        if current is not None and current._name != handle._name and pynvml._nvmlLib_refcount:
            raise RuntimeError(
                "pynvml is initialised with another NVML library; shut it down first"
            )
        pynvml.nvmlLib = handle
        pynvml._nvmlGetFunctionPointer_cache.clear()
    return handle
