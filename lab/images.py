"""Container images the lab builds locally (nothing is ever pulled).

Each image is written as a docker-archive tar (manifest.json with RepoTags), the
form `ctr images import` reads.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
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


def write_archive(out: Path, ref: str, layer: bytes, config: dict[str, object]) -> Path:
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    image_config = {
        "architecture": "amd64",
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": "gpukit lab"}],
    }
    cfg = json.dumps(image_config, sort_keys=True).encode()
    cfg_name = hashlib.sha256(cfg).hexdigest() + ".json"
    layer_name = diff_id.removeprefix("sha256:") + "/layer.tar"
    manifest = json.dumps([{"Config": cfg_name, "RepoTags": [ref], "Layers": [layer_name]}]).encode()
    tmp = out.with_suffix(".partial")
    with tarfile.open(tmp, "w") as tar:
        for name, data in ((cfg_name, cfg), (layer_name, layer), ("manifest.json", manifest)):
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 0
            tar.addfile(info, io.BytesIO(data))
    tmp.replace(out)
    return out


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
    if not busybox.exists() or b"statically linked" not in subprocess.run(
        ["file", "-b", str(busybox)], capture_output=True
    ).stdout:
        busybox = Path(shutil.which("busybox") or "/bin/busybox")
    entries = [FileEntry("bin/busybox", busybox)]
    entries += [FileEntry(f"bin/{a}", link="busybox") for a in BUSYBOX_APPLETS]
    layer = _layer(entries)
    return write_archive(
        out, SHELL, layer, {"Env": ["PATH=/bin"], "Cmd": ["/bin/sh"]}
    )


def build_all(out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    return [build_pause(out_dir), build_shell(out_dir)]
