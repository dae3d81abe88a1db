"""The node agent's image build, short of building it (the lab test builds it once,
tests/lab/test_agent_image.py): the build context the lab keys the image on is the one
buildah reads and holds the agent alone, gpukit's part of the image is the agent's (no lab,
no conformance suite, no controller library), its dependencies are the ones the agent
imports, and the runtime root (deploy/python_root.py) runs python3."""

from __future__ import annotations

import ast
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from importlib import metadata
from pathlib import Path
from types import ModuleType

import pytest
from packaging.utils import canonicalize_name

from gpukit.lab import build_context, images
from gpukit.plugin.api import generate

REPO = Path(__file__).resolve().parents[2]
# What gpukit's part of the image must not hold: the lab, the conformance suite, the
# controller's library and command line.
NOT_THE_AGENTS = ("gpukit/lab", "gpukit/conformance", "gpukit/provision", "gpukit/inventory",
                  "gpukit/cli.py", "gpukit/agent_manifests.py")  # fmt: skip


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def python_root() -> ModuleType:
    return _load(REPO / "deploy/python_root.py")


@pytest.mark.parametrize(
    ("pattern", "path", "hit"),
    [
        ("*", "a", True), ("*", "a/b", True),  # through its parent
        ("*.py", "x.py", True), ("*.py", "d/x.py", False),
        ("**/*.pyc", "x.pyc", True), ("**/*.pyc", "a/b/x.pyc", True),
        ("**/__pycache__", "a/__pycache__/m.pyc", True),
        ("gpukit/plugin/api/*_pb2.py", "gpukit/plugin/api/x_pb2.py", True),
        ("gpukit/plugin/api/*_pb2.py", "gpukit/plugin/api/x_pb2_grpc.py", False),
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


def test_the_repository_context_is_the_agents_sources_without_build_outputs() -> None:
    files = build_context.context_files(REPO)
    tops = {f.split("/")[0] for f in files}
    assert tops == {"pyproject.toml", "setup.py", "gpukit", "deploy"}
    assert {
        "gpukit/__init__.py",
        "gpukit/contracts/mig_profiles.yaml",
        "gpukit/plugin/cli.py",
        "deploy/python_root.py",
        "deploy/agent_requirements.py",
        "gpukit/plugin/api/deviceplugin_v1beta1.proto",
    } <= set(files)
    assert not [f for f in files if f.startswith(NOT_THE_AGENTS)]
    assert not [f for f in files if "__pycache__" in f or f.endswith((".pyc", "_pb2.py"))]
    assert not [f for f in files if f.startswith(("gpukit/lab/", "gpukit/conformance/", "tests/", ".venv/",
                                                  ".git/", "build/"))]  # fmt: skip


def test_the_context_holds_every_part_of_gpukit_the_agent_may_import() -> None:
    """The import-direction test bounds what gpukit.plugin imports; the context must hold all
    of it, or the image's agent would fail on an import."""
    allowed = _load(REPO / "tests/unit/test_import_direction.py").ALLOWED["gpukit.plugin"]
    files = set(build_context.context_files(REPO))
    assert "gpukit/__init__.py" in files
    held = 0
    for part in sorted(allowed - {"gpukit"}):
        folder = REPO / part.replace(".", "/")
        module = folder.with_suffix(".py")
        sources = [module] if module.is_file() else [
            p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
        wanted = [s.relative_to(REPO).as_posix() for s in sources]
        assert not [w for w in wanted if w not in files], (part, wanted)
        held += len(wanted)
    assert held, allowed  # a part allowed but not (yet) in the tree has nothing to hold


def _imported(paths: list[Path]) -> set[str]:
    """Every module the files import that is neither gpukit's nor the standard library's."""
    found = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            else:
                continue
            found |= {n for n in names if n.split(".")[0] not in {"gpukit", *sys.stdlib_module_names}}
    return found


def _distribution(module: str) -> str:
    top = module.split(".")[0]
    candidates = metadata.packages_distributions().get(top, [])
    if len(candidates) > 1:  # a namespace (google): the one that holds the module
        prefix = "/".join(module.split(".")[:2])
        candidates = [c for c in candidates
                      if any(str(f).startswith(prefix) for f in metadata.files(c) or ())]  # fmt: skip
    assert len(candidates) == 1, (module, candidates)
    return canonicalize_name(candidates[0])


def test_the_agent_image_installs_the_dependencies_the_agent_imports(tmp_path: Path) -> None:
    """[tool.gpukit] agent-dependencies is exactly the distributions the agent's sources (its
    context's modules, lazy imports too) and its generated gRPC stubs import: no command-line
    or controller dependency (typer, cryptography) in the image, none the agent needs left out."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    agent = _load(REPO / "deploy/agent_requirements.py")
    requirements = agent.agent_requirements(pyproject)
    listed = {canonicalize_name(n) for n in pyproject["tool"]["gpukit"]["agent-dependencies"]}
    assert {canonicalize_name(agent._name(r)) for r in requirements} == listed
    # The package's modules; the stubs' generator runs in the wheel's build (setup.py, with
    # grpcio-tools: build requirements).
    sources = [REPO / f for f in build_context.context_files(REPO)
               if f.startswith("gpukit/") and f.endswith(".py")
               and f != "gpukit/plugin/api/generate.py"]  # fmt: skip
    stubs = generate.generate(tmp_path / "api")
    assert {_distribution(m) for m in _imported(sources + stubs)} == listed
    assert not {"typer", "cryptography", "tomlkit"} & listed
    # A name that is not a declared dependency is refused, by name.
    broken = {**pyproject, "tool": {"gpukit": {"agent-dependencies": ["grpcio", "nonesuch"]}}}
    with pytest.raises(agent.RequirementsError, match="'nonesuch' is not one of"):
        agent.agent_requirements(broken)


def test_the_images_gpukit_is_the_agent_without_the_lab(tmp_path: Path) -> None:
    """The app stage, short of buildah: gpukit's wheel built from the build context and
    installed with --target, as the Containerfile does. Its tree holds the agent, not the lab,
    the conformance suite or the controller's library, and the agent imports from it."""
    ctx = tmp_path / "ctx"
    build_context.copy_files(REPO, build_context.context_files(REPO), ctx)
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "w"),
                    str(ctx)], check=True, capture_output=True, timeout=300)  # fmt: skip
    app = tmp_path / "app"
    (wheel,) = (tmp_path / "w").glob("gpukit-*.whl")
    subprocess.run([*pip, "install", "--no-deps", "--no-compile", "--target", str(app),
                    str(wheel)], check=True, capture_output=True, timeout=300)  # fmt: skip
    files = {p.relative_to(app).as_posix() for p in app.rglob("*") if p.is_file()}
    assert {"gpukit/__init__.py", "gpukit/plugin/cli.py", "gpukit/contracts/mig_profiles.yaml",
            "gpukit/plugin/api/deviceplugin_v1beta1_pb2.py"} <= files  # fmt: skip
    assert not [f for f in files if f.startswith(NOT_THE_AGENTS)], sorted(files)
    assert not [f for f in files if f.endswith((".c", ".h"))]
    # The agent's modules import from that tree alone (-S: no editable install of the
    # checkout; the dependencies from this environment's site-packages).
    site = sysconfig.get_paths()["purelib"]
    code = ("import gpukit, gpukit.plugin.cli, gpukit.plugin.api as a; a.deviceplugin_grpc;"
            " a.podresources_grpc; print(gpukit.__file__)")
    r = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True,
                       env={"PYTHONPATH": f"{app}:{site}", "PYTHONDONTWRITEBYTECODE": "1"},
                       cwd=tmp_path, timeout=120)  # fmt: skip
    assert r.returncode == 0 and r.stdout.strip() == str(app / "gpukit/__init__.py"), r.stderr


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
    names = ["pyproject.toml", "Makefile", "README.md", "gpukit/__init__.py", "gpukit/cli.py",
             "gpukit/__pycache__/a.cpython-311.pyc", "gpukit/contracts/c.py",
             "gpukit/contracts/__pycache__/c.cpython-311.pyc", "gpukit/provision/p.py",
             "gpukit/plugin/api/x.proto", "gpukit/plugin/api/x_pb2.py", "gpukit/plugin/api/x_pb2_grpc.py",
             "gpukit/plugin/api/gen.py", "gpukit/plugin/.pytest_cache/v", "gpukit/lab/deep/er/f.py", "gpukit/lab/f.pyc",
             "gpukit/conformance/c.py", "deploy/python_root.py", "tests/t.py", ".venv/bin/p",
             ".git/HEAD", "build/x"]  # fmt: skip
    for rel in names:
        (ctx / rel).parent.mkdir(parents=True, exist_ok=True)
        (ctx / rel).write_text(rel)
    shutil.copy(REPO / ".containerignore", ctx)
    (tmp_path / "Containerfile").write_text("FROM scratch\nCOPY . /ctx/\n")
    store = ["buildah", "--root", str(tmp_path / "root"), "--runroot", str(tmp_path / "run"),
             "--storage-driver", "vfs"]  # fmt: skip
    assert shutil.which("buildah"), "buildah is missing: run gpukit/lab/scripts/install-deps.sh"
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
    assert {"gpukit/plugin/api/x.proto", "gpukit/plugin/api/gen.py", "gpukit/__init__.py",
            "gpukit/contracts/c.py"} <= set(seen)
    assert not {"gpukit/plugin/api/x_pb2.py", "gpukit/cli.py", "gpukit/lab/deep/er/f.py",
                "gpukit/lab/f.pyc", "gpukit/conformance/c.py", "gpukit/provision/p.py"} & set(seen)  # fmt: skip


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
