"""Container images the lab builds locally (nothing is ever pulled).

Each image is written as a docker-archive tar (manifest.json with RepoTags), the form
`ctr images import` reads. The pause and shell images are tiny static test images made
here; the CUDA probe image a CUDA-like workload (gpukit/lab/cuda/cuda_probe.c, linked against the
C library it carries, no driver library: that comes from the runtime or CDI); the node
agent's is built from the checkout's Containerfile by buildah.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

SOURCES = Path(__file__).resolve().parent / "images"
PAUSE = "localhost/gpukit-lab/pause:3.10"
SHELL = "localhost/gpukit-lab/shell:1"
CUDA_PROBE = "localhost/gpukit-lab/cuda-probe:1"
CUDA_SOURCES = Path(__file__).resolve().parent / "cuda"


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
    """Write a docker-archive of one layer (the pause and shell images)."""
    digest = hashlib.sha256(layer).hexdigest()
    image_config = {
        "architecture": "amd64",
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{digest}"]},
        "history": [{"created_by": "gpukit lab"}],
    }
    cfg = json.dumps(image_config, sort_keys=True).encode()
    cfg_name = hashlib.sha256(cfg).hexdigest() + ".json"
    layer_name = f"{digest}/layer.tar"
    manifest = json.dumps([{"Config": cfg_name, "RepoTags": [ref], "Layers": [layer_name]}])
    tmp = out.with_suffix(".partial")
    with tarfile.open(tmp, "w") as tar:
        for name, data in (
            (cfg_name, cfg),
            (layer_name, layer),
            ("manifest.json", manifest.encode()),
        ):
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 0
            tar.addfile(info, io.BytesIO(data))
    tmp.replace(out)
    return out


def image_id(archive: Path) -> str:
    """The image ID (its config's digest, as the kubelet reports it) of a docker-archive."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("manifest.json")
        assert member is not None
        config = json.loads(member.read())[0]["Config"]
    return "sha256:" + str(config).removesuffix(".json")


def layers_size(archive: Path) -> int:
    """A docker-archive's uncompressed image size: the bytes of its layer tars."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("manifest.json")
        assert member is not None
        layers = json.loads(member.read())[0]["Layers"]
        return sum(tar.getmember(name).size for name in layers)


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


def _busybox() -> list[FileEntry]:
    """The static busybox from the host's package at /bin, with its applets' links."""
    busybox = Path("/bin/busybox")
    if (
        not busybox.exists()
        or b"statically linked"
        not in subprocess.run(["file", "-b", str(busybox)], capture_output=True).stdout
    ):
        busybox = Path(shutil.which("busybox") or "/bin/busybox")
    return [FileEntry("bin/busybox", busybox),
            *(FileEntry(f"bin/{a}", link="busybox") for a in BUSYBOX_APPLETS)]


def build_shell(out_dir: Path) -> Path:
    """A small image with a shell: the static busybox from the host's package."""
    out = out_dir / "shell.tar"
    if out.exists():
        return out
    layer = _layer(_busybox())
    return write_archive(out, SHELL, layer, {"Env": ["PATH=/bin"], "Cmd": ["/bin/sh"]})


# The C library and loader the probe runs with, where Debian's loader looks for them; the
# image has no /etc/ld.so.cache, so a libcuda.so.1 is found only where the runtime (or CDI and
# its hooks) put one: the loader's cache they wrote, or its default directories.
LOADER = "lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
LIBC = "lib/x86_64-linux-gnu/libc.so.6"


# What the probe's image holds besides the probe: part of its build's key.
CUDA_PROBE_RECIPE = "probe, loader, libc, busybox at /bin"


def build_cuda_probe(out_dir: Path) -> Path:
    """The CUDA-like workload's image: /cuda-probe (dlopen libcuda.so.1, cuInit,
    cuDeviceGetCount), glibc's loader and libc, as a CUDA base image has them (the driver's
    programs a CDI spec binds run there too), and a shell (busybox, /bin) to look around;
    rebuilt when the source or the recipe changes."""
    source = CUDA_SOURCES / "cuda_probe.c"
    digest = hashlib.sha256(source.read_bytes() + CUDA_PROBE_RECIPE.encode()).hexdigest()[:16]
    out = out_dir / "cuda-probe.tar"
    stamp = out_dir / "cuda-probe.digest"
    if out.exists() and stamp.exists() and stamp.read_text() == digest:
        return out
    out_dir.mkdir(parents=True, exist_ok=True)
    binary = out_dir / "cuda-probe.bin"
    subprocess.run(["gcc", "-O2", "-s", "-Wall", "-Werror", "-o", str(binary), str(source)],
                   check=True)  # fmt: skip
    entries = [
        FileEntry("cuda-probe", binary),
        FileEntry(LOADER, Path("/") / LOADER),
        FileEntry(LIBC, Path("/") / LIBC),
        FileEntry("lib64/ld-linux-x86-64.so.2", link=f"/{LOADER}"),
        *_busybox(),
    ]
    layer = _layer(entries)
    write_archive(out, CUDA_PROBE, layer, {"Entrypoint": ["/cuda-probe"]})
    stamp.write_text(digest)
    return out


AGENT = "localhost/gpukit-lab/node-agent:dev"
CONTAINERFILE = "Containerfile"
# The Containerfile's BASE in the lab: an image of the lab's node root (Debian bookworm with
# python3 and python3-venv), tagged by that root's build.
BASE_REPO = "localhost/gpukit-lab/bookworm-root"
_SKIP_IN_BASE = ("dev", "proc", "sys", "run", "tmp", "var/cache/apt/archives")
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
KEEP_BUILDS = 3  # archives kept in the cache, the most recently used

# Tests set this to change the agent's image without touching the checkout: it is part of
# the content key and of the REVISION the image records (/opt/gpukit/REVISION).
AGENT_MARKER_ENV = "GPUKIT_LAB_AGENT_MARKER"


def node_root(cache: Path) -> Path:
    return cache / "rootfs" / "bookworm"


def _base_ref(cache: Path) -> str:
    """The base image's name: the node root's path and build time (its .complete stamp)."""
    done = node_root(cache) / ".complete"
    stamp = f"{done.parent}:{done.stat().st_mtime_ns}"
    return f"{BASE_REPO}:{hashlib.sha256(stamp.encode()).hexdigest()[:16]}"


def agent_key(repo: Path, cache: Path) -> str:
    """A content key of everything the agent's image is built from: the build context (the
    files .containerignore lets through), the Containerfile, the base, the marker."""
    from gpukit.lab import build_context

    h = hashlib.sha256()
    h.update(build_context.digest(repo, extra=(repo / CONTAINERFILE,)).encode())
    h.update(f"\nbase:{_base_ref(cache)}\nmarker:{os.environ.get(AGENT_MARKER_ENV, '')}\n".encode())
    return h.hexdigest()


def agent_record(out_dir: Path) -> dict[str, str]:
    """What the last agent build recorded: its content key, image ID, revision ({} if none)."""
    try:
        data = json.loads((out_dir / "node-agent.json").read_text())
    except (OSError, ValueError):
        return {}
    return {k: str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def _revision(key: str) -> str:
    marker = os.environ.get(AGENT_MARKER_ENV)
    return f"lab-{key[:16]}" + (f"+{marker}" if marker else "")


def _ensure_base(cache: Path, repo: Path, log: Path) -> str:
    from gpukit.lab import buildah

    if not (node_root(cache) / ".complete").exists():
        subprocess.run(["bash", str(repo / "gpukit/lab/scripts/build-rootfs.sh")], check=True,
                       stdout=subprocess.DEVNULL)  # fmt: skip
    ref = _base_ref(cache)
    if buildah.image(ref) is None:
        buildah.import_root(node_root(cache), ref, _SKIP_IN_BASE, log)
    return ref


def _build(repo: Path, cache: Path, key: str, archive: Path, log: Path) -> dict[str, str]:
    """Build the Containerfile with buildah and write the image as a docker-archive tagged
    AGENT (what `ctr images import` reads)."""
    from gpukit.lab import buildah

    base = _ensure_base(cache, repo, log)
    revision = _revision(key)
    # RUN steps trust what this machine trusts (read-only, in no layer): Debian's pip uses
    # the system bundle, so a build behind a TLS-inspecting proxy still reaches PyPI.
    trust = [f"--volume={CA_BUNDLE}:{CA_BUNDLE}:ro"] if CA_BUNDLE.is_file() else []
    buildah.run(
        "bud", "--isolation", "chroot", "--layers", "--force-rm", "--pull=never",
        "--format", "docker",
        *trust, "-f", str(repo / CONTAINERFILE), "-t", AGENT,
        "--build-arg", f"BASE={base}", "--build-arg", f"REVISION={revision}", str(repo),
        log=log,
    )  # fmt: skip
    tmp = archive.with_name(archive.name + ".partial")
    tmp.unlink(missing_ok=True)
    buildah.run("push", AGENT, f"docker-archive:{tmp}:{AGENT}", log=log)
    tmp.replace(archive)
    return {"key": key, "id": image_id(archive), "revision": revision,
            "size": str(layers_size(archive))}  # fmt: skip


def _prune(builds: Path, current: Path) -> None:
    """Keep the newest KEEP_BUILDS archives (buildah's storage keeps its layer cache; the
    images it tagged AGENT before are superseded)."""
    records = sorted(builds.glob("node-agent-*.json"), key=lambda p: p.stat().st_mtime_ns)
    for record in records[:-KEEP_BUILDS]:
        record.with_suffix(".tar").unlink(missing_ok=True)
        record.unlink(missing_ok=True)
    for archive in builds.glob("node-agent-*.tar"):  # left by a build that did not finish
        if archive != current and not archive.with_suffix(".json").exists():
            archive.unlink()


def build_agent(out_dir: Path, repo: Path, cache: Path) -> Path:
    """The node agent's image, built from the checkout's Containerfile by buildah, as
    out_dir/node-agent.tar (a docker-archive tagged AGENT) with its record, node-agent.json.

    Rebuilt only when its content key (`agent_key`) differs from the last build's. Builds are
    kept in the cache by key (shared by all lab instances; a lock keeps two from building
    at once), so a key seen before costs a link, not a build; buildah's layer cache keeps
    the dependency layer across changes of gpukit's own files.
    """
    out = out_dir / "node-agent.tar"
    key = agent_key(repo, cache)
    if out.exists() and agent_record(out_dir).get("key") == key:
        return out
    builds = cache / "images" / "agent"
    builds.mkdir(parents=True, exist_ok=True)
    archive = builds / f"node-agent-{key}.tar"
    record_file = archive.with_suffix(".json")
    with open(builds / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (archive.exists() and record_file.exists()):
            log = builds / "build.log"
            log.write_text(f"node-agent image, key {key}\n")
            record = _build(repo, cache, key, archive, log)
            _write_json(record_file, record)
            _prune(builds, archive)
        else:
            os.utime(record_file)  # used again: newest for _prune
        record = json.loads(record_file.read_text())
    tmp = out.with_name(out.name + ".partial")
    tmp.unlink(missing_ok=True)
    try:
        os.link(archive, tmp)
    except OSError:  # another file system
        shutil.copyfile(archive, tmp)
    tmp.replace(out)
    _write_json(out_dir / "node-agent.json", record)
    return out


def _write_json(path: Path, data: dict[str, str]) -> None:
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(json.dumps(data) + "\n")
    tmp.replace(path)


def build_all(out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    return [build_pause(out_dir), build_shell(out_dir)]
