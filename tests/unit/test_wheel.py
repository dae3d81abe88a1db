"""`pip install gpukit` from its wheel: every command runs from the installed package alone.

The wheel is built from a copy of the sources without the generated gRPC stubs (its build must
make them), installed into fresh virtual environments, and run from a directory outside the
checkout. Third-party packages come from this project's environment, but only those the wheel
declares (its dependencies, plus the [conformance] extra's in the second environment, each
with their own dependencies): grpcio-tools, mypy, ruff, ansible-lint and hypothesis are not
there, so a command that needed them would fail here.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from stopping import killed_at_exit, terminate

from gpukit import __version__
from gpukit.plugin.api import generate

REPO = Path(__file__).resolve().parents[2]
STUBS = [f"gpukit/plugin/api/{n}" for p in generate.PROTOS for n in generate.stub_names(p)]
DEV_ONLY = ("grpc_tools", "mypy", "ruff", "ansiblelint", "hypothesis")
CONFORMANCE_ONLY = ("pytest", "testinfra", "pytest_kubernetes", "pytest_timeout", "ansible")
TIME_SLICED = {"version": "v1", "sharing": {"timeSlicing": {"resources": [
    {"name": "nvidia.com/gpu", "replicas": 4}]}}}
MIG_CONFIGS = {"version": "v1", "mig-configs": {"mixed-a100": [
    {"devices": [0, 1], "mig-enabled": True,
     "mig-devices": {"3g.20gb": 1, "2g.10gb": 1, "1g.5gb": 2}},
    {"devices": [2, 3, 4, 5, 6, 7], "mig-enabled": False}]}}  # fmt: skip


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"
    shutil.copytree(REPO / "gpukit", src / "gpukit", ignore=shutil.ignore_patterns(
        "__pycache__", "*.pyc", "*_pb2.py", "*_pb2_grpc.py", ".gen-*"))  # symlinks followed
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copyfile(REPO / name, src / name)
    assert not list(src.rglob("*_pb2*.py"))
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                        "--no-build-isolation", "-w", str(work / "dist"), str(src)],
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    (whl,) = (work / "dist").glob("gpukit-*.whl")
    return whl


def _closure(requirements: Iterable[str], extras: set[str]) -> dict[str, metadata.Distribution]:
    """The installed distributions `requirements` need (with gpukit's `extras`), recursively."""
    found: dict[str, metadata.Distribution] = {}
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [(Requirement(r), {"", *extras}) for r in requirements]
    while todo:
        req, active = todo.pop()
        if req.marker and not any(req.marker.evaluate({"extra": e}) for e in active):
            continue
        key = (canonicalize_name(req.name), frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        dist = metadata.distribution(req.name)
        assert req.specifier.contains(dist.version, prereleases=True), (str(req), dist.version)
        found[key[0]] = dist
        todo += [(Requirement(r), {"", *req.extras}) for r in dist.requires or []]
    return found


@dataclass
class Env:
    root: Path
    cwd: Path

    def run(self, *argv: str, env: dict[str, str] | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
        clean = {"PATH": f"{self.root / 'bin'}:/usr/bin:/bin", "HOME": str(self.cwd),
                 "LANG": "C.UTF-8", "GPUKIT_LAST_GOOD_CONFIG": ""}  # fmt: skip
        exe = argv[0] if argv[0] != "python" else str(self.root / "bin" / "python")
        if not exe.startswith("/"):
            exe = str(self.root / "bin" / exe)
        return subprocess.run([exe, *argv[1:]], cwd=self.cwd, capture_output=True, text=True,
                              timeout=timeout, env={**clean, **(env or {})})  # fmt: skip

    def ok(self, *argv: str, **kw: Any) -> str:
        r = self.run(*argv, **kw)
        assert r.returncode == 0, (argv, r.stdout[-3000:], r.stderr[-3000:])
        return r.stdout


def make_env(base: Path, wheel: Path, extras: set[str]) -> Env:
    root = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True,
                   timeout=120)  # fmt: skip
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(root / "bin" / "python"),
                        "install", "-q", "--no-deps", "--no-index", str(wheel)],
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    (site,) = (root / "lib").glob("python3*/site-packages")
    installed = metadata.PathDistribution(next(site.glob("gpukit-*.dist-info")))
    # Only the distributions the wheel declares, linked into one directory on sys.path.
    deps = base / "deps"
    deps.mkdir()
    for dist in _closure(installed.requires or [], extras).values():
        for top in {f.parts[0] for f in dist.files or [] if f.parts[0] not in ("..", "bin")}:
            if top != "__pycache__" and not (deps / top).exists():
                (deps / top).symlink_to(dist.locate_file(top))
    (site / "_gpukit_test_deps.pth").write_text(f"{deps}\n")
    cwd = base / "elsewhere"
    cwd.mkdir()
    return Env(root, cwd)


@pytest.fixture(scope="module")
def base_env(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Env:
    return make_env(tmp_path_factory.mktemp("base"), wheel, set())


@pytest.fixture(scope="module")
def conformance_env(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Env:
    return make_env(tmp_path_factory.mktemp("conformance"), wheel, {"conformance"})


def test_the_wheel_carries_the_stubs_its_dependencies_can_run(wheel: Path,
                                                              tmp_path: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        assert set(STUBS) <= names, sorted(n for n in names if "/api/" in n)
        z.extractall(tmp_path, members=STUBS)
        meta = z.read(f"gpukit-{__version__}.dist-info/METADATA").decode()
    floors = {}
    for line in meta.splitlines():
        if line.startswith("Requires-Dist:") and "extra ==" not in line:
            req = Requirement(line.removeprefix("Requires-Dist:").strip())
            floors[canonicalize_name(req.name)] = req.specifier
    needs = generate.runtime_requirements(tmp_path / "gpukit/plugin/api")
    assert set(needs) == {"protobuf", "grpcio"}
    for name, version in needs.items():
        oldest_allowed = min(s.version for s in floors[name] if s.operator == ">=")
        assert tuple(int(x) for x in oldest_allowed.split(".")) >= version, (name, floors)


def test_the_wheel_leaves_the_lab_out(wheel: Path) -> None:
    """The lab runs from a checkout: no gpukit.lab module, no mock NVML C source in the wheel,
    while the package's data the product reads is there."""
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    assert not [n for n in names if n.startswith("gpukit/lab/")], names
    assert not [n for n in names if n.endswith((".c", ".h"))], names
    assert {"gpukit/contracts/mig_profiles.yaml", "gpukit/plugin/api/podresources_v1.proto",
            "gpukit/conformance/deploy/job.yaml", "gpukit/conformance/plugin.py",
            "gpukit/monitoring/gpu-alerts.rules.yaml",
            "gpukit/monitoring/gpu-dashboard.json"} <= set(names)


def test_the_nodes_wheel_is_built_from_the_wheels_files(wheel: Path) -> None:
    """The wheelhouse keys the nodes' wheel on exactly the files the wheel holds: a change to
    the lab re-provisions no node."""
    from gpukit.provision import wheelhouse

    sources = {rel for rel, _ in wheelhouse.source_files(REPO) if "_pb2" not in rel}
    with zipfile.ZipFile(wheel) as z:
        names = {n for n in z.namelist() if ".dist-info/" not in n and n not in STUBS}
    assert sources == names, (sorted(sources - names), sorted(names - sources))


def test_the_installed_commands_run_without_the_checkout(base_env: Env, tmp_path: Path) -> None:
    env = base_env
    where = env.ok("python", "-c", "import gpukit, gpukit.plugin.api as a; a.deviceplugin_grpc;"
                   " a.podresources_grpc; print(gpukit.__file__)").strip()  # fmt: skip
    assert where.startswith(str(env.root)) and not where.startswith(str(REPO)), where
    for module in (*DEV_ONLY, *CONFORMANCE_ONLY):
        r = env.run("python", "-c", f"import {module}")
        assert r.returncode == 1 and "ModuleNotFoundError" in r.stderr, (module, r.stderr)
    for argv in (["gpukit"], ["python", "-m", "gpukit"], ["gpukit-device-plugin"],
                 ["python", "-m", "gpukit.plugin"], ["python", "-m", "gpukit.plugin.mig"],
                 ["python", "-m", "gpukit.summary"], ["gpukit", "plugin"], ["gpukit", "mig"],
                 ["gpukit", "summary"]):  # fmt: skip
        assert env.ok(*argv, "--version").strip().endswith(f" {__version__}"), argv
    # The device plugin's config check, through both commands.
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump(TIME_SLICED))
    checked = env.ok("gpukit-device-plugin", "--check-config", "--config-file", str(cfg))
    assert json.loads(checked)["time_slicing"]["resources"][0]["replicas"] == 4
    assert env.ok("gpukit", "plugin", "--check-config", "--config-file", str(cfg)) == checked
    # Reading an inventory needs ansible-core, and the report the suite's parts: the extra's.
    for argv in (["inventory", "check", str(REPO / "inventories" / "lab")],
                 ["manifests", "-i", str(REPO / "inventories" / "lab")],
                 ["report", str(tmp_path / "junit.xml"), "-o", str(tmp_path / "r.html")]):
        r = env.run("gpukit", *argv)
        assert r.returncode == 2 and "pip install 'gpukit[conformance]'" in r.stderr, r.stderr
    # The lab is not in the wheel: its commands say so (no traceback); its help still shows.
    assert env.run("python", "-c", "import gpukit.lab").returncode == 1
    for argv in (["lab", "status"], ["lab", "up"], ["lab", "down", "--purge"]):
        r = env.run("gpukit", *argv)
        assert r.returncode == 2 and "gpukit's lab is not installed" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr and "checkout" in r.stderr, r.stderr
    assert "status" in env.ok("gpukit", "lab", "--help")


@pytest.mark.nvml
def test_the_installed_plugin_and_mig_manager_run_on_the_stand_in_driver(
        base_env: Env, tmp_path: Path, short_tmp: Path) -> None:
    sys.path.insert(0, str(REPO / "tests" / "plugin"))
    from plugin_testlib import FakeKubelet

    from gpukit.lab import nvml as mock

    lib = mock.build()
    a100 = mock.env("a100-sxm4-40gb-x8", tmp_path / "a100", library=lib, base={})
    layouts = tmp_path / "mig.yaml"
    layouts.write_text(yaml.safe_dump(MIG_CONFIGS))
    plan = ["plan", "--config-file", str(layouts), "--selected", "mixed-a100", "--json"]
    doc = json.loads(base_env.ok("python", "-m", "gpukit.plugin.mig", *plan, env=a100))
    assert doc["changed"] is True and doc["reset_required"] == [0, 1]
    assert json.loads(base_env.ok("gpukit", "mig", *plan, env=a100)) == doc
    # Applying needs GPU resets (MIG mode on GPUs 0 and 1): the wheel's MIG manager resets the
    # mock through the library it loaded, with no lab installed.
    applied = json.loads(base_env.ok("gpukit", "mig", "apply", *plan[1:], "--pause-file", "",
                                     env=a100))
    assert applied["changed"] is True and applied["executed"], applied
    again = json.loads(base_env.ok("python", "-m", "gpukit.plugin.mig", *plan, env=a100))
    assert again["changed"] is False, again
    # The device plugin registers with a stand-in kubelet through the packaged stubs.
    t4 = mock.env("t4-x2", tmp_path / "t4", library=lib, base={})
    kubelet = FakeKubelet(short_tmp)
    kubelet.start()
    bin_ = base_env.root / "bin"
    proc = subprocess.Popen(
        [str(bin_ / "gpukit"), "plugin", "--nvml-library", str(lib), "--kubelet-dir",
         str(short_tmp), "--metrics-address", "", "--pause-file", "", "--last-good-config", ""],
        cwd=base_env.cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**t4, "PATH": f"{bin_}:/usr/bin:/bin"})  # fmt: skip
    try:
        with killed_at_exit(proc):
            request = kubelet.next_request(timeout=60)
            assert request.resource_name == "nvidia.com/gpu" and request.version == "v1beta1"
            out = terminate(proc, timeout=30)
    finally:
        kubelet.stop()
    assert proc.returncode == 0, out


def test_the_conformance_extra_runs_the_suite_without_dev_tools(conformance_env: Env) -> None:
    env = conformance_env
    for module in DEV_ONLY:
        r = env.run("python", "-c", f"import {module}")
        assert r.returncode == 1 and "ModuleNotFoundError" in r.stderr, (module, r.stderr)
    helped = env.ok("python", "-m", "pytest", "-p", "gpukit_conformance", "--help")
    assert "gpukit conformance:" in helped and "--inventory=INVENTORY" in helped
    lab = str(REPO / "inventories" / "lab")
    collected = env.ok("python", "-m", "pytest", "-p", "no:cacheprovider", "--pyargs",
                       "gpukit.conformance", "--inventory", lab, "--collect-only", "-q")
    ids = [ln for ln in collected.splitlines() if "::" in ln]
    assert "test_devices_are_disjoint[gpu-a100-mig-1g.5gb]" in " ".join(ids), collected
    # --lab needs the lab, which the wheel leaves out: a usage error that says so.
    r = env.run("python", "-m", "pytest", "-p", "no:cacheprovider", "--pyargs",
                "gpukit.conformance", "--lab", "--collect-only", "-q")
    assert r.returncode == 4, (r.stdout[-2000:], r.stderr[-2000:])
    assert "--lab: gpukit's lab is not installed" in r.stderr and "Traceback" not in r.stderr
    suite = env.ok("python", "-c", "import gpukit.conformance.plugin as p; print(p.SUITE_DIR)")
    assert suite.startswith(str(env.root)), suite
    assert "every declaration valid" in env.ok("gpukit", "inventory", "check", lab)
    from gpukit import manifests

    printed = env.ok("gpukit", "manifests", "--inventory", lab)
    assert list(yaml.safe_load_all(printed)) == manifests.for_inventory(lab)


def test_an_install_without_stubs_says_so_and_writes_nothing(base_env: Env,
                                                             tmp_path: Path) -> None:
    """Only a checkout generates missing stubs; an installed copy names the problem."""
    (site,) = (base_env.root / "lib").glob("python3*/site-packages")
    shutil.copytree(site / "gpukit", tmp_path / "gpukit")
    api_dir = tmp_path / "gpukit" / "plugin" / "api"
    for stub in api_dir.glob("*_pb2*.py"):
        stub.unlink()
    r = base_env.run("python", "-c", "import gpukit.plugin.api as a; a.deviceplugin_pb2",
                     env={"PYTHONPATH": str(tmp_path)})  # fmt: skip
    assert r.returncode == 1, r.stderr
    assert f"kubelet API stubs are missing in {api_dir}" in r.stderr, r.stderr
    assert "reinstall it from a wheel" in r.stderr
    assert not list(api_dir.glob("*_pb2*.py"))
