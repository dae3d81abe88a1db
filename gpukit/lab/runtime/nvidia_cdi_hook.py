"""nvidia-cdi-hook of the gpukit lab: the OCI hooks NVIDIA's CDI specs name, done as NVIDIA's.

A runtime runs it as a createContainer hook (the container's mounts are in place, its root
not yet pivoted to), with the container's state (OCI: `bundle`, ...) on stdin; the
container's root is the bundle config's `root.path`. Subcommands, with the real tool's flags:

- `create-symlinks --link <target>::<path>` (repeatable): a symbolic link at <path> in the
  container pointing at <target> (what the driver's `.so` names need: `libcuda.so.1::
  /usr/lib/x86_64-linux-gnu/libcuda.so`); an existing file at <path> is left alone;
- `enable-cuda-compat --host-driver-version=<v>`: when the image carries CUDA's forward
  compatibility libraries (/usr/local/cuda/compat/libcuda.so.<version>) of a newer driver than
  the host's, their directory goes first in the loader's configuration;
- `update-ldcache --folder <dir>` (repeatable) [--ldconfig-path P]: the folders written to
  /etc/ld.so.conf.d/00-nvcr-<digest>.conf in the container, then the host's ldconfig rebuilds
  the container's /etc/ld.so.cache and the soname links (`libcuda.so.1 -> libcuda.so.<v>`)
  inside the container's root (ldconfig -r);
- `disable-device-node-modification`: when the container shows the driver's
  /proc/driver/nvidia/params, a copy with `ModifyDeviceFiles: 0` is bound over it, so
  CUDA in the container does not try to create device nodes; nothing to do otherwise.

Any failure: exit 1 with the reason on stderr (the runtime then fails the container).
Standard library only.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

COMPAT_DIR = "usr/local/cuda/compat"
PARAMS = "proc/driver/nvidia/params"


class HookFailure(Exception):
    pass


def container_root(state: str) -> Path:
    """The container's root directory from the OCI state on stdin."""
    try:
        bundle = Path(json.loads(state)["bundle"])
        config = json.loads((bundle / "config.json").read_text())
        root = Path(config["root"]["path"])
    except (ValueError, KeyError, TypeError, OSError) as e:
        raise HookFailure(f"cannot find the container's root from its state: {e}") from e
    return root if root.is_absolute() else bundle / root


def inside(root: Path, path: str) -> Path:
    """`path` of the container, on the host (no escaping the root through `..`)."""
    target = (root / path.lstrip("/")).resolve(strict=False)
    if root.resolve() not in (target, *target.parents):
        raise HookFailure(f"{path}: outside the container's root")
    return target


def create_symlinks(root: Path, links: Sequence[str]) -> None:
    for spec in links:
        target, sep, path = spec.partition("::")
        if not sep or not target or not path.startswith("/"):
            raise HookFailure(f"--link {spec!r}: expected <target>::<absolute path>")
        at = root / path.lstrip("/")
        inside(root, str(at.parent.relative_to(root)))
        if at.is_symlink() or at.exists():
            continue
        at.parent.mkdir(parents=True, exist_ok=True)
        at.symlink_to(target)


def _version(name: str) -> tuple[int, ...]:
    tail = name.removeprefix("libcuda.so.")
    return tuple(int(p) for p in tail.split(".") if p.isdigit())


def enable_cuda_compat(root: Path, host_version: str) -> None:
    compat = root / COMPAT_DIR
    libs = sorted(compat.glob("libcuda.so.*.*"), key=lambda p: _version(p.name))
    if not libs:
        return
    host_major = int(host_version.split(".")[0]) if host_version[:1].isdigit() else 0
    newest = _version(libs[-1].name)
    if not newest or newest[0] <= host_major:
        return
    conf = root / "etc/ld.so.conf.d/00-compat-gpukit.conf"
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text(f"/{COMPAT_DIR}\n")


def update_ldcache(root: Path, folders: Sequence[str], ldconfig: str) -> None:
    if not folders:
        return
    for f in folders:
        inside(root, f)
    conf_dir = root / "etc/ld.so.conf.d"
    conf_dir.mkdir(parents=True, exist_ok=True)
    name = f"00-nvcr-{hashlib.sha256(' '.join(folders).encode()).hexdigest()[:10]}.conf"
    (conf_dir / name).write_text("".join(f"{f}\n" for f in folders))
    main = root / "etc/ld.so.conf"
    if main.is_file() and "ld.so.conf.d" in main.read_text():
        config = "/etc/ld.so.conf"
    else:  # an image without the loader's configuration: ours, compat first
        confs = sorted(conf_dir.glob("00-*.conf"))
        combined = conf_dir / "00-nvcr-all.conf"
        combined.write_text("".join(c.read_text() for c in confs if c != combined))
        config = "/etc/ld.so.conf.d/00-nvcr-all.conf"
    r = subprocess.run([ldconfig, "-r", str(root), "-C", "/etc/ld.so.cache", "-f", config],
                       capture_output=True, text=True)  # fmt: skip
    if r.returncode != 0:
        raise HookFailure(f"{ldconfig} -r {root}: {r.stderr.strip() or r.returncode}")


def disable_device_node_modification(root: Path) -> None:
    params = root / PARAMS
    if not params.is_file():
        return
    lines = params.read_text().splitlines()
    changed = [("ModifyDeviceFiles: 0" if ln.startswith("ModifyDeviceFiles:") else ln)
               for ln in lines]  # fmt: skip
    if changed == lines:
        return
    fd, tmp = tempfile.mkstemp(prefix="nvcr-params-")
    with os.fdopen(fd, "w") as fh:
        fh.write("\n".join(changed) + "\n")
    os.chmod(tmp, 0o444)
    r = subprocess.run(["mount", "--bind", "-o", "ro", tmp, str(params)],
                       capture_output=True, text=True)  # fmt: skip
    if r.returncode != 0:
        raise HookFailure(f"cannot bind a modified {PARAMS}: {r.stderr.strip()}")


def _values(args: Sequence[str], flag: str) -> list[str]:
    out: list[str] = []
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            out.append(args[i + 1])
        elif a.startswith(flag + "="):
            out.append(a.split("=", 1)[1])
    return out


def run(argv: Sequence[str], state: str) -> None:
    if not argv:
        raise HookFailure("usage: nvidia-cdi-hook <create-symlinks|enable-cuda-compat|"
                          "update-ldcache|disable-device-node-modification> [flags]")
    command, args = argv[0], argv[1:]
    if command not in ("create-symlinks", "enable-cuda-compat", "update-ldcache",
                       "disable-device-node-modification"):  # fmt: skip
        raise HookFailure(f"unknown command {command!r}")
    root = container_root(state)
    if command == "create-symlinks":
        create_symlinks(root, _values(args, "--link"))
    elif command == "enable-cuda-compat":
        enable_cuda_compat(root, next(iter(_values(args, "--host-driver-version")), ""))
    elif command == "update-ldcache":
        ldconfig = next(iter(_values(args, "--ldconfig-path")), "/sbin/ldconfig")
        update_ldcache(root, _values(args, "--folder"), ldconfig.lstrip("@"))
    else:
        disable_device_node_modification(root)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        run(args, sys.stdin.read())
    except HookFailure as e:
        print(f"nvidia-cdi-hook {args[0] if args else ''}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
