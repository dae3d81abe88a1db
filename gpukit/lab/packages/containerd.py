"""containerd as a distribution ships it, for the lab's nodes.

The lab builds containerd from Go modules (`gpukit/lab/scripts/build-containerd.sh`, one cache
directory per version) and packages it the way Debian and Ubuntu do: the daemon, the runc
v2 shim and `ctr` in /usr/bin, a systemd unit, and a default `/etc/containerd/config.toml`
(a conffile) in the config version of that release: `version = 3` for containerd 2.x,
`version = 2` for 1.7. It depends on Debian's runc.

The package is built once per version into the build cache (its binaries are ~90 MB, so it
is compressed with gzip and not rebuilt with every change of the lab's repository), then
served by the lab's apt repository and installed into each node's root with dpkg before the
node first boots, as an installer that bakes node images does; the lab then writes the
node's own config over the default, as a cluster installer does.
"""

from __future__ import annotations

import hashlib
import re
import shutil
from pathlib import Path

from gpukit.lab.packages import deb
from gpukit.lab.packages.deb import File, Package, text

BINARIES = ("containerd", "containerd-shim-runc-v2", "ctr")
PACKAGE = "containerd"


class ContainerdError(RuntimeError):
    """containerd is not built for the lab's version; the message says how to build it."""


def deb_version(version: str) -> str:
    """The package version of a containerd release tag: v2.2.9 -> 2.2.9-0gpukit1."""
    if not re.fullmatch(r"v\d+\.\d+\.\d+", version):
        raise ContainerdError(f"containerd version {version!r} is not a release tag like v2.2.9")
    return f"{version[1:]}-0gpukit1"


def config_version(version: str) -> int:
    """The config file version a containerd release writes and reads natively."""
    return 3 if int(version[1:].split(".")[0]) >= 2 else 2


UNIT = """\
[Unit]
Description=containerd container runtime
Documentation=https://containerd.io
After=network.target local-fs.target dbus.service

[Service]
ExecStartPre=-/sbin/modprobe overlay
ExecStart=/usr/bin/containerd
Type=notify
# containerd places each container's shim in a cgroup of its own under this unit.
Delegate=yes
# Stopping or restarting containerd must not stop the containers (their shims).
KillMode=process
Restart=always
RestartSec=5
LimitNPROC=infinity
LimitCORE=infinity
LimitNOFILE=infinity
TasksMax=infinity
OOMScoreAdjust=-999

[Install]
WantedBy=multi-user.target
"""

# What `containerd config default` would be too long to ship as is: distributions ship a
# short file that names the version and leaves the rest to the built-in defaults.
DEFAULT_CONFIG = """\
# containerd configuration. Built-in defaults apply to everything not set here:
# `containerd config default` prints them, `containerd config dump` the effective config.
version = {version}
"""

ENABLE = """\
if [ "$1" = configure ] && command -v deb-systemd-helper >/dev/null; then
  deb-systemd-helper unmask containerd.service >/dev/null || true
  deb-systemd-helper enable containerd.service >/dev/null || true
fi
"""


def bindir(cache: Path, version: str) -> Path:
    return cache / "containerd" / version / "bin"


def package(version: str, binaries: Path) -> Package:
    files: dict[str, File] = {}
    for name in BINARIES:
        path = binaries / name
        if not path.exists():
            raise ContainerdError(
                f"{path} is missing: run `make containerd` (builds containerd {version}"
                " from Go modules)"
            )
        files[f"/usr/bin/{name}"] = File(source=path, mode=0o755)
    files["/lib/systemd/system/containerd.service"] = text(UNIT)
    files["/etc/containerd/config.toml"] = text(
        DEFAULT_CONFIG.format(version=config_version(version)), conffile=True
    )
    return Package(
        name=PACKAGE,
        version=deb_version(version),
        section="admin",
        description=(
            f"containerd container runtime {version}\n"
            "Daemon, runc v2 shim and ctr, built from containerd's Go modules; a systemd\n"
            f"unit and a default config (version {config_version(version)})."
        ),
        files=files,
        depends=("runc (>= 1.1.0)",),
        postinst=ENABLE,
    )


def build_deb(cache: Path, version: str) -> Path:
    """The package's .deb, built once per version and package spec into the cache."""
    pkg = package(version, bindir(cache, version))
    h = hashlib.sha256(pkg.control().encode() + UNIT.encode() + DEFAULT_CONFIG.encode())
    for name in BINARIES:
        st = (bindir(cache, version) / name).stat()
        h.update(f"{name}:{st.st_size}:{st.st_mtime_ns}".encode())
    out = cache / "containerd" / version / "deb" / h.hexdigest()[:16]
    target = out / pkg.filename
    if not target.exists():
        shutil.rmtree(out.parent, ignore_errors=True)
        tmp = out.with_name(out.name + ".partial")
        deb.build(pkg, tmp, compression="gzip")
        tmp.rename(out)
    return target
