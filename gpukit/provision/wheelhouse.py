"""gpukit's Python environment for nodes, built on the controller.

Nodes need not reach PyPI: the controller takes gpukit's wheel, downloads wheels of the
dependencies it declares for the nodes' Python and platform, and packs both into one archive
the `gpukit_node` role copies and installs with `pip --no-index`.

gpukit's wheel is, in this order: a wheel given by path (`gpukit_node_wheel`, e.g. the release
the controller installed); built from the checkout the controller's gpukit runs from; or, when
gpukit is installed from a wheel (no checkout), re-made from the installed distribution (the
files its RECORD lists, with the wheel's own metadata). The dependencies and the requirement
come from that wheel's metadata.

Cached under `<cache>/wheelhouse/` and keyed by content: the dependency set is keyed by the
declared requirements, Python version and platforms (downloaded once), gpukit's wheel by a
digest of its sources or installed files. The archive is reproducible, so unchanged gpukit
gives the same key and the role changes nothing on the nodes.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
import zipfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from email.parser import Parser
from pathlib import Path
from typing import Any

EPOCH = 1704067200  # fixed timestamps: reproducible wheels and archives
SOURCE_SUFFIXES = (".py", ".yaml", ".yml", ".json", ".proto", ".c", ".h", ".typed")
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
    """The directory gpukit's package is in (a checkout, or site-packages)."""
    import gpukit

    return Path(gpukit.__file__).resolve().parent.parent


def checkout_root() -> Path | None:
    """The checkout the controller's gpukit runs from, or None when gpukit is installed."""
    root = repo_root()
    try:
        project = tomllib.loads((root / "pyproject.toml").read_text()).get("project") or {}
    except (OSError, tomllib.TOMLDecodeError):
        return None
    return root if project.get("name") == "gpukit" else None


def excluded_packages(repo: Path) -> tuple[str, ...]:
    """The package patterns gpukit's wheel leaves out (pyproject.toml's packages.find exclude,
    e.g. the lab, which runs from a checkout only)."""
    try:
        tool = tomllib.loads((repo / "pyproject.toml").read_text()).get("tool") or {}
    except (OSError, tomllib.TOMLDecodeError):
        return ()
    find = tool.get("setuptools", {}).get("packages", {}).get("find", {})
    return tuple(find.get("exclude") or ())


def source_files(repo: Path) -> list[tuple[str, Path]]:
    """(path in the package, file) of gpukit's sources; the
    packages the wheel excludes are left out, so that a change there rebuilds nothing."""
    out: list[tuple[str, Path]] = []
    pkg = repo / "gpukit"
    excluded = excluded_packages(repo)

    def wanted(dirpath: str, name: str) -> bool:
        if name == "__pycache__" or name.startswith("."):
            return False
        dotted = (Path(dirpath, name).relative_to(repo)).as_posix().replace("/", ".")
        return not any(fnmatch.fnmatchcase(dotted, pattern) for pattern in excluded)

    for dirpath, dirnames, filenames in os.walk(pkg, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if wanted(dirpath, d))
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
    """gpukit's wheel, built from a copy of the sources."""
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
        for name in ("pyproject.toml", "README.md", "setup.py", "setup.cfg", "MANIFEST.in"):
            if (repo / name).exists():
                shutil.copyfile(repo / name, src / name)
        shutil.rmtree(out_dir, ignore_errors=True)
        out_dir.mkdir(parents=True)
        _pip(["wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out_dir), str(src)],
             "building gpukit's wheel")  # fmt: skip
    done.touch()
    return next(out_dir.glob("*.whl"))


# Files an installer adds to a distribution: not part of the wheel it came from.
_INSTALLER_FILES = ("RECORD", "INSTALLER", "REQUESTED", "direct_url.json")


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return f"sha256={digest.decode()}"


def _installed_files(dist: Any) -> list[tuple[str, Path]]:
    """(path in the wheel, installed file) of what the distribution's RECORD lists inside
    site-packages: byte code, console scripts and the installer's own files left out."""
    files = []
    for f in dist.files or ():
        parts = f.parts
        if parts[0] == ".." or "__pycache__" in parts or f.suffix == ".pyc":
            continue
        if parts[0].endswith(".dist-info") and parts[-1] in _INSTALLER_FILES:
            continue
        files.append((f.as_posix(), Path(str(dist.locate_file(f)))))
    return files


def installed_wheel(cache: Path, dist_name: str = "gpukit") -> Path:
    """gpukit's wheel re-made from the installed distribution (its files, with a new RECORD):
    for a controller that installed gpukit from its wheel, with no sources to build from."""
    from importlib import metadata

    for dist in metadata.distributions(name=dist_name):
        files = _installed_files(dist)
        tags = Parser().parsestr(dist.read_text("WHEEL") or "").get_all("Tag") or []
        # An editable install or a source tree's egg-info lists no package files: skip it.
        if tags and f"{dist_name}/__init__.py" in {rel for rel, _ in files}:
            break
    else:
        raise WheelhouseError(
            f"{dist_name} is not installed from a wheel (not installed, or an editable install "
            "or a source tree): build from its checkout, or give gpukit_node_wheel")
    meta = Parser().parsestr(dist.read_text("METADATA") or "")
    name, version = meta["Name"], meta["Version"]
    files.sort(key=lambda item: (item[0].split("/")[0].endswith(".dist-info"), item[0]))
    h = hashlib.sha256()
    for rel, full in files:
        h.update(rel.encode() + b"\0" + hashlib.sha256(full.read_bytes()).digest())
    out_dir = cache / f"gpukit-installed-{h.hexdigest()[:16]}"
    target = out_dir / f"{name.replace('-', '_')}-{version}-{tags[0]}.whl"
    if (out_dir / ".complete").exists():
        return target
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    dist_info = next(rel.split("/")[0] for rel, _ in files if rel.endswith(".dist-info/METADATA"))
    stamp = time.gmtime(EPOCH)[:6]
    record: list[str] = []
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as whl:
        for rel, full in files:
            data = full.read_bytes()
            info = zipfile.ZipInfo(rel, date_time=stamp)
            info.external_attr = 0o644 << 16
            whl.writestr(info, data, zipfile.ZIP_DEFLATED)
            record.append(f"{rel},{_record_hash(data)},{len(data)}")
        record.append(f"{dist_info}/RECORD,,")
        info = zipfile.ZipInfo(f"{dist_info}/RECORD", date_time=stamp)
        info.external_attr = 0o644 << 16
        whl.writestr(info, "\n".join(record) + "\n", zipfile.ZIP_DEFLATED)
    (out_dir / ".complete").touch()
    return target


@dataclass(frozen=True)
class WheelMetadata:
    name: str
    version: str
    requirements: tuple[str, ...]  # Requires-Dist without extras: what a plain install needs


def wheel_metadata(wheel: Path) -> WheelMetadata:
    """Name, version and requirements of a wheel, from its METADATA."""
    try:
        with zipfile.ZipFile(wheel) as whl:
            member = next(n for n in whl.namelist()
                          if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
            meta = Parser().parsestr(whl.read(member).decode())
    except (OSError, zipfile.BadZipFile, StopIteration, UnicodeDecodeError) as e:
        raise WheelhouseError(f"{wheel}: not a wheel ({e or 'no METADATA'})") from e
    requirements = tuple(
        r for r in meta.get_all("Requires-Dist") or []
        if "extra" not in r.partition(";")[2]
    )
    return WheelMetadata(name=meta["Name"], version=meta["Version"], requirements=requirements)


def download_dependencies(
    declared: Sequence[str], cache: Path, python_version: str, platforms: Sequence[str]
) -> Path:
    """Wheels of gpukit's dependencies for the nodes' interpreter (binary wheels only)."""
    requirements = sorted(declared)
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


def project_wheel(cache: Path, repo: Path | None = None, wheel: Path | None = None) -> Path:
    """gpukit's wheel: `wheel` as given, else built from `repo` or the controller's checkout,
    else re-made from the installed gpukit."""
    if wheel is not None:
        if not wheel.is_file():
            raise WheelhouseError(f"gpukit_node_wheel: {str(wheel)!r} is not a file")
        name = wheel_metadata(wheel).name
        if name != "gpukit":
            raise WheelhouseError(f"gpukit_node_wheel: {str(wheel)!r} is a wheel of {name!r}, "
                                  "not gpukit")
        return wheel
    repo = repo or checkout_root()
    if repo is not None:
        return build_project_wheel(repo, cache)
    return installed_wheel(cache)


def build(
    cache: Path,
    python_version: str,
    platforms: Sequence[str] = DEFAULT_PLATFORMS,
    repo: Path | None = None,
    wheel: Path | None = None,
) -> Wheelhouse:
    """The wheelhouse archive for nodes running `python_version` on `platforms`."""
    cache = cache / "wheelhouse"
    cache.mkdir(parents=True, exist_ok=True)
    project = project_wheel(cache, repo, wheel)
    meta = wheel_metadata(project)
    deps = download_dependencies(meta.requirements, cache, python_version, platforms)
    wheels = sorted([project, *deps.glob("*.whl")], key=lambda p: p.name)
    h = hashlib.sha256()
    for w in wheels:
        h.update(w.name.encode() + b"\0" + hashlib.sha256(w.read_bytes()).digest())
    key = h.hexdigest()[:16]
    archive = cache / f"wheelhouse-{key}.tar"
    requirement = f"{meta.name}=={meta.version}"
    manifest = {
        "key": key,
        "requirement": requirement,
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
        requirement=requirement,
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
