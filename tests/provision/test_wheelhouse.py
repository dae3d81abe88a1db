"""The nodes' wheelhouse: content keys, a reproducible archive, prebuilt archives."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import zipfile
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


# --- gpukit installed from a wheel: no checkout on the controller -----------------------------


def _venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    return path / "bin" / "python"


def _pip_install(python: Path, wheel: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                    "--no-deps", "--no-index", "--disable-pip-version-check", str(wheel)],
                   check=True)  # fmt: skip


def _members(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as whl:
        return {n: whl.read(n) for n in whl.namelist() if not n.endswith(".dist-info/RECORD")}


REMAKE = """
import importlib.util, json, sys
from pathlib import Path
spec = importlib.util.spec_from_file_location("wheelhouse_under_test", sys.argv[1])
mod = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
print(json.dumps(str(mod.installed_wheel(Path(sys.argv[2])))))
"""


def test_a_wheel_is_remade_from_the_installed_package(tmp_path: Path) -> None:
    """A controller that installed gpukit from its wheel has no sources: the wheel is re-made
    from the installed files (the same files as the original wheel, a new RECORD), installs
    with pip, and is the same for the same installed files."""
    repo = fake_repo(tmp_path / "repo")
    original = wheelhouse.build_project_wheel(repo, tmp_path / "build")
    python = _venv(tmp_path / "controller")
    _pip_install(python, original)
    remake = [str(python), "-c", REMAKE, wheelhouse.__file__, str(tmp_path / "cache")]
    # (cwd: not this checkout, whose gpukit.egg-info a `python -c` would find first)
    first = Path(json.loads(subprocess.run(remake, capture_output=True, text=True, check=True,
                                           cwd=tmp_path).stdout))  # fmt: skip
    assert first.name == original.name and first.parent.name.startswith("gpukit-installed-")
    assert _members(first) == _members(original)
    with zipfile.ZipFile(first) as whl:
        record = whl.read("gpukit-0.1.0.dist-info/RECORD").decode().splitlines()
    assert sorted(r.split(",")[0] for r in record) == sorted(
        [*_members(original), "gpukit-0.1.0.dist-info/RECORD"])
    assert all(r.count(",") == 2 for r in record)
    # The same installed files, the same wheel (the cache answers; a rebuild is identical).
    again = subprocess.run(remake, capture_output=True, text=True, check=True, cwd=tmp_path).stdout
    assert Path(json.loads(again)) == first
    node = _venv(tmp_path / "node")
    _pip_install(node, first)
    out = subprocess.run([str(node), "-c", "import gpukit, gpukit.sub; print(gpukit.X)"],
                         capture_output=True, text=True, check=True, cwd=tmp_path).stdout  # fmt: skip
    assert out.strip() == "1"


def test_an_editable_install_is_not_remade(tmp_path: Path) -> None:
    """This checkout's own gpukit is an editable install: its RECORD has no package files."""
    if wheelhouse.checkout_root() is None:
        pytest.skip("gpukit runs from an installed wheel here, not from a checkout")
    with pytest.raises(wheelhouse.WheelhouseError, match="not installed from a wheel"):
        wheelhouse.installed_wheel(tmp_path)


def test_a_given_wheel_goes_into_the_archive(tmp_path: Path) -> None:
    repo = fake_repo(tmp_path / "repo")
    wheel = wheelhouse.build_project_wheel(repo, tmp_path / "build")
    wh = wheelhouse.build(tmp_path / "cache", "3.11", wheel=wheel)
    assert wh.project_wheel == wheel.name and wh.requirement == "gpukit==0.1.0"
    with tarfile.open(wh.archive) as tar:
        packed = tar.extractfile(wheel.name).read()  # type: ignore[union-attr]
    assert packed == wheel.read_bytes()
    with pytest.raises(wheelhouse.WheelhouseError, match=r"gpukit_node_wheel: '/nope\.whl' is not"):
        wheelhouse.build(tmp_path / "cache", "3.11", wheel=Path("/nope.whl"))
    other = tmp_path / "other"
    fake_repo(other)
    text = (other / "pyproject.toml").read_text().replace('name = "gpukit"', 'name = "other"')
    (other / "pyproject.toml").write_text(text)
    foreign = wheelhouse.build_project_wheel(other, tmp_path / "build-other")
    with pytest.raises(wheelhouse.WheelhouseError, match="is a wheel of 'other', not gpukit"):
        wheelhouse.build(tmp_path / "cache", "3.11", wheel=foreign)


def test_requirements_come_from_the_wheel_without_extras(tmp_path: Path) -> None:
    repo = fake_repo(tmp_path / "repo")
    text = (repo / "pyproject.toml").read_text().replace(
        "dependencies = []\n",
        'dependencies = ["PyYAML>=6"]\n[project.optional-dependencies]\ndev = ["pytest>=8"]\n')
    (repo / "pyproject.toml").write_text(text)
    meta = wheelhouse.wheel_metadata(wheelhouse.build_project_wheel(repo, tmp_path / "build"))
    assert (meta.name, meta.version, meta.requirements) == ("gpukit", "0.1.0", ("PyYAML>=6",))
