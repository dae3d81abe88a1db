"""Stand-in NVIDIA driver and toolkit packages, and the lab's local apt repository.

The lab's nodes have no network beyond the lab bridge, so the roles install from a local,
signed apt repository the lab builds on the host and shares read-only into every node
(`<state dir>/shared/apt` on the host, `/opt/gpukit-lab/apt` in a node)::

    python -m gpukit.lab.packages build        # build (or keep) the instance's repository
    python -m gpukit.lab.packages list         # the packages and versions it serves

A file repository rather than an HTTP server: nothing to start, stop or keep alive, no
port, no traffic; apt's flow (sources, signed Release, keyring, candidates, pins) is the
same as with a vendor's HTTP repository.

It also serves containerd (`containerd.py`: built from Go modules, packaged as a
distribution ships it), which the lab installs into its nodes, and Debian's own prometheus with
the dependencies the node image lacks (`prometheus.py`: fetched with `apt-get download` on the
host) for the telemetry role.

Lab tests make a maintainer script fail on purpose by listing a package name (or `*`) in
`/etc/gpukit-lab/fail-postinst` (or `fail-prerm`, `fail-postrm`) on a node.
"""

from __future__ import annotations

from pathlib import Path

from gpukit.lab.packages.catalog import BRANCHES, Branch, Sources
from gpukit.lab.packages.repo import KEY_NAME, RepoError

__all__ = ["BRANCHES", "KEY_NAME", "NODE_REPO_DIR", "Branch", "RepoError", "build_repo",
           "repo_dir", "sources"]  # fmt: skip

# Where nodes see the repository (the lab shares <state dir>/shared at /opt/gpukit-lab).
NODE_REPO_DIR = "/opt/gpukit-lab/apt"


def repo_dir() -> Path:
    from gpukit.lab.config import state_dir

    return state_dir() / "shared" / "apt"


def sources() -> Sources:
    import pynvml

    from gpukit.lab import nvml

    lib = nvml.library_path()
    if lib is None:
        raise RepoError("the mock NVML library is not built: run `make nvml`")
    from gpukit.lab.config import cache_dir

    here = Path(__file__).resolve().parent.parent
    return Sources(nvml_lib=lib, nvidia_smi=here / "nvidia_smi.py", pynvml=Path(pynvml.__file__),
                   build_dir=cache_dir() / "cuda")  # fmt: skip


def build_repo(out: Path | None = None, force: bool = False) -> Path:
    """Build this lab instance's repository (a no-op when nothing changed); returns its path."""
    from gpukit.lab.cluster import rootfs
    from gpukit.lab.config import cache_dir, load_spec, state_dir
    from gpukit.lab.packages import containerd, prometheus, repo

    runtime = containerd.build_deb(cache_dir(), load_spec().containerd_version)
    # Debian's own prometheus (role gpu_telemetry, `gpukit_metrics_prometheus: host`).
    watch = prometheus.debs(cache_dir(), rootfs())
    return repo.build(out or repo_dir(), state_dir(), sources(), force=force,
                      prebuilt=(runtime, *watch))
