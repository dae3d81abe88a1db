"""gpukit's Python environment for nodes, built on the controller.

Nodes need not reach PyPI: the controller builds gpukit's wheel from its checkout, downloads
wheels of gpukit's dependencies for the nodes' Python and platform, and packs both into one
archive the `gpukit_node` role copies and installs with `pip --no-index`.

Cached under `<cache>/wheelhouse/` and keyed by content: the dependency set is keyed by the
declared requirements, Python version and platforms (downloaded once), gpukit's wheel by a
digest of its sources. The archive is reproducible, so an unchanged checkout gives the same
key and the role changes nothing on the nodes.
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
import tempfile
import tomllib
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

EPOCH = 1704067200  # fixed timestamps: reproducible wheels and archives
SOURCE_SUFFIXES = (".py", ".yaml", ".yml", ".proto", ".c", ".h", ".typed")
DEFAULT_PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_28_x86_64")
MANIFEST = "manifest.json"


class WheelhouseError(RuntimeError):
    """The wheelhouse could not be built; the message names the step and pip's output."""


@dataclass(frozen=True)
class Wheelhouse:
    key: str
    archive: str  # the .tar to copy to nodes
    project_wheel: str  # file name of gpukit's wheel in the archive
    wheels: tuple[str, ...]  # every wheel file name in the archive
    requirement: str  # what to install: "gpukit==0.1.0"

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def repo_root() -> Path:
    """The checkout this gpukit runs from (the package's parent directory)."""
    import gpukit

    return Path(gpukit.__file__).resolve().parent.parent


def _project(repo: Path) -> dict[str, object]:
    data = tomllib.loads((repo / "pyproject.toml").read_text())
    project = data.get("project")
    if not isinstance(project, dict):
        raise WheelhouseError(f"{repo / 'pyproject.toml'}: no [project] table")
    return project


def source_files(repo: Path) -> list[tuple[str, Path]]:
    """(path in the package, file) of gpukit's sources, following the package's symlinks."""
    out: list[tuple[str, Path]] = []
    pkg = repo / "gpukit"
    for dirpath, dirnames, filenames in os.walk(pkg, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not d.startswith("."))
        for name in sorted(filenames):
            if name.startswith(".") or not name.endswith(SOURCE_SUFFIXES):
                continue
            full = Path(dirpath) / name
            out.append((str(full.relative_to(repo)), full))
    return out


def source_digest(repo: Path) -> str:
    h = hashlib.sha256()
    for rel, full in source_files(repo):
        if "_pb2" in rel:  # generated from the .proto files, which are hashed
            continue
        h.update(rel.encode() + b"\0")
        h.update(hashlib.sha256(full.read_bytes()).digest())
    h.update((repo / "pyproject.toml").read_bytes())
    return h.hexdigest()[:16]


def _pip(args: Sequence[str], what: str) -> None:
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(EPOCH), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    r = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True,
                       env=env)  # fmt: skip
    if r.returncode != 0:
        raise WheelhouseError(f"{what} failed:\n{(r.stderr or r.stdout).strip()[-3000:]}")


def build_project_wheel(repo: Path, cache: Path) -> Path:
    """gpukit's wheel, built from a copy of the sources (symlinked packages resolved)."""
    out_dir = cache / f"gpukit-{source_digest(repo)}"
    done = out_dir / ".complete"
    if done.exists():
        return next(out_dir.glob("*.whl"))
    # The generated gRPC stubs are part of the package (nodes have no grpcio-tools).
    if (repo / "gpukit/plugin/api/generate.py").exists():
        subprocess.run([sys.executable, "-m", "gpukit.plugin.api.generate"], cwd=repo,
                       capture_output=True, check=False)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="gpukit-wheel-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        for rel, full in source_files(repo):
            target = src / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(full, target)
        for name in ("pyproject.toml", "README.md"):
            if (repo / name).exists():
                shutil.copyfile(repo / name, src / name)
        shutil.rmtree(out_dir, ignore_errors=True)
        out_dir.mkdir(parents=True)
        _pip(["wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out_dir), str(src)],
             "building gpukit's wheel")  # fmt: skip
    done.touch()
    return next(out_dir.glob("*.whl"))


def download_dependencies(
    repo: Path, cache: Path, python_version: str, platforms: Sequence[str]
) -> Path:
    """Wheels of gpukit's dependencies for the nodes' interpreter (binary wheels only)."""
    declared = _project(repo).get("dependencies") or []
    if not isinstance(declared, list):
        raise WheelhouseError(f"{repo / 'pyproject.toml'}: project.dependencies is not a list")
    requirements = sorted(str(r) for r in declared)
    key_src = json.dumps([requirements, python_version, sorted(platforms)]).encode()
    out_dir = cache / f"deps-{hashlib.sha256(key_src).hexdigest()[:16]}"
    if (out_dir / ".complete").exists():
        return out_dir
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    args = ["download", "-q", "--only-binary=:all:", "--python-version", python_version,
            "--implementation", "cp", "-d", str(out_dir)]  # fmt: skip
    for p in platforms:
        args += ["--platform", p]
    if requirements:
        _pip([*args, *requirements],
             f"downloading gpukit's dependencies for Python {python_version}")  # fmt: skip
    (out_dir / ".complete").touch()
    return out_dir


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), EPOCH, 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    tar.addfile(info, io.BytesIO(data))


def build(
    cache: Path,
    python_version: str,
    platforms: Sequence[str] = DEFAULT_PLATFORMS,
    repo: Path | None = None,
) -> Wheelhouse:
    """The wheelhouse archive for nodes running `python_version` on `platforms`."""
    repo = repo or repo_root()
    cache = cache / "wheelhouse"
    cache.mkdir(parents=True, exist_ok=True)
    project = build_project_wheel(repo, cache)
    deps = download_dependencies(repo, cache, python_version, platforms)
    wheels = sorted([project, *deps.glob("*.whl")], key=lambda p: p.name)
    h = hashlib.sha256()
    for w in wheels:
        h.update(w.name.encode() + b"\0" + hashlib.sha256(w.read_bytes()).digest())
    key = h.hexdigest()[:16]
    archive = cache / f"wheelhouse-{key}.tar"
    name = str(_project(repo)["name"])
    version = str(_project(repo)["version"])
    manifest = {
        "key": key,
        "requirement": f"{name}=={version}",
        "project_wheel": project.name,
        "wheels": [w.name for w in wheels],
        "python_version": python_version,
        "platforms": list(platforms),
    }
    if not archive.exists():
        tmp = archive.with_suffix(".partial")
        with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
            _add(tar, MANIFEST, json.dumps(manifest, indent=2).encode() + b"\n")
            for w in wheels:
                _add(tar, w.name, w.read_bytes())
        tmp.replace(archive)
    return Wheelhouse(
        key=key,
        archive=str(archive),
        project_wheel=project.name,
        wheels=tuple(w.name for w in wheels),
        requirement=f"{name}=={version}",
    )


def load(archive: Path) -> Wheelhouse:
    """A prebuilt wheelhouse archive (e.g. a CI artifact) from its manifest."""
    try:
        with tarfile.open(archive) as tar:
            member = tar.extractfile(MANIFEST)
            if member is None:
                raise WheelhouseError(f"{archive}: no {MANIFEST}")
            data = json.loads(member.read())
    except (OSError, tarfile.TarError, KeyError, ValueError) as e:
        raise WheelhouseError(f"{archive}: not a gpukit wheelhouse archive ({e})") from e
    return Wheelhouse(
        key=str(data["key"]),
        archive=str(archive),
        project_wheel=str(data["project_wheel"]),
        wheels=tuple(data["wheels"]),
        requirement=str(data["requirement"]),
    )
