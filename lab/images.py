"""Container images the lab builds locally (nothing is ever pulled).

Each image is written as a docker-archive tar (manifest.json with RepoTags), the
form `ctr images import` reads.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

SOURCES = Path(__file__).resolve().parent / "images"
PAUSE = "localhost/gpukit-lab/pause:3.10"
SHELL = "localhost/gpukit-lab/shell:1"


@dataclass(frozen=True)
class FileEntry:
    path: str
    source: Path | None = None
    link: str | None = None
    mode: int = 0o755


def _layer(entries: list[FileEntry]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs: set[str] = set()
        for e in entries:
            parts = e.path.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                d = "/".join(parts[:i])
                if d and d not in dirs:
                    dirs.add(d)
                    info = tarfile.TarInfo(d)
                    info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
                    tar.addfile(info)
            info = tarfile.TarInfo(e.path)
            info.mtime, info.mode = 0, e.mode
            if e.link is not None:
                info.type, info.linkname = tarfile.SYMTYPE, e.link
                tar.addfile(info)
            else:
                assert e.source is not None
                data = e.source.read_bytes()
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def write_archive(
    out: Path, ref: str, layer: bytes | list[Path], config: dict[str, object]
) -> Path:
    """Write a docker-archive; `layer` is one layer's bytes or a list of layer tar files."""
    layers: list[tuple[str, Path | bytes]] = []
    for item in [layer] if isinstance(layer, bytes) else layer:
        digest = hashlib.sha256(item).hexdigest() if isinstance(item, bytes) else _file_sha256(item)
        layers.append((digest, item))
    image_config = {
        "architecture": "amd64",
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{d}" for d, _ in layers]},
        "history": [{"created_by": "gpukit lab"} for _ in layers],
    }
    cfg = json.dumps(image_config, sort_keys=True).encode()
    cfg_name = hashlib.sha256(cfg).hexdigest() + ".json"
    names = [f"{d}/layer.tar" for d, _ in layers]
    manifest = json.dumps([{"Config": cfg_name, "RepoTags": [ref], "Layers": names}]).encode()
    entries: list[tuple[str, Path | bytes]] = [(cfg_name, cfg)]
    entries += [(n, data) for n, (_, data) in zip(names, layers, strict=True)]
    entries.append(("manifest.json", manifest))
    tmp = out.with_suffix(".partial")
    with tarfile.open(tmp, "w") as tar:
        for name, data in entries:
            if isinstance(data, Path):
                info = tar.gettarinfo(data, arcname=name)
                info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
                with open(data, "rb") as f:
                    tar.addfile(info, f)
                continue
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 0
            tar.addfile(info, io.BytesIO(data))
    if out.exists() and _same_bytes(out, tmp):
        tmp.unlink()  # unchanged: keep the old file, so nodes need not import it again
    else:
        tmp.replace(out)
    return out


def _file_sha256(path: Path) -> str:
    """A layer file's sha256, remembered beside it (keyed by size and mtime): the agent's
    base and dependency layers are hundreds of MB and change rarely."""
    st = path.stat()
    memo = path.with_name(path.name + ".sha256")
    stamp = f"{st.st_size}:{st.st_mtime_ns}"
    try:
        seen, digest = memo.read_text().split()
        if seen == stamp and len(digest) == 64:
            return digest
    except (OSError, ValueError):
        pass
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    try:  # several lab instances share the cache: write it whole or not at all
        tmp = memo.with_name(f"{memo.name}.{os.getpid()}")
        tmp.write_text(f"{stamp} {h.hexdigest()}\n")
        tmp.replace(memo)
    except OSError:
        pass
    return h.hexdigest()


def image_id(archive: Path) -> str:
    """The image ID (its config's digest, as the kubelet reports it) of a docker-archive."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("manifest.json")
        assert member is not None
        config = json.loads(member.read())[0]["Config"]
    return "sha256:" + str(config).removesuffix(".json")


def _same_bytes(a: Path, b: Path) -> bool:
    if a.stat().st_size != b.stat().st_size:
        return False
    with open(a, "rb") as fa, open(b, "rb") as fb:
        return all(
            x == y
            for x, y in zip(
                iter(lambda: fa.read(1 << 20), b""),
                iter(lambda: fb.read(1 << 20), b""),
                strict=False,
            )
        )


def build_pause(out_dir: Path) -> Path:
    out = out_dir / "pause.tar"
    if out.exists():
        return out
    binary = out_dir / "pause.bin"
    subprocess.run(
        ["gcc", "-static", "-Os", "-s", "-o", str(binary), str(SOURCES / "pause.c")], check=True
    )
    layer = _layer([FileEntry("pause", binary)])
    return write_archive(out, PAUSE, layer, {"Entrypoint": ["/pause"]})


BUSYBOX_APPLETS = (
    "sh", "ls", "cat", "echo", "env", "sleep", "test", "grep", "stat", "wc", "head", "tail",
    "id", "ps", "mkdir", "rm", "true", "false", "sort", "tr", "cut", "readlink", "find", "printf",
)  # fmt: skip


def build_shell(out_dir: Path) -> Path:
    """A small image with a shell: the static busybox from the host's package."""
    out = out_dir / "shell.tar"
    if out.exists():
        return out
    busybox = Path("/bin/busybox")
    if (
        not busybox.exists()
        or b"statically linked"
        not in subprocess.run(["file", "-b", str(busybox)], capture_output=True).stdout
    ):
        busybox = Path(shutil.which("busybox") or "/bin/busybox")
    entries = [FileEntry("bin/busybox", busybox)]
    entries += [FileEntry(f"bin/{a}", link="busybox") for a in BUSYBOX_APPLETS]
    layer = _layer(entries)
    return write_archive(out, SHELL, layer, {"Env": ["PATH=/bin"], "Cmd": ["/bin/sh"]})


AGENT = "localhost/gpukit-lab/node-agent:dev"
AGENT_PYTHON = "3.11"  # Debian bookworm's python3, which runs the agent in the image
_SKIP_IN_BASE = ("dev/", "proc/", "sys/", "run/", "tmp/", "var/cache/apt/", "var/lib/apt/lists/")


def _dir_layer(root: Path, out: Path, prefix: str = "", skip: tuple[str, ...] = ()) -> Path:
    """A layer tar of a directory tree (numeric owners kept), written atomically."""
    if out.exists():
        return out
    tmp = out.with_suffix(".partial")
    tmp.parent.mkdir(parents=True, exist_ok=True)

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        rel = info.name.removeprefix(prefix)
        if any(rel.startswith(s) for s in skip) or "__pycache__" in rel or rel.endswith(".pyc"):
            return None
        info.mtime = 0
        return info

    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        for child in sorted(root.iterdir()):
            if child.name != ".complete":
                tar.add(child, arcname=f"{prefix}{child.name}", filter=keep)
    tmp.replace(out)
    return out


def _requirements(repo: Path) -> list[str]:
    import tomllib

    data = tomllib.loads((repo / "pyproject.toml").read_text())
    return list(data["project"]["dependencies"])


# Tests set this to put a marker file into the agent's image, which changes its content
# key and its image ID, without touching the checkout.
AGENT_MARKER_ENV = "GPUKIT_LAB_AGENT_MARKER"
_GENERATED = ("_pb2.py", "_pb2_grpc.py")  # made from the .proto files, which the key covers


def _code_files(repo: Path) -> list[tuple[str, Path]]:
    """What the image's code layer copies from the checkout (symlinks followed, as
    `shutil.copytree` does), by path inside the package, sorted."""
    top = repo / "gpukit"
    found: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(top, followlinks=True):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for name in filenames:
            if not name.endswith(".pyc"):
                path = Path(dirpath, name)
                found.append((path.relative_to(top).as_posix(), path))
    return sorted(found)


def agent_key(repo: Path, base: Path, deps_layer: Path) -> str:
    """A content key of everything that goes into the node-agent image: gpukit's files
    (by content), the base and dependency layers (by name, size and mtime), the marker."""
    h = hashlib.sha256()
    for layer in (base, deps_layer):
        st = layer.stat()
        h.update(f"{layer.name}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    h.update(f"marker:{os.environ.get(AGENT_MARKER_ENV, '')}\n".encode())
    for rel, path in _code_files(repo):
        if rel.endswith(_GENERATED):
            continue
        h.update(f"{rel}\0".encode())
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def agent_record(out_dir: Path) -> dict[str, str]:
    """What the last agent build recorded: its content key and image ID ({} if none)."""
    try:
        data = json.loads((out_dir / "node-agent.json").read_text())
    except (OSError, ValueError):
        return {}
    return {k: str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def build_agent(out_dir: Path, repo: Path, cache: Path) -> Path:
    """The node agent's image: Debian's python3, gpukit's dependencies, gpukit itself.

    Three layers, so that a code change re-imports only the small top layer. The image is
    rebuilt only when its content key (`agent_key`) differs from the last build's, which
    `node-agent.json` records with the image's ID.
    """
    base_root = cache / "rootfs" / "bookworm-agent"
    if not (base_root / ".complete").exists():
        subprocess.run(["bash", str(repo / "lab/scripts/build-rootfs.sh"), "agent"], check=True)
    layers = cache / "images" / "agent"
    base = _dir_layer(base_root, layers / "base.tar", skip=_SKIP_IN_BASE)
    reqs = _requirements(repo)
    key = hashlib.sha256(("\n".join(sorted(reqs)) + AGENT_PYTHON).encode()).hexdigest()[:16]
    deps_layer = layers / f"deps-{key}.tar"
    if not deps_layer.exists():
        target = layers / f"deps-{key}"
        shutil.rmtree(target, ignore_errors=True)
        # Wheels for the image's interpreter, resolved on the host: nothing builds in the image.
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-compile", "--only-binary=:all:",
             "--python-version", AGENT_PYTHON, "--platform", "manylinux2014_x86_64",
             "--platform", "manylinux_2_28_x86_64", "--implementation", "cp",
             "--target", str(target / "lib"), *reqs],
            check=True,
        )  # fmt: skip
        _dir_layer(target, deps_layer, prefix="opt/gpukit/")
        shutil.rmtree(target, ignore_errors=True)
    out = out_dir / "node-agent.tar"
    content_key = agent_key(repo, base, deps_layer)
    if out.exists() and agent_record(out_dir).get("key") == content_key:
        return out
    # The image's root filesystem is read-only: its gRPC stubs must exist before copying.
    subprocess.run(
        [sys.executable, "-m", "gpukit.plugin.api.generate"],
        check=True,
        cwd=repo,
        capture_output=True,
    )
    code = out_dir / "agent-code"
    shutil.rmtree(code, ignore_errors=True)
    shutil.copytree(
        repo / "gpukit",
        code / "src" / "gpukit",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    marker = os.environ.get(AGENT_MARKER_ENV)
    if marker:
        (code / "marker").write_text(marker + "\n")
    code_layer = out_dir / "agent-code.tar"
    code_layer.unlink(missing_ok=True)
    _dir_layer(code, code_layer, prefix="opt/gpukit/")
    shutil.rmtree(code, ignore_errors=True)
    write_archive(
        out,
        AGENT,
        [base, deps_layer, code_layer],
        {
            "Env": [
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "PYTHONPATH=/opt/gpukit/src:/opt/gpukit/lib",
                "PYTHONDONTWRITEBYTECODE=1",
            ],
            "Entrypoint": ["python3", "-m", "gpukit.plugin"],
        },
    )
    record = out_dir / "node-agent.json"
    tmp = record.with_name(record.name + ".partial")
    tmp.write_text(json.dumps({"key": content_key, "id": image_id(out)}) + "\n")
    tmp.replace(record)
    return out


def build_all(out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    return [build_pause(out_dir), build_shell(out_dir)]
