"""The node agent's image build, short of building it (the lab test builds it once,
tests/lab/test_agent_image.py): the build context the lab keys the image on is the one
buildah reads, and the runtime root (deploy/python_root.py) runs python3."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

from gpukit.lab import build_context, images

REPO = Path(__file__).resolve().parents[2]


def python_root() -> ModuleType:
    spec = importlib.util.spec_from_file_location("python_root", REPO / "deploy/python_root.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("pattern", "path", "hit"),
    [
        ("*", "a", True), ("*", "a/b", True),  # through its parent
        ("*.py", "x.py", True), ("*.py", "d/x.py", False),
        ("**/*.pyc", "x.pyc", True), ("**/*.pyc", "a/b/x.pyc", True),
        ("**/__pycache__", "a/__pycache__/m.pyc", True),
        ("plugin/api/*_pb2.py", "plugin/api/x_pb2.py", True),
        ("plugin/api/*_pb2.py", "plugin/api/x_pb2_grpc.py", False),
        ("a?c", "abc", True), ("a?c", "a/c", False), ("[!x]y", "zy", True), ("[!x]y", "xy", False),
        ("/lead", "lead", True), ("dir/", "dir/f", True),
    ],
)  # fmt: skip
def test_ignore_patterns_follow_docker(pattern: str, path: str, hit: bool) -> None:
    assert build_context.ignored(build_context.parse_ignore(pattern), path) is hit


def test_the_last_matching_pattern_decides() -> None:
    patterns = build_context.parse_ignore("*\n!keep\nkeep/**/*.log\n!keep/important.log\n")
    assert build_context.ignored(patterns, "other/file")
    assert not build_context.ignored(patterns, "keep/src/a.py")
    assert build_context.ignored(patterns, "keep/src/debug.log")
    assert not build_context.ignored(patterns, "keep/important.log")


def test_both_ignore_files_say_the_same() -> None:
    # buildah and podman read .containerignore, docker .dockerignore: one context for all.
    assert (REPO / ".containerignore").read_text() == (REPO / ".dockerignore").read_text()


def test_the_repository_context_is_the_wheel_sources_without_build_outputs() -> None:
    files = build_context.context_files(REPO)
    tops = {f.split("/")[0] for f in files}
    assert tops == {
        "pyproject.toml",
        "setup.py",
        "gpukit",
        "plugin",
        "lab",
        "conformance",
        "deploy",
    }
    assert {
        "gpukit/lab",
        "gpukit/plugin",
        "lab/images.py",
        "plugin/cli.py",
        "deploy/python_root.py",
        "plugin/api/deviceplugin_v1beta1.proto",
    } <= set(files)
    assert not [f for f in files if "__pycache__" in f or f.endswith((".pyc", "_pb2.py"))]
    assert not [f for f in files if f.startswith(("tests/", ".venv/", ".git/", "build/"))]


def test_the_content_key_follows_the_context_only(tmp_path: Path) -> None:
    ctx = tmp_path / "ctx"
    for rel in ("pyproject.toml", "gpukit/__init__.py", "tests/test_x.py", "README.md"):
        (ctx / rel).parent.mkdir(parents=True, exist_ok=True)
        (ctx / rel).write_text(rel)
    shutil.copy(REPO / ".containerignore", ctx)
    key = build_context.digest(ctx)
    (ctx / "tests/test_x.py").write_text("changed")
    (ctx / "README.md").write_text("changed")
    (ctx / "gpukit/__pycache__").mkdir()
    (ctx / "gpukit/__pycache__/x.cpython-311.pyc").write_bytes(b"\0")
    assert build_context.digest(ctx) == key
    (ctx / "gpukit/__init__.py").write_text("changed")
    assert build_context.digest(ctx) != key
    key = build_context.digest(ctx)
    (ctx / "gpukit/__init__.py").chmod(0o755)
    assert build_context.digest(ctx) != key


def test_buildah_sees_the_same_context(tmp_path: Path) -> None:
    """The lab's key covers exactly what buildah copies: a context with files on both sides
    of every rule, copied by `COPY . /ctx` onto an empty image (no base, nothing run)."""
    ctx = tmp_path / "ctx"
    names = ["pyproject.toml", "Makefile", "README.md", "gpukit/__init__.py",
             "gpukit/__pycache__/a.cpython-311.pyc", "plugin/api/x.proto", "plugin/api/x_pb2.py",
             "plugin/api/x_pb2_grpc.py", "plugin/api/gen.py", "lab/deep/er/f.py", "lab/f.pyc",
             "conformance/.pytest_cache/v", "deploy/python_root.py", "tests/t.py", ".venv/bin/p",
             ".git/HEAD", "build/x"]  # fmt: skip
    for rel in names:
        (ctx / rel).parent.mkdir(parents=True, exist_ok=True)
        (ctx / rel).write_text(rel)
    (ctx / "gpukit/plugin").symlink_to("../plugin")
    shutil.copy(REPO / ".containerignore", ctx)
    (tmp_path / "Containerfile").write_text("FROM scratch\nCOPY . /ctx/\n")
    store = ["buildah", "--root", str(tmp_path / "root"), "--runroot", str(tmp_path / "run"),
             "--storage-driver", "vfs"]  # fmt: skip
    assert shutil.which("buildah"), "buildah is missing: run lab/scripts/install-deps.sh"
    subprocess.run([*store, "bud", "--isolation", "chroot", "--pull=never", "-q",
                    "-f", str(tmp_path / "Containerfile"), "-t", "ctx-test", str(ctx)],
                   check=True, capture_output=True)  # fmt: skip
    ctr = subprocess.run([*store, "from", "--pull=never", "ctx-test"], check=True,
                         capture_output=True, text=True).stdout.strip()  # fmt: skip
    try:
        mnt = Path(subprocess.run([*store, "mount", ctr], check=True, capture_output=True,
                                  text=True).stdout.strip())  # fmt: skip
        seen = sorted(p.relative_to(mnt / "ctx").as_posix()
                      for p in (mnt / "ctx").rglob("*") if p.is_symlink() or p.is_file())  # fmt: skip
    finally:
        subprocess.run([*store, "rm", ctr], capture_output=True)
        subprocess.run([*store, "rmi", "--all", "--force"], capture_output=True)
    assert seen == build_context.context_files(ctx)
    assert "gpukit/plugin" in seen and "plugin/api/x_pb2.py" not in seen


STATUS = """\
Package: app
Status: install ok installed
Depends: libfoo (>= 1.0), virt | missing, media-types | mime-support

Package: libfoo
Status: install ok installed
Pre-Depends: libc6:any
Depends: dpkg

Package: libc6
Status: install ok installed
Architecture: amd64

Package: dpkg
Status: install ok installed
Essential: yes
Depends: tar

Package: provider
Status: install ok installed
Provides: virt (= 2)

Package: mime-support
Status: install ok installed

Package: media-types
Status: deinstall ok config-files

Package: unrelated
Status: install ok installed
"""


def test_the_runtime_root_takes_what_python_needs_and_no_package_manager() -> None:
    pr = python_root()
    packages = pr.parse_status(STATUS)
    assert "media-types" not in packages  # removed, config files only
    assert pr.closure(packages, ["app"]) == ["app", "libc6", "libfoo", "mime-support", "provider"]
    with pytest.raises(pr.RootError, match="absent is not installed"):
        pr.closure(packages, ["absent"])
    broken = pr.parse_status(STATUS.replace("virt | missing", "missing"))
    with pytest.raises(pr.RootError, match="app depends on missing: none is installed"):
        pr.closure(broken, ["app"])


def test_the_runtime_root_runs_python(tmp_path: Path) -> None:
    """deploy/python_root.py on this (Debian) machine's root: the copy runs python3 with the
    standard library's C modules and TLS, and has no shell."""
    out = tmp_path / "root"
    r = subprocess.run(["python3", str(REPO / "deploy/python_root.py"), str(out)],
                       capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "python3-minimal" in r.stdout and " dpkg " not in r.stdout
    assert not (out / "usr/bin/dash").exists() and not (out / "usr/bin/bash").exists()
    assert (out / "etc/passwd").read_text().splitlines()[0].startswith("root:x:0:0:")
    code = "import ssl, ctypes, sqlite3, lzma, bz2, zlib, uuid, decimal, pwd; print(pwd.getpwuid(0).pw_name)"
    run = subprocess.run(["chroot", str(out), "/usr/bin/python3", "-c", code],
                         capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 0 and run.stdout == "root\n", run.stderr


def test_the_runtime_root_takes_the_libraries_extension_modules_need(tmp_path: Path) -> None:
    """grpcio's extension module links libstdc++, which python3 does not need: a root made
    for python3 alone lacks it and both checks say so; --libraries-for takes it in."""
    import grpc
    import typing_extensions  # grpc's one dependency

    pr = python_root()
    lib = tmp_path / "lib"
    shutil.copytree(Path(grpc.__file__).parent, lib / "grpc", copy_function=os.link)
    shutil.copy(typing_extensions.__file__, lib)
    bare = tmp_path / "bare"
    pr.build(Path("/"), bare, list(pr.DEFAULT_PACKAGES))
    assert "libstdc++.so.6" in pr.missing_libraries(bare, [lib])
    with pytest.raises(pr.RootError, match="libstdc"):
        pr.check_imports(bare, (lib,))
    assert not (bare / lib.relative_to("/")).exists()  # the check's copy is gone again
    full = tmp_path / "full"
    names = pr.build(Path("/"), full, list(pr.DEFAULT_PACKAGES), (lib,))
    assert "libstdc++6" in names
    pr.check_imports(full, (lib,))


def test_the_agent_key_changes_with_the_base_and_the_marker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    done = tmp_path / "rootfs/bookworm/.complete"
    done.parent.mkdir(parents=True)
    done.touch()
    monkeypatch.delenv(images.AGENT_MARKER_ENV, raising=False)
    key = images.agent_key(REPO, tmp_path)
    assert images.agent_key(REPO, tmp_path) == key
    monkeypatch.setenv(images.AGENT_MARKER_ENV, "x")
    assert images.agent_key(REPO, tmp_path) != key
    monkeypatch.delenv(images.AGENT_MARKER_ENV)
    os.utime(done, ns=(1, 1))  # the node root was built again
    assert images.agent_key(REPO, tmp_path) != key
