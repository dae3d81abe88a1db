"""gpukit used outside this repository: the gpukit.gpu collection built with ansible-galaxy and
installed into a project directory elsewhere, gpukit's Python package installed from its wheel
into a fresh venv that is the controller's Python, and a play of that project using the
collection's roles against the lab's nodes.

Nothing of the checkout is on the play's paths: the play runs in the project directory with its
own ansible.cfg; collections come from the project (gpukit.gpu) and from the venv's ansible
package (kubernetes.core, community.general); the controller's venv reaches the project venv's
third-party packages through a .pth file (to save installing them again), but gpukit itself is
the wheel's, which the test proves. The nodes get gpukit from that installed package too (the
wheelhouse module re-makes its wheel: no checkout to build from).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from labplay import BIN, LAB_VARS, REPO, PlayResult, run_playbook

from gpukit.lab import cluster
from gpukit.lab.config import LabSpec, load_spec

pytestmark = pytest.mark.lab

COLLECTION = REPO / "collections/ansible_collections/gpukit/gpu"
ROLES = sorted(p.name for p in (COLLECTION / "roles").iterdir() if p.is_dir())
VENV_SITE = Path(sysconfig.get_paths()["purelib"])  # the project venv's third-party packages
WHEELHOUSE_TASK = "Build gpukit's wheelhouse on the controller"
WHERE_TASK = "Record where the controller's gpukit comes from"

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

    def play(self, *args: str) -> PlayResult:
        return run_playbook("play.yml", self.inventory, *args, "-e", "@lab_vars.yml",
                            var_files=(), env=self.env, cwd=self.root, timeout=1500,
                            command=(str(self.python), "-m", "ansible.cli.playbook"))  # fmt: skip

    def sh(self, node: str, command: str) -> str:
        r = cluster.node_exec(self.spec.node(node), ["sh", "-c", command])
        assert r.returncode == 0, f"{node}: {command}: {r.stderr}"
        return r.stdout


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
        "ANSIBLE_COLLECTIONS_PATH": f"{root / 'collections'}{os.pathsep}{VENV_SITE}",
        "ANSIBLE_HOME": str(root / "ansible-home"),
        "ANSIBLE_LOCAL_TEMP": str(root / "ansible-tmp"),
    })
    # The collection, built and installed as another project would.
    _run([str(BIN / "ansible-galaxy"), "collection", "build", str(COLLECTION), "--output-path",
          str(root / "dist")], root, env)  # fmt: skip
    (tarball,) = (root / "dist").glob("gpukit-gpu-*.tar.gz")
    _run([str(BIN / "ansible-galaxy"), "collection", "install", "--offline", "-p",
          str(root / "collections"), str(tarball)], root, env)  # fmt: skip
    # gpukit's wheel, installed into a fresh venv (before the .pth that lends it the project
    # venv's third-party packages, so pip does not see this checkout's editable gpukit).
    _run([str(BIN / "pip"), "wheel", "-q", "--no-deps", "-w", str(root / "wheel"), str(REPO)],
         root)  # fmt: skip
    (wheel,) = (root / "wheel").glob("gpukit-*.whl")
    _run([sys.executable, "-m", "venv", "--without-pip", str(root / "controller")], root)
    python = root / "controller/bin/python"
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
          "--no-index", "--disable-pip-version-check", str(wheel)], root)  # fmt: skip
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     root).strip())  # fmt: skip
    (site / "project-venv-packages.pth").write_text(f"{VENV_SITE}\n")
    env["PATH"] = f"{python.parent}{os.pathsep}/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
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
    listed = _run([str(BIN / "ansible-galaxy"), "collection", "list", "gpukit.gpu", "--format",
                   "json"], project.root, project.env)  # fmt: skip
    assert list(json.loads(listed)) == [str(project.root / "collections/ansible_collections")]


def test_the_controllers_gpukit_is_the_wheels(project: Project) -> None:
    probe = ("import gpukit, json, sys, importlib.metadata as m; d = m.distribution('gpukit'); "
             "print(json.dumps({'file': gpukit.__file__, 'path': sys.path, "
             "'url': json.loads(d.read_text('direct_url.json'))['url'], "
             "'editable': [n for n in sys.modules if 'editable' in n]}))")  # fmt: skip
    seen = json.loads(_run([str(project.python), "-c", probe], project.root, project.env))
    assert seen["file"] == str(project.root / "controller/lib/python3.11/site-packages/gpukit/__init__.py")
    assert seen["url"] == project.wheel.as_uri() and not seen["editable"]
    # The checkout is on no path but the project venv's third-party packages.
    inside = [p for p in seen["path"] if (project.root / p).resolve().is_relative_to(REPO)]
    assert inside == [str(VENV_SITE)], seen["path"]


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
