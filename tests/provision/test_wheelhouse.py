"""The nodes' wheelhouse: content keys, a reproducible archive, prebuilt archives."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from gpukit.provision import wheelhouse


def fake_repo(root: Path, body: str = "X = 1\n") -> Path:
    (root / "gpukit/sub").mkdir(parents=True)
    (root / "gpukit/__init__.py").write_text(body)
    (root / "gpukit/sub/__init__.py").write_text("")
    (root / "gpukit/sub/data.yaml").write_text("a: 1\n")
    (root / "gpukit/__pycache__").mkdir()
    (root / "gpukit/__pycache__/x.pyc").write_bytes(b"junk")
    (root / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=68"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "gpukit"\nversion = "0.1.0"\ndependencies = []\n'
        '[tool.setuptools.packages.find]\ninclude = ["gpukit", "gpukit.*"]\n'
        '[tool.setuptools.package-data]\n"*" = ["*.yaml"]\n'
    )
    return root


def test_source_digest_follows_sources_only(tmp_path: Path) -> None:
    a = fake_repo(tmp_path / "a")
    b = fake_repo(tmp_path / "b")
    assert wheelhouse.source_digest(a) == wheelhouse.source_digest(b)
    (b / "gpukit/__pycache__/y.pyc").write_bytes(b"more junk")
    assert wheelhouse.source_digest(a) == wheelhouse.source_digest(b)
    (b / "gpukit/sub/data.yaml").write_text("a: 2\n")
    assert wheelhouse.source_digest(a) != wheelhouse.source_digest(b)
    rels = [rel for rel, _ in wheelhouse.source_files(a)]
    assert rels == ["gpukit/__init__.py", "gpukit/sub/__init__.py", "gpukit/sub/data.yaml"]


def test_build_is_keyed_and_reproducible(tmp_path: Path) -> None:
    repo = fake_repo(tmp_path / "repo")
    first = wheelhouse.build(tmp_path / "cache", "3.11", repo=repo)
    again = wheelhouse.build(tmp_path / "cache", "3.11", repo=repo)
    assert first == again
    assert first.requirement == "gpukit==0.1.0"
    assert first.wheels == (first.project_wheel,)
    with tarfile.open(first.archive) as tar:
        names = tar.getnames()
        manifest = json.loads(tar.extractfile("manifest.json").read())  # type: ignore[union-attr]
        assert all(m.mtime == wheelhouse.EPOCH for m in tar.getmembers())
    assert names == ["manifest.json", first.project_wheel]
    assert manifest["key"] == first.key and manifest["python_version"] == "3.11"
    assert wheelhouse.load(Path(first.archive)) == first
    (repo / "gpukit/__init__.py").write_text("X = 2\n")
    changed = wheelhouse.build(tmp_path / "cache", "3.11", repo=repo)
    assert changed.key != first.key


def test_load_rejects_other_archives(tmp_path: Path) -> None:
    bad = tmp_path / "x.tar"
    with tarfile.open(bad, "w"):
        pass
    with pytest.raises(wheelhouse.WheelhouseError, match="not a gpukit wheelhouse archive"):
        wheelhouse.load(bad)
