"""The release (make dist, deploy/release.py): one version everywhere, a CHANGELOG entry for it,
and the non-image parts of dist built and checksummed. The image archive is built by the same
make target (too slow for a unit test); its tag is the release's version (release.image_ref)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


def release() -> ModuleType:
    path = REPO / "deploy/release.py"
    spec = importlib.util.spec_from_file_location("release", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_collection_and_the_changelog_carry_pyprojects_version() -> None:
    r = release()
    assert r.galaxy_version() == r.version()
    assert r.version() in r.changelog_versions()
    assert r.problems() == []
    assert r.image_ref(r.version()) == f"gpukit-node-agent:{r.version()}"


def _copy(tmp: Path) -> Path:
    for name in ("pyproject.toml", f"{release().COLLECTION}/galaxy.yml",
                 f"{release().COLLECTION}/CHANGELOG.md"):  # fmt: skip
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, tmp / name)
    return tmp


def test_a_galaxy_version_that_differs_is_one_line_naming_both(tmp_path: Path) -> None:
    r = release()
    repo = _copy(tmp_path)
    galaxy = repo / r.COLLECTION / "galaxy.yml"
    galaxy.write_text(galaxy.read_text().replace(f"version: {r.version()}", "version: 9.9.9"))
    assert r.problems(repo) == [
        f"{r.COLLECTION}/galaxy.yml: version is 9.9.9, pyproject.toml's is {r.version()}"
    ]


def test_a_version_without_a_changelog_entry_is_refused(tmp_path: Path) -> None:
    r = release()
    repo = _copy(tmp_path)
    pyproject = repo / "pyproject.toml"
    pyproject.write_text(
        pyproject.read_text().replace(f'version = "{r.version()}"', 'version = "9.9.9"', 1)
    )
    galaxy = repo / r.COLLECTION / "galaxy.yml"
    galaxy.write_text(galaxy.read_text().replace(f"version: {r.version()}", "version: 9.9.9"))
    assert r.problems(repo) == [f"{r.COLLECTION}/CHANGELOG.md: has no '## 9.9.9' entry"]


def test_dist_builds_wheel_sdist_and_collection_of_one_version_with_checksums(
    tmp_path: Path,
) -> None:
    r = release()
    ver = r.version()
    out = tmp_path / "dist"
    run = subprocess.run([sys.executable, str(REPO / "deploy/release.py"), "build", str(out)],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr
    names = sorted(p.name for p in out.iterdir())
    assert names == [f"gpukit-{ver}-py3-none-any.whl", f"gpukit-{ver}.tar.gz",
                     f"gpukit-gpu-{ver}.tar.gz"]  # fmt: skip
    with zipfile.ZipFile(out / f"gpukit-{ver}-py3-none-any.whl") as z:
        assert f"gpukit-{ver}.dist-info/METADATA" in z.namelist()
    with tarfile.open(out / f"gpukit-gpu-{ver}.tar.gz") as t:
        assert "MANIFEST.json" in t.getnames()
    with tarfile.open(out / f"gpukit-{ver}.tar.gz") as t:
        sdist = t.getnames()
    assert f"gpukit-{ver}/pyproject.toml" in sdist
    assert not [n for n in sdist if n.endswith("_pb2.py")]  # generated at build, never shipped
    sums = r.sums(out)
    lines = sums.read_text().splitlines()
    assert [line.split("  ")[1] for line in lines] == names
    check = subprocess.run(["sha256sum", "-c", "--quiet", sums.name], cwd=out,
                           capture_output=True, text=True)  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    # A byte changed in an artifact is caught by its checksum.
    wheel = out / names[0]
    wheel.write_bytes(wheel.read_bytes() + b"\0")
    assert subprocess.run(["sha256sum", "-c", "--quiet", sums.name], cwd=out,
                          capture_output=True).returncode != 0  # fmt: skip


def test_the_agent_images_digest_is_its_oci_archives_manifest(tmp_path: Path) -> None:
    """release.py sums prints the agent image's manifest digest (what a registry serves it as
    once the archive is copied there): index.json's one manifest."""
    import io
    import json
    import tarfile

    r = release()
    digest = "sha256:" + "5e" * 32
    archive = tmp_path / f"gpukit-node-agent-{r.version()}.oci.tar"
    index = json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest,
         "size": 1}]}).encode()  # fmt: skip
    with tarfile.open(archive, "w") as tar:
        info = tarfile.TarInfo("index.json")
        info.size = len(index)
        tar.addfile(info, io.BytesIO(index))
    assert r.image_digest(archive) == digest
    assert r.digest_lines(tmp_path) == [
        f"{archive.name}: gpukit-node-agent:{r.version()} is manifest {digest}"
        f" (gpukit_device_plugin_image: REGISTRY/gpukit-node-agent@{digest})"]
