"""gpukit used outside this repository: the release's collection (gpukit.gpu, built with
ansible-galaxy as `make dist` builds it) and its dependency kubernetes.core, both as tarballs
installed offline with `ansible-galaxy collection install` into a project directory elsewhere;
gpukit's Python package installed from its wheel into a fresh venv that is the controller's
Python; then, from that directory, a play of the project using the collection's roles,
`ansible-playbook gpukit.gpu.site -i <lab inventory>` converging the lab, and the installed
conformance suite (`pytest --pyargs gpukit.conformance`) passing against it.

Nothing of the checkout is on the play's paths: the project has its own ansible.cfg, no
ANSIBLE_* or PYTHON* variable of the caller's is passed on, and Ansible looks for collections
in the project's collections directory only (collections_scan_sys_path off: not the venv's
ansible package). No Galaxy here: the kubernetes.core tarball is built from the copy the venv's
ansible package ships (its MANIFEST.json's collection_info as galaxy.yml, `ansible-galaxy
collection build`); ansible.posix is built the same way for the json stdout callback the test
reads the play with (the test's instrument, not the release's). The controller's venv reaches
the project venv's third-party packages (ansible-core, pytest, kubernetes) through a .pth file
(to save installing them again), but gpukit itself is the wheel's, which the test proves. The
nodes get gpukit from that installed package too (the wheelhouse module re-makes its wheel: no
checkout to build from).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import xml.etree.ElementTree as ET
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import pytest
import yaml
from labplay import BIN, LAB_VARS, REPO, PlayResult, run_playbook

from gpukit.lab import cluster
from gpukit.lab.config import LabSpec, load_spec

pytestmark = pytest.mark.lab

COLLECTION = REPO / "collections/ansible_collections/gpukit/gpu"
ROLES = sorted(p.name for p in (COLLECTION / "roles").iterdir() if p.is_dir())
VENV_SITE = Path(sysconfig.get_paths()["purelib"])  # the project venv's third-party packages
WHEELHOUSE_TASK = "Build gpukit's wheelhouse on the controller"
WHERE_TASK = "Record where the controller's gpukit comes from"
# Collections installed from tarballs of the venv's ansible package's copies: the release's
# dependency (galaxy.yml), and the json stdout callback labplay reads plays with.
SHIPPED = ("kubernetes.core", "ansible.posix")
# ansible-core's commands, as pip would install them: the plays, the collection installs, and
# the suite's host checks (testinfra's ansible backend runs ansible-inventory and ansible).
CONSOLE_SCRIPTS = {"ansible-playbook": "ansible.cli.playbook",
                   "ansible-galaxy": "ansible.cli.galaxy",
                   "ansible-inventory": "ansible.cli.inventory",
                   "ansible": "ansible.cli.adhoc"}

PLAY = """\
---
# A project of its own: gpukit's roles from the installed gpukit.gpu collection.
- name: Check every GPU node's declaration
  ansible.builtin.import_playbook: gpukit.gpu.preflight

- name: GPU nodes with gpukit's roles
  hosts: gpu_nodes
  gather_facts: true
  pre_tasks:
    - name: Record where the controller's gpukit comes from
      ansible.builtin.command:
        argv: ["{{ ansible_playbook_python }}", "-c", "import gpukit; print(gpukit.__file__)"]
      delegate_to: localhost
      run_once: true
      changed_when: false
      check_mode: false
      vars:
        ansible_python_interpreter: "{{ ansible_playbook_python }}"
      tags: [always]
  roles:
    - role: gpukit.gpu.gpukit_node
      tags: [gpukit_node]
    - role: gpukit.gpu.nvidia_driver
      tags: [nvidia_driver]
    - role: gpukit.gpu.node_labels
      tags: [node_labels]
"""

ANSIBLE_CFG = """\
[defaults]
collections_path = ./collections
collections_scan_sys_path = false
interpreter_python = auto_silent
forks = 10
timeout = 30
retry_files_enabled = false

[ssh_connection]
pipelining = true
"""


@dataclass
class Project:
    root: Path
    python: Path  # the controller's interpreter (the fresh venv's)
    wheel: Path  # gpukit's wheel, as `pip wheel` built it
    tarball: Path
    inventory: Path
    env: dict[str, str]
    spec: LabSpec

    def play(self, *args: str, playbook: str = "play.yml") -> PlayResult:
        extra = ("-e", "@lab_vars.yml") if playbook == "play.yml" else ()
        return run_playbook(playbook, self.inventory, *args, *extra, var_files=(), env=self.env,
                            cwd=self.root, timeout=1500, inherit_env=False,
                            command=(str(self.python.parent / "ansible-playbook"),))  # fmt: skip

    def sh(self, node: str, command: str) -> str:
        r = cluster.node_exec(self.spec.node(node), ["sh", "-c", command])
        assert r.returncode == 0, f"{node}: {command}: {r.stderr}"
        return r.stdout


def shipped_collection_tarball(fqcn: str, out: Path, env: dict[str, str]) -> Path:
    """A tarball of the collection FQCN as the venv's ansible package ships it, for an offline
    install (no Galaxy here): its MANIFEST.json's collection_info becomes the galaxy.yml that
    `ansible-galaxy collection build` builds it from (the shipped MANIFEST.json and FILES.json
    are left out: the build writes its own)."""
    namespace, name = fqcn.split(".")
    shipped = VENV_SITE / "ansible_collections" / namespace / name
    info = json.loads((shipped / "MANIFEST.json").read_text())["collection_info"]
    src = out / "src" / fqcn
    shutil.copytree(shipped, src, ignore=shutil.ignore_patterns(
        "MANIFEST.json", "FILES.json", "__pycache__"))  # fmt: skip
    # Empty fields are dropped: ansible-galaxy refuses a license list beside a license_file.
    galaxy = {k: v for k, v in info.items() if v not in (None, "", [], {})}
    (src / "galaxy.yml").write_text(yaml.safe_dump(galaxy, sort_keys=False))
    _run([str(BIN / "ansible-galaxy"), "collection", "build", str(src), "--output-path",
          str(out)], out, env)  # fmt: skip
    return out / f"{namespace}-{name}-{info['version']}.tar.gz"


def _run(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{argv}: {r.stdout[-3000:]}{r.stderr[-3000:]}"
    return r.stdout


@pytest.fixture(scope="module")
def project(lab_cluster: object, tmp_path_factory: pytest.TempPathFactory) -> Project:
    from gpukit.lab.inventory import for_instance
    from gpukit.lab.packages import build_repo

    spec = load_spec()
    build_repo()
    root = tmp_path_factory.mktemp("elsewhere")
    assert not root.resolve().is_relative_to(REPO)
    (root / "ansible.cfg").write_text(ANSIBLE_CFG)
    (root / "play.yml").write_text(PLAY)
    shutil.copytree(for_instance(spec), root / "inventory")
    shutil.copyfile(LAB_VARS, root / "lab_vars.yml")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "PYTHON"))}
    env.update({
        "ANSIBLE_CONFIG": str(root / "ansible.cfg"),
        "ANSIBLE_COLLECTIONS_PATH": str(root / "collections"),
        "ANSIBLE_HOME": str(root / "ansible-home"),
        "ANSIBLE_LOCAL_TEMP": str(root / "ansible-tmp"),
    })
    # gpukit's wheel, installed into a fresh venv (before the .pth that lends it the project
    # venv's third-party packages, so pip does not see this checkout's editable gpukit).
    _run([str(BIN / "pip"), "wheel", "-q", "--no-deps", "-w", str(root / "wheel"), str(REPO)],
         root)  # fmt: skip
    (wheel,) = (root / "wheel").glob("gpukit-*.whl")
    _run([sys.executable, "-m", "venv", "--without-pip", str(root / "controller")], root)
    python = root / "controller/bin/python"
    # (env: no PYTHONPATH of the caller's, where pip would find a gpukit already there)
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
          "--no-index", "--disable-pip-version-check", str(wheel)], root, env)  # fmt: skip
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     root, env).strip())  # fmt: skip
    (site / "project-venv-packages.pth").write_text(f"{VENV_SITE}\n")
    for name, module in CONSOLE_SCRIPTS.items():  # ansible-core's commands, in the fresh venv
        script = python.parent / name
        script.write_text(f"#!{python}\nimport sys\nfrom {module} import main\n"
                          "sys.exit(main())\n")
        script.chmod(0o755)
    env["PATH"] = f"{python.parent}{os.pathsep}/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
    # The release's collection (as `make dist` builds it) and its dependency's tarball,
    # installed offline as another project would.
    galaxy = str(python.parent / "ansible-galaxy")
    _run([galaxy, "collection", "build", str(COLLECTION), "--output-path", str(root / "dist")],
         root, env)  # fmt: skip
    (tarball,) = (root / "dist").glob("gpukit-gpu-*.tar.gz")
    deps = [shipped_collection_tarball(fqcn, root / "deps", env) for fqcn in SHIPPED]
    _run([galaxy, "collection", "install", "--offline", "-p", str(root / "collections"),
          str(tarball), *map(str, deps)], root, env)  # fmt: skip
    return Project(root, python, wheel, tarball, root / "inventory", env, spec)


def _wheel_files(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as whl:
        return {n: whl.read(n) for n in whl.namelist() if not n.endswith(".dist-info/RECORD")}


def test_the_built_collection_carries_roles_plugins_and_runtime(project: Project) -> None:
    with tarfile.open(project.tarball) as tar:
        names = set(tar.getnames())
        member = tar.extractfile("MANIFEST.json")
        assert member is not None
        manifest = json.loads(member.read())
    for role in ROLES:
        assert f"roles/{role}/tasks/main.yml" in names, role
        assert f"roles/{role}/meta/argument_specs.yml" in names, role
    assert set(ROLES) >= {"gpukit_node", "nvidia_driver", "container_toolkit", "gpu_sharing",
                          "node_labels", "device_plugin", "rolling_upgrade"}  # fmt: skip
    for plugin in ("modules/wheelhouse.py", "modules/driver_plan.py", "action/inventory_check.py",
                   "filter/driver.py", "lookup/agent_manifests.py", "callback/play_record.py",
                   "module_utils/gpukit_common.py", "plugin_utils/gpukit_filters.py"):  # fmt: skip
        assert f"plugins/{plugin}" in names, plugin
    # The playbooks ship with the roles (ansible-playbook gpukit.gpu.site), with the dependency
    # their API tasks need.
    assert {"meta/runtime.yml", "README.md", *(f"playbooks/{p}.yml" for p in (
        "preflight", "site", "upgrade", "provision", "sharing", "mig"))} <= names
    assert manifest["collection_info"]["dependencies"] == {"kubernetes.core": ">=6.0.0,<7.0.0"}
    # The project sees the collections it installed from the tarballs, and no others (not
    # the venv's ansible package's): gpukit.gpu and its dependency, as galaxy.yml allows.
    listed = json.loads(_run([str(project.python.parent / "ansible-galaxy"), "collection", "list",
                              "--format", "json"], project.root, project.env))  # fmt: skip
    ours = listed.pop(str(project.root / "collections/ansible_collections"))
    assert {k: v["version"] for k, v in ours.items()} == {
        "gpukit.gpu": manifest["collection_info"]["version"], "ansible.posix": ANY,
        "kubernetes.core": ANY}, ours
    assert ours["kubernetes.core"]["version"].startswith("6."), ours
    # (ansible-core's own internal collection aside)
    assert all(name.startswith("ansible._") for c in listed.values() for name in c), listed


def test_the_controllers_gpukit_is_the_wheels(project: Project) -> None:
    probe = ("import gpukit, json, sys, importlib.metadata as m; d = m.distribution('gpukit'); "
             "print(json.dumps({'file': gpukit.__file__, 'path': sys.path, "
             "'url': json.loads(d.read_text('direct_url.json'))['url'], "
             "'editable': [n for n in sys.modules if 'editable' in n]}))")  # fmt: skip
    seen = json.loads(_run([str(project.python), "-c", probe], project.root, project.env))
    assert seen["file"] == str(project.root / "controller/lib/python3.11/site-packages/gpukit/__init__.py")
    assert seen["url"] == project.wheel.as_uri() and not seen["editable"]
    # The checkout is on no path but the project venv's third-party packages.
    # (the project venv is the checkout's .venv, or one elsewhere)
    inside = [p for p in seen["path"] if (project.root / p).resolve().is_relative_to(REPO)]
    assert str(VENV_SITE) in seen["path"] and set(inside) <= {str(VENV_SITE)}, seen["path"]


def test_a_play_in_another_project_uses_the_collections_roles(project: Project) -> None:
    hosts = project.spec.node_names()
    for host in hosts:  # whatever an earlier test left: the venv is made here
        project.sh(host, "rm -rf /opt/gpukit")
    # Real run: gpukit's venv on the nodes (from the installed package's wheel), node labels.
    r = project.play("--tags", "gpukit_node,node_labels")
    assert r.rc == 0 and not r.failed, r.describe()
    where = next(res[WHERE_TASK] for res in r.results.values() if WHERE_TASK in res)
    assert where["stdout"].startswith(str(project.root / "controller/lib/"))
    wh = r.results[hosts[0]][WHEELHOUSE_TASK]
    assert wh["project_wheel"] == project.wheel.name
    with tarfile.open(wh["archive"]) as tar:
        member = tar.extractfile(wh["project_wheel"])
        assert member is not None
        remade = Path(project.root / "remade.whl")
        remade.write_bytes(member.read())
    # The wheel re-made from the installed package carries exactly the wheel's files.
    assert _wheel_files(remade) == _wheel_files(project.wheel)
    source = _wheel_files(project.wheel)["gpukit/inventory/__init__.py"]
    for host in hosts:
        assert {"Create the venv", "Install gpukit and its dependencies into the venv"} <= set(
            r.changed.get(host, [])), r.changed
        assert project.sh(host, "cat /opt/gpukit/.gpukit-wheelhouse").strip() == wh["key"]
        on_node = project.sh(host, "cd / && /opt/gpukit/bin/python -c 'import gpukit.inventory, "
                                   "sys; sys.stdout.write(open(gpukit.inventory.__file__).read())'")
        assert on_node == source.decode()
    # Again: nothing changes (the re-made wheel, and so the wheelhouse, is reproducible).
    again = project.play("--tags", "gpukit_node,node_labels")
    assert again.rc == 0 and not again.failed and again.changed == {}, again.describe()

    # Check mode, the driver role too, against another branch: changes are reported,
    # nothing on the node changes.
    def state(host: str) -> str:
        return project.sh(host, "dpkg-query -W -f='${Package} ${Version} ${Status}\\n' "
                                "'nvidia-*' 2>/dev/null; ls /etc/apt/preferences.d "
                                "/etc/apt/sources.list.d /opt/gpukit; true")  # fmt: skip

    # The lab's nodes keep their roots between runs: a branch other than the one a node may
    # already be pinned to (an earlier run's upgrade), so that there is a change to report.
    pins = {h: project.sh(h, "cat /etc/apt/preferences.d/gpukit-nvidia-driver 2>/dev/null; true")
            for h in hosts}  # fmt: skip
    branch = "550" if any("570." in pin for pin in pins.values()) else "570"
    before = {h: state(h) for h in hosts}
    check = project.play("--check", "--diff", "-e", f"nvidia_driver_branch={branch}")
    assert check.rc == 0 and not check.failed, check.describe()
    for host in hosts:
        changed = check.changed.get(host, [])
        assert "Pin the driver branch" in changed, check.changed
        assert "Install gpukit and its dependencies into the venv" not in changed
        shown = "Show the driver packages to install from the repository check mode would add"
        if "gpukit-nvidia.sources" in before[host]:  # apt sees the repository: it plans
            assert "Install the driver packages" in changed, check.changed
        else:  # a fresh node: check mode has not added the repository, the plan names them
            assert shown in changed, check.changed
            assert f"nvidia-driver-{branch}" in json.dumps(check.results[host][shown]["msg"])
        assert state(host) == before[host]


@pytest.mark.timeout(1800)  # a whole site.yml from the earlier tests' state: minutes, under load
def test_the_installed_site_playbook_converges_the_lab(project: Project) -> None:
    """`ansible-playbook gpukit.gpu.site -i <lab inventory>` from the project directory: the
    collection's own playbook, its roles' Python from the wheel, kubernetes.core from its
    tarball; every role runs on every node and nothing fails."""
    r = project.play(playbook="gpukit.gpu.site")
    assert r.rc == 0 and not r.failed, r.describe()
    hosts = project.spec.node_names()
    assert set(r.stats) >= set(hosts), r.stats
    for host in hosts:
        assert r.stats[host].get("unreachable", 0) == 0 and r.stats[host]["failures"] == 0
        ran = set(r.results[host])
        assert {"Install gpukit and its dependencies into the venv", "Pin the driver branch",
                "Apply the node's MIG layout"} <= ran, sorted(ran)  # fmt: skip
    # The cluster-wide objects: run_once, on the first host.
    assert any("Apply the device plugin's objects" in res for res in r.results.values())
    print(f"\ngpukit.gpu.site from the installed collection: {r.seconds:.0f} s")


@pytest.mark.timeout(1800)
def test_the_installed_suite_passes_against_the_lab(project: Project) -> None:
    """`pytest --pyargs gpukit.conformance --inventory <lab inventory>` with the fresh venv's
    Python: the suite of the wheel (no gpukit.lab there), the lab's settings (host network,
    its local images) following from the inventory's lab kubeconfig."""
    # --lab needs gpukit.lab (a checkout's): the usage error names what to give instead.
    pytest_cmd = [str(project.python), "-m", "pytest", "--pyargs", "gpukit.conformance", "-q",
                  "-p", "no:cacheprovider"]  # fmt: skip
    lab = subprocess.run([*pytest_cmd, "--lab"], cwd=project.root, env=project.env,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    hint = re.search(r"--inventory (\S+) \(the lab's kubeconfig", lab.stderr)
    assert lab.returncode == 4 and hint is not None, lab.stdout + lab.stderr
    assert hint.group(1) == str(cluster.state_dir() / "inventory")
    junit = project.root / "conformance.xml"
    argv = [*pytest_cmd, "--inventory", hint.group(1), f"--junitxml={junit}",
            "--rootdir", str(project.root)]  # (not the inventory's directory)
    r = subprocess.run(argv, cwd=project.root, env=project.env, capture_output=True, text=True,
                       timeout=1700)  # fmt: skip
    assert r.returncode == 0, f"{r.stdout[-6000:]}{r.stderr[-2000:]}"
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None
    counts = {k: int(suite.get(k, "0")) for k in ("tests", "failures", "errors", "skipped")}
    assert counts["failures"] == counts["errors"] == 0, counts
    assert counts["tests"] - counts["skipped"] >= 20, counts  # the areas ran, not skipped
    # --pyargs found the installed package's suite, not the checkout's.
    installed = project.python.parent.parent / "lib/python3.11/site-packages/gpukit/conformance"
    where = _run([str(project.python), "-c", "import gpukit.conformance as c; print(c.__file__)"],
                 project.root, project.env)  # fmt: skip
    assert Path(where.strip()).parent == installed, where
    print(f"\ninstalled suite on the lab: {counts}")


AGENT_LABEL = "app.kubernetes.io/name=gpukit-node-agent"


def release_script() -> Any:
    """deploy/release.py (run by path, as make dist does)."""
    spec = importlib.util.spec_from_file_location("release", REPO / "deploy/release.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _agent_pods(kubeconfig: str) -> list[dict[str, Any]]:
    out = subprocess.run(
        [str(cluster.kubernetes_bindir(load_spec()) / "kubectl"), "--kubeconfig", kubeconfig,
         "-n", "gpukit-system", "get", "pods", "-l", AGENT_LABEL, "-o", "json"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    return [p for p in json.loads(out)["items"] if not p["metadata"].get("deletionTimestamp")]


@pytest.mark.timeout(1200)
def test_the_agent_is_deployed_by_digest_from_the_lab_registry(project: Project) -> None:
    """The agent image pushed to the lab's registry (plain HTTP, gpukit.lab.registry), the
    device_plugin role given it by `@sha256:` digest: the DaemonSet names exactly that, each
    node's containerd pulls it from the registry (its hosts.toml), and every agent pod runs
    that digest (status imageID). A malformed reference is refused before any host changes."""
    from gpukit.lab import images, registry
    from gpukit.lab.controlplane import paths

    kubeconfig = str(paths().admin_kubeconfig)
    bad = project.play("-e", "gpukit_device_plugin_image=10.0.0.1:5000/Agent@sha256:12",
                       "--tags", "device_plugin", playbook="gpukit.gpu.site")  # fmt: skip
    assert bad.rc != 0 and bad.stats and all(s.get("changed", 0) == 0
                                             for s in bad.stats.values()), bad.describe()
    line = ("gpukit_device_plugin_image: '10.0.0.1:5000/Agent@sha256:12' is not an image "
            "reference")  # fmt: skip
    assert line in json.dumps(bad.failed), bad.describe()

    built = cluster.state_dir() / "shared/images"  # the agent image lab up built and imported
    assert images.agent_record(built), "the lab's agent image was not built"
    log = cluster.state_dir() / "logs/registry.log"
    seen = log.stat().st_size if log.exists() else 0
    # As a release ships it (make dist: an OCI archive, its digest printed by release.py),
    # copied to the registry as it is: the registry serves it under the printed digest.
    oci = project.root / "gpukit-node-agent-lab.oci.tar"
    _run(["skopeo", "copy", "--quiet", f"docker-archive:{built / 'node-agent.tar'}",
          f"oci-archive:{oci}:gpukit-node-agent:lab"], project.root)  # fmt: skip
    ref = registry.push(project.spec, f"oci-archive:{oci}", "gpukit-node-agent:lab")
    digest = ref.rsplit("@", 1)[1]
    assert digest == release_script().image_digest(oci)
    assert ref == f"{registry.address(project.spec)}/gpukit-node-agent@{digest}"
    hosts = project.spec.node_names()
    for host in hosts:  # nothing of that name on the nodes yet: the pull is the registry's
        project.sh(host, f"ctr -n k8s.io images rm {ref} >/dev/null 2>&1; true")
    try:
        r = project.play("-e", f"gpukit_device_plugin_image={ref}", "-e",
                         "gpukit_device_plugin_image_pull_policy=IfNotPresent", "--tags",
                         "device_plugin", playbook="gpukit.gpu.site")  # fmt: skip
        assert r.rc == 0 and not r.failed, r.describe()
        pods = _agent_pods(kubeconfig)
        assert {p["spec"]["nodeName"] for p in pods} == set(hosts), pods
        for pod in pods:
            assert {c["image"] for c in pod["spec"]["containers"]} == {ref}
            statuses = pod["status"]["containerStatuses"]
            assert all(s["ready"] and s["imageID"].endswith(f"@{digest}") for s in statuses), (
                statuses)
        for host in hosts:  # pulled from the registry by its containerd
            listed = project.sh(host, "ctr -n k8s.io images ls -q")
            assert ref in listed.split(), listed
        with log.open() as f:  # the registry's access log since the push: the nodes' pulls
            f.seek(seen)
            pulls = f.read().count(f"GET /v2/gpukit-node-agent/manifests/{digest}")
        assert pulls >= len(hosts), pulls
        print(f"\nagent by digest from the lab registry: {ref}")
    finally:  # the lab's own image again, for whatever runs on this lab next
        back = project.play("--tags", "device_plugin", playbook="gpukit.gpu.site")
        assert back.rc == 0 and not back.failed, back.describe()
