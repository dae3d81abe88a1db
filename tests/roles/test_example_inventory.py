"""inventories/example, a production-shaped fleet, checked without any host.

- The playbooks parse against it (`--syntax-check`), `ansible-inventory` shows its groups.
- Every host's variables, resolved the way the roles resolve them (role defaults, group_vars,
  host_vars, facts of the host's OS group), pass each role's `meta/argument_specs.yml` and the
  gpu_sharing role's own declaration check, in a local play that reaches no host.
- Broken values are refused naming the variable and the value.
- What can be planned without a node is planned per host through gpukit's library: driver
  packages with exact versions and the branch pin (apt), versionlock and module stream (dnf),
  the MIG layout against the MIG tables of the node's GPU model, the device plugin's ConfigMap,
  node labels and taints; the nvidia_driver role's RHEL path runs in check mode.

Nothing here connects anywhere or writes outside pytest's temporary directories (but for the
empty ~/.ansible/tmp that importing Ansible creates when it is missing).
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml
from labplay import BIN, REPO, PlayResult, run_playbook

from gpukit import inventory
from gpukit.contracts import mig_parted as schema
from gpukit.mig import planner
from gpukit.mig.state import GpuState
from gpukit.provision import agent, driver, nodes, sharing
from gpukit.provision import mig as provision_mig

EXAMPLE = REPO / "inventories" / "example"
PLAYBOOKS = [
    "site.yml",
    *sorted(str(p.relative_to(REPO)) for p in (REPO / "playbooks").glob("*.yml")),
]
# The roles site.yml runs (short names; the plays of the collection's playbook gpukit.gpu.site,
# which site.yml imports, name them gpukit.gpu.<role>).
SITE_PLAYBOOK = REPO / "collections/ansible_collections/gpukit/gpu/playbooks/site.yml"
SITE_ROLES = [r["role"].removeprefix("gpukit.gpu.")
              for play in yaml.safe_load(SITE_PLAYBOOK.read_text())
              for r in play.get("roles", [])]  # fmt: skip

HARDWARE_GROUPS = {
    "a100_nodes": ["gpu-a100-01", "gpu-a100-02", "gpu-a100-03"],
    "h100_nodes": ["gpu-h100-01", "gpu-h100-02", "gpu-h100-03"],
    "h200_nodes": ["gpu-h200-01", "gpu-h200-02"],
    "b200_nodes": ["gpu-b200-01", "gpu-b200-02"],
    "t4_nodes": ["gpu-t4-01", "gpu-t4-02", "gpu-t4-03"],
}
OS_GROUPS = {
    "os_ubuntu2204": ["gpu-a100-01", "gpu-a100-02"],
    "os_ubuntu2404": ["gpu-h100-01", "gpu-h100-02", "gpu-t4-01", "gpu-t4-02", "gpu-h200-01",
                      "gpu-h200-02", "gpu-b200-01", "gpu-b200-02"],
    "os_el9": ["gpu-a100-03", "gpu-h100-03", "gpu-t4-03"],
}
HOSTS = sorted(h for hosts in HARDWARE_GROUPS.values() for h in hosts)
# The facts a host of each OS group reports (the inventory's OS groups are the claim).
OS_FACTS = {
    "os_ubuntu2204": {"os_family": "Debian", "distribution": "Ubuntu",
                      "distribution_major_version": "22", "distribution_version": "22.04"},
    "os_ubuntu2404": {"os_family": "Debian", "distribution": "Ubuntu",
                      "distribution_major_version": "24", "distribution_version": "24.04"},
    "os_el9": {"os_family": "RedHat", "distribution": "Rocky",
               "distribution_major_version": "9", "distribution_version": "9.4"},
}  # fmt: skip
DOC_NETS = [ipaddress.ip_network(n) for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24")]
MIRROR = "https://mirror.example.com/"

# What each host must come out as: (apt|dnf, branch, kernel modules, device plugin config,
# MIG layout, resources the node must serve).
A100_MIXED = {"nvidia.com/mig-1g.10gb": 36, "nvidia.com/mig-2g.20gb": 4,
              "nvidia.com/mig-3g.40gb": 4}
H200_MIXED = {"nvidia.com/mig-1g.18gb": 36, "nvidia.com/mig-2g.35gb": 4,
              "nvidia.com/mig-3g.71gb": 4}
B200_MIXED = {"nvidia.com/mig-1g.23gb": 28, "nvidia.com/mig-3g.90gb": 4,
              "nvidia.com/mig-4g.90gb": 4}  # fmt: skip
EXPECTED: dict[str, tuple[str, str, str, str, str | None, dict[str, int]]] = {
    "gpu-a100-01": ("apt", "550", "open", "mig-mixed", "a100-80gb-mixed", A100_MIXED),
    "gpu-a100-02": ("apt", "550", "open", "mig-mixed", "a100-80gb-mixed", A100_MIXED),
    "gpu-a100-03": ("dnf", "550", "open", "mig-mixed", "all-3g.40gb",
                    {"nvidia.com/mig-3g.40gb": 16}),
    "gpu-h100-01": ("apt", "570", "open", "default", "all-disabled", {"nvidia.com/gpu": 8}),
    "gpu-h100-02": ("apt", "570", "open", "default", "all-disabled", {"nvidia.com/gpu": 8}),
    "gpu-h100-03": ("dnf", "570", "open", "default", "all-disabled", {"nvidia.com/gpu": 8}),
    "gpu-h200-01": ("apt", "550", "open", "mig-mixed", "h200-mixed", H200_MIXED),
    "gpu-h200-02": ("apt", "550", "open", "mig-mixed", "h200-mixed", H200_MIXED),
    "gpu-b200-01": ("apt", "570", "open", "mig-mixed", "b200-mixed", B200_MIXED),
    "gpu-b200-02": ("apt", "570", "open", "mig-mixed", "b200-mixed", B200_MIXED),
    "gpu-t4-01": ("apt", "550", "proprietary", "time-sliced", None, {"nvidia.com/gpu": 16}),
    "gpu-t4-02": ("apt", "550", "proprietary", "time-sliced", None, {"nvidia.com/gpu": 16}),
    "gpu-t4-03": ("dnf", "550", "proprietary", "time-sliced", None, {"nvidia.com/gpu": 16}),
}  # fmt: skip

EXPORT_TASK = "Export the role variables as the roles resolve them"
APT_SOURCE_TASK = "Render the apt source of NVIDIA's repository"
SHARING_CHECK_TASK = "Check the node's sharing declarations"
SHARING_REFUSE_TASK = "Refuse inconsistent sharing declarations"


def _specs(role: str) -> dict[str, Any]:
    doc = yaml.safe_load((REPO / "roles" / role / "meta/argument_specs.yml").read_text())
    return dict(doc["argument_specs"]["main"])


def validation_task(role: str) -> str:
    """The name Ansible gives the argument check it prepends to a role's main entry point."""
    return f"Validating arguments against arg spec 'main' - {_specs(role)['short_description']}"


def _play(roles: list[str], hosts: str = "gpu_nodes") -> str:
    """A play that runs `roles` (their prepended argument checks and what --tags selects) on
    the controller for every host of `hosts`, with the facts of the host's OS group."""
    play = {
        "name": "Resolve and check the example fleet's variables on the controller",
        "hosts": hosts,
        "connection": "local",
        "gather_facts": False,
        # Play variables beat the inventory's: nothing reaches a host, nothing becomes root.
        "vars": {"ansible_connection": "local", "ansible_become": False,
                 "ansible_python_interpreter": "{{ ansible_playbook_python }}"},
        "pre_tasks": [{
            "name": "Take the facts of the host's OS from its OS group",
            "ansible.builtin.set_fact": {
                **{k: f"{{{{ gpukit_example_facts.{k} }}}}" for k in OS_FACTS["os_el9"]},
                "architecture": "x86_64",
                "cacheable": True,
            },
            "vars": {"gpukit_example_facts": "{{ gpukit_example_os_facts[group_names | "
                                             "select('in', gpukit_example_os_facts) | first] }}"},
            "tags": ["always"],
        }],
        "roles": [{"role": f"gpukit.gpu.{r}", "tags": [r]} for r in roles],
        "post_tasks": [
            {
                "name": EXPORT_TASK,
                "ansible.builtin.set_fact": {
                    "gpukit_example_role_vars": "{{ dict(gpukit_example_names | zip(query("
                                                "'ansible.builtin.vars', *gpukit_example_names))) }}",
                },
                "tags": ["always"],
            },
            {
                "name": APT_SOURCE_TASK,
                "ansible.builtin.set_fact": {
                    "gpukit_example_apt_source": "{{ lookup('ansible.builtin.template', "
                                                 "gpukit_example_template) }}",
                },
                "when": "ansible_facts['os_family'] == 'Debian'",
                "tags": ["always"],
            },
        ],
    }  # fmt: skip
    return yaml.safe_dump([play], sort_keys=False)


def _env(tmp: Path) -> dict[str, str]:
    """Ansible's own temporary files and caches in `tmp`, the repository's ansible.cfg."""
    (tmp / "ansible-tmp").mkdir(parents=True, exist_ok=True)
    return {
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_HOME": str(tmp / "ansible-home"),
        "ANSIBLE_LOCAL_TEMP": str(tmp / "ansible-tmp"),
        "ANSIBLE_REMOTE_TEMP": str(tmp / "ansible-tmp"),
        "ANSIBLE_CACHE_PLUGIN": "ansible.builtin.memory",
        "ANSIBLE_GATHERING": "explicit",
    }


def run_local_play(inv: Path, tmp: Path, *args: str, roles: list[str] = SITE_ROLES,
                   hosts: str = "gpu_nodes", extra: Mapping[str, Any] | None = None,
                   path: Path | None = None) -> PlayResult:  # fmt: skip
    tmp.mkdir(parents=True, exist_ok=True)
    playbook = tmp / "example_local.yml"
    playbook.write_text(_play(roles, hosts))
    extra_vars = {
        "gpukit_example_os_facts": OS_FACTS,
        "gpukit_example_names": sorted(n for role in roles for n in _specs(role)["options"]),
        "gpukit_example_template": str(REPO / "roles/nvidia_driver/templates/gpukit-nvidia.sources.j2"),
        **(extra or {}),
    }  # fmt: skip
    env = _env(tmp)
    if path is not None:
        env["PATH"] = f"{path}{os.pathsep}{BIN}{os.pathsep}{os.environ.get('PATH', '')}"
    return run_playbook(str(playbook), inv, *args, var_files=(), extra_vars=extra_vars,
                        timeout=120, env=env)  # fmt: skip


def _subprocess(argv: list[str], tmp: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **_env(tmp), **env})  # fmt: skip


def _edit(path: Path, fn: Callable[[dict[str, Any]], None]) -> None:
    doc = yaml.safe_load(path.read_text())
    fn(doc)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def broken_fleet(tmp: Path) -> Path:
    """A copy of the example with one broken value per host:
    gpu-t4-01 `nvidia_driver_kernel_modules: closed`; the fleet's time-sliced config with
    `replicas: 0` (gpu-t4-01..03 use it); gpu-a100-01 on a MIG layout naming `3g.20gb`, an
    A100 40GB profile, while its GPUs are A100 80GB."""
    inv = tmp / "example"
    shutil.copytree(EXAMPLE, inv)
    (inv / "host_vars/gpu-t4-01").mkdir()
    (inv / "host_vars/gpu-t4-01/driver.yml").write_text("nvidia_driver_kernel_modules: closed\n")

    def zero(doc: dict[str, Any]) -> None:
        doc["gpukit_device_plugin_configs"]["time-sliced"]["sharing"]["timeSlicing"][
            "resources"][0]["replicas"] = 0  # fmt: skip

    def wrong_model(doc: dict[str, Any]) -> None:
        doc["gpukit_mig_configs"]["wrong-model"] = [
            {"devices": "all", "mig-enabled": True, "mig-devices": {"3g.20gb": 2}}
        ]

    _edit(inv / "group_vars/gpu_nodes/device_plugin.yml", zero)
    _edit(inv / "group_vars/gpu_nodes/sharing.yml", wrong_model)
    (inv / "host_vars/gpu-a100-01").mkdir()
    (inv / "host_vars/gpu-a100-01/sharing.yml").write_text("gpukit_mig_config: wrong-model\n")
    return inv


def _broken_run(tmp: Path) -> tuple[Path, PlayResult]:
    inv = broken_fleet(tmp)
    return inv, run_local_play(inv, tmp / "run", "--tags", "gpu_sharing_check",
                               "--limit", "gpu-t4-01,gpu-t4-02")  # fmt: skip


def _rhel_check(tmp: Path) -> tuple[PlayResult, Path]:
    """The nvidia_driver role on the RHEL hosts in check mode, on the controller."""
    files = tmp / "etc"
    files.mkdir(parents=True)
    # The nodes' rpm database, as `rpm -q` answers: driver 550.90.07 is installed (the H100
    # group's branch is 570: those nodes are before the switch).
    fake_bin = tmp / "bin"
    fake_bin.mkdir()
    (fake_bin / "rpm").write_text(
        "#!/bin/sh\n"
        '[ "$*" = "-q --queryformat %{VERSION}\n nvidia-driver" ] || exit 3\n'
        "echo 550.90.07\n"
    )
    (fake_bin / "rpm").chmod(0o755)
    r = run_local_play(
        EXAMPLE, tmp / "run", "--check", "--diff", "--tags", "nvidia_driver_packages",
        # The dnf tasks would ask this machine's package manager.
        "--skip-tags", "nvidia_driver_dnf",
        roles=["nvidia_driver"], hosts="os_el9",
        extra={"nvidia_driver_dnf_reposdir": str(files),
               "nvidia_driver_dnf_versionlock_list": str(files / "versionlock.list")},
        path=fake_bin,
    )  # fmt: skip
    return r, files


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Future[Any]]]:
    """Every Ansible run of this module, started together (they are independent)."""
    base = tmp_path_factory.mktemp("runs")
    jobs: dict[str, Callable[[Path], Any]] = {
        # The argument checks of every role of site.yml, the gpu_sharing role's declaration
        # check, and every host's role variables, from one local run over the example fleet.
        "resolved": lambda t: run_local_play(EXAMPLE, t, "--tags", "gpu_sharing_check"),
        "rhel": _rhel_check,
        "broken": _broken_run,
        "syntax": lambda t: _subprocess([str(BIN / "ansible-playbook"), "-i", str(EXAMPLE),
                                         "--syntax-check", *PLAYBOOKS], t),
        "listed": lambda t: _subprocess([str(BIN / "ansible-inventory"), "-i", str(EXAMPLE),
                                         "--list"], t),
        "lint": lambda t: _subprocess([str(BIN / "ansible-lint"), "--profile", "production",
                                       "--nocolor", "inventories/example"], t,
                                      XDG_CACHE_HOME=str(t)),
    }  # fmt: skip
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        futures: dict[str, Future[Any]] = {}
        for name, job in jobs.items():
            (base / name).mkdir()
            futures[name] = pool.submit(job, base / name)
        yield futures


@pytest.fixture(scope="module")
def resolved(runs: dict[str, Future[Any]]) -> PlayResult:
    r: PlayResult = runs["resolved"].result()
    assert r.rc == 0 and not r.failed, r.describe()
    return r


@pytest.fixture(scope="module")
def role_vars(resolved: PlayResult) -> dict[str, dict[str, Any]]:
    return {h: resolved.results[h][EXPORT_TASK]["ansible_facts"]["gpukit_example_role_vars"]
            for h in HOSTS}  # fmt: skip


@pytest.fixture(scope="module")
def listed(runs: dict[str, Future[Any]]) -> dict[str, Any]:
    r = runs["listed"].result()
    assert r.returncode == 0, r.stderr
    doc: dict[str, Any] = json.loads(r.stdout)
    return doc


@pytest.fixture(scope="module")
def broken(runs: dict[str, Future[Any]]) -> tuple[Path, PlayResult]:
    result: tuple[Path, PlayResult] = runs["broken"].result()
    return result


def _os_group(host: str) -> str:
    (group,) = [g for g, hosts in OS_GROUPS.items() if host in hosts]
    return group


def _family(host: str) -> str:
    return OS_FACTS[_os_group(host)]["os_family"].lower()


# --- the playbooks and the inventory ----------------------------------------------------------


def test_every_playbook_parses_against_the_example_inventory(
    runs: dict[str, Future[Any]],
) -> None:
    assert "site.yml" in PLAYBOOKS and len(PLAYBOOKS) >= 4, PLAYBOOKS
    r = runs["syntax"].result()
    assert r.returncode == 0, r.stdout + r.stderr
    # The inventory itself parsed cleanly (warnings about dynamic groups' patterns are fine).
    for needle in ("Unable to parse", "as an inventory source", "Skipping", "Invalid characters"):
        assert needle not in r.stderr, r.stderr


def test_ansible_inventory_lists_the_fleet(listed: dict[str, Any]) -> None:
    def members(group: str) -> set[str]:
        g = listed.get(group, {})
        out = set(g.get("hosts", []))
        for child in g.get("children", []):
            out |= members(child)
        return out

    assert set(listed["all"]["children"]) >= {"gpu_nodes", "os_ubuntu", "os_el9"}
    assert set(listed["gpu_nodes"]["children"]) == set(HARDWARE_GROUPS)
    assert set(listed["os_ubuntu"]["children"]) == {"os_ubuntu2204", "os_ubuntu2404"}
    for group, hosts in {**HARDWARE_GROUPS, **OS_GROUPS}.items():
        assert members(group) == set(hosts), group
    assert members("gpu_nodes") == set(HOSTS) == members("os_ubuntu") | members("os_el9")
    assert not members("ungrouped")
    hostvars = listed["_meta"]["hostvars"]
    assert sorted(hostvars) == HOSTS
    addresses = set()
    for host, hv in hostvars.items():
        address = ipaddress.ip_address(hv["ansible_host"])
        assert any(address in net for net in DOC_NETS), (
            f"{host}: {address} is not a documentation address"
        )
        addresses.add(address)
        assert hv["ansible_user"] == "gpukit-deploy" and hv["ansible_become"] is True, host
        assert "ansible_connection" not in hv, host  # SSH, Ansible's default
    assert len(addresses) == len(HOSTS)


def _group_vars() -> dict[str, dict[str, list[str]]]:
    """group -> variable -> the files (one per concern) that set it."""
    out: dict[str, dict[str, list[str]]] = {}
    for path in sorted((EXAMPLE / "group_vars").glob("*/*.yml")):
        for name in yaml.safe_load(path.read_text()) or {}:
            out.setdefault(path.parent.name, {}).setdefault(name, []).append(path.name)
    return out


def test_group_vars_are_one_concern_per_file_and_sibling_groups_never_compete(
    listed: dict[str, Any],
) -> None:
    gv = _group_vars()
    assert set(gv) == {"all", "gpu_nodes", *HARDWARE_GROUPS, "os_ubuntu", "os_ubuntu2204",
                       "os_el9"}  # fmt: skip
    assert not list((EXAMPLE / "group_vars").glob("*.yml")), "group_vars/<group>/<concern>.yml"
    for group, variables in gv.items():
        for name, files in variables.items():
            assert len(files) == 1, f"group_vars/{group}: {name} is set in {files}"
    assert {f for f in (EXAMPLE / "group_vars/gpu_nodes").iterdir()} >= {
        EXAMPLE / "group_vars/gpu_nodes" / f
        for f in ("driver.yml", "container_runtime.yml", "device_plugin.yml", "sharing.yml",
                  "labels_taints.yml", "vault.yml")
    }  # fmt: skip

    parents: dict[str, set[str]] = {}
    for group, doc in listed.items():
        for child in doc.get("children", []) if isinstance(doc, dict) else []:
            parents.setdefault(child, set()).add(group)

    def ancestors(group: str) -> set[str]:
        out: set[str] = set()
        for p in parents.get(group, ()):
            out |= {p} | ancestors(p)
        return out

    def groups_of(host: str) -> set[str]:
        direct = {
            g for g, d in listed.items() if isinstance(d, dict) and host in d.get("hosts", [])
        }
        return direct | {a for g in direct for a in ancestors(g)}

    # Two groups of one host, neither inside the other, setting one variable: Ansible would pick
    # by group name. The example never relies on that.
    for host in HOSTS:
        groups = sorted(groups_of(host) & set(gv))
        for i, a in enumerate(groups):
            for b in groups[i + 1 :]:
                if a in ancestors(b) or b in ancestors(a):
                    continue
                both = set(gv[a]) & set(gv[b])
                assert not both, f"{host}: {sorted(both)} set by both {a} and {b}"


def test_secrets_are_vault_placeholders_referenced_by_name() -> None:
    vault = yaml.safe_load((EXAMPLE / "group_vars/gpu_nodes/vault.yml").read_text())
    assert set(vault) == {"vault_nvidia_mirror_login", "vault_nvidia_mirror_password"}
    assert all(str(v).startswith("CHANGE-ME") for v in vault.values()), vault
    driver_vars = yaml.safe_load((EXAMPLE / "group_vars/gpu_nodes/driver.yml").read_text())
    assert driver_vars["nvidia_driver_repo_credentials"] == {
        "machine": "mirror.example.com",
        "login": "{{ vault_nvidia_mirror_login }}",
        "password": "{{ vault_nvidia_mirror_password }}",
    }
    for path in EXAMPLE.rglob("*.yml"):
        if path.name == "vault.yml":
            continue
        text = path.read_text()
        assert "CHANGE-ME" not in text and "$ANSIBLE_VAULT" not in text, path
        for name in yaml.safe_load(text) or {}:
            assert not str(name).startswith("vault_"), f"{path}: {name} belongs in vault.yml"


def test_ansible_lint_production_profile_on_the_example_inventory(
    runs: dict[str, Future[Any]],
) -> None:
    r = runs["lint"].result()
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-5000:]
    assert "Profile 'production' was required, and it passed" in r.stdout + r.stderr


# --- the roles' argument specs and declaration checks -----------------------------------------


def test_every_host_passes_every_roles_argument_spec(resolved: PlayResult) -> None:
    # Every role site.yml runs (the play runs exactly those), at least these six.
    assert set(SITE_ROLES) >= {"gpukit_node", "nvidia_driver", "container_toolkit", "gpu_sharing",
                               "node_labels", "device_plugin"}  # fmt: skip
    assert sorted(resolved.stats) == HOSTS
    for host in HOSTS:
        for role in SITE_ROLES:
            res = resolved.results[host][validation_task(role)]
            assert res.get("msg") == "The arg spec validation passed", (host, role, res)
            assert res["validate_args_context"]["name"] == role
        assert resolved.stats[host]["failures"] == 0 and resolved.stats[host]["changed"] == 0


def test_the_gpu_sharing_roles_check_accepts_every_host(resolved: PlayResult) -> None:
    for host in HOSTS:
        check = resolved.results[host][SHARING_CHECK_TASK]["ansible_facts"]["gpu_sharing_check"]
        assert check["ok"] and check["problems"] == [] and check["warnings"] == [], (host, check)
        time_sliced = EXPECTED[host][3] == "time-sliced"
        assert check["shared_replicas"] == ({"nvidia.com/gpu": 4} if time_sliced else {})


def test_role_variables_resolve_from_the_inventory(role_vars: dict[str, dict[str, Any]]) -> None:
    for host in HOSTS:
        rv = role_vars[host]
        _, branch, modules, plugin_config, mig_config, _ = EXPECTED[host]
        assert (
            rv["nvidia_driver_branch"] == branch and rv["nvidia_driver_kernel_modules"] == modules
        )
        assert rv["nvidia_driver_channel"] == "cuda"
        assert rv["device_plugin_config"] == rv["node_labels_device_plugin_config"] == plugin_config
        assert rv["gpu_sharing_mig_config"] == rv["node_labels_mig_config"] == mig_config
        assert rv["node_labels_node_name"] == host
        assert rv["container_toolkit_runtime"] == "containerd"
        assert rv["container_toolkit_containerd_mode"] == "drop_in"
        assert rv["container_toolkit_manage_repo"] is False
        assert (
            rv["device_plugin_kubeconfig"]
            == rv["node_labels_kubeconfig"]
            == "/etc/gpukit/gpu-cluster.kubeconfig"
        )
        creds = rv["nvidia_driver_repo_credentials"]
        assert creds["machine"] == "mirror.example.com" and creds["password"].startswith(
            "CHANGE-ME"
        )
        group = _os_group(host)
        if group == "os_el9":
            assert rv["nvidia_driver_dnf_repo_baseurl"] == f"{MIRROR}nvidia/cuda/repos/rhel9/x86_64"
            assert rv["nvidia_driver_dnf_gpgkey"].startswith(MIRROR)
            assert rv["gpukit_node_base_python"] == "/usr/bin/python3.11"
            assert rv["gpukit_node_os_packages"]["RedHat"] == ["python3.11"]
        else:
            distro = "ubuntu2204" if group == "os_ubuntu2204" else "ubuntu2404"
            assert rv["nvidia_driver_apt_repo_uri"] == f"{MIRROR}nvidia/cuda/repos/{distro}/x86_64"
            assert rv["nvidia_driver_apt_key"].startswith(MIRROR)
            assert rv["gpukit_node_base_python"] == (
                "/usr/bin/python3.11" if distro == "ubuntu2204" else "/usr/bin/python3"
            )
        assert rv["gpukit_node_wheel_platforms"] == ["manylinux2014_x86_64",
                                                     "manylinux_2_28_x86_64"]  # fmt: skip


def test_the_apt_source_template_renders_for_ubuntu_hosts(resolved: PlayResult) -> None:
    for host in HOSTS:
        res = resolved.results[host][APT_SOURCE_TASK]
        if _family(host) == "redhat":
            assert res.get("skipped"), host
            continue
        source = res["ansible_facts"]["gpukit_example_apt_source"]
        distro = "ubuntu2204" if _os_group(host) == "os_ubuntu2204" else "ubuntu2404"
        lines = [line for line in source.splitlines() if not line.startswith("#")]
        assert lines == [
            "Types: deb",
            f"URIs: {MIRROR}nvidia/cuda/repos/{distro}/x86_64",
            "Suites: /",
            "Signed-By: /etc/apt/keyrings/gpukit-nvidia.asc",
        ], (host, source)


def test_argument_spec_refuses_an_unknown_kernel_module_flavour(
    broken: tuple[Path, PlayResult],
) -> None:
    _, r = broken
    assert r.rc != 0
    res = r.results["gpu-t4-01"][validation_task("nvidia_driver")]
    assert res["failed"] and res["validate_args_context"]["name"] == "nvidia_driver"
    assert (
        "nvidia_driver_kernel_modules must be one of: open, proprietary, got: closed" in res["msg"]
    )
    assert r.results["gpu-t4-01"][validation_task("gpukit_node")].get("failed") is not True
    # The host stopped there: its sharing check never ran.
    assert sorted(r.failed) == ["gpu-t4-01", "gpu-t4-02"], r.describe()
    assert len(r.failed["gpu-t4-01"]) == 1
    assert r.failed["gpu-t4-01"][0].startswith(validation_task("nvidia_driver"))
    assert SHARING_CHECK_TASK not in r.results["gpu-t4-01"]


def test_time_slicing_with_zero_replicas_is_refused(broken: tuple[Path, PlayResult]) -> None:
    inv, r = broken
    # The gpu_sharing role refuses it before it changes anything (the argument specs only say
    # "a dict": the device plugin config is gpukit's to check) ...
    upto = SITE_ROLES[: SITE_ROLES.index("gpu_sharing") + 1]
    for role in upto:
        assert r.results["gpu-t4-02"][validation_task(role)].get("failed") is not True, role
    assert len(r.failed["gpu-t4-02"]) == 1, r.describe()
    assert r.failed["gpu-t4-02"][0].startswith(f"{SHARING_REFUSE_TASK}: ")
    msg = r.results["gpu-t4-02"][SHARING_REFUSE_TASK]["msg"]
    # (in the inventory model's words: the role runs its checks)
    assert msg.startswith("gpu-t4-02: gpukit_device_plugin_configs.time-sliced.sharing")
    assert "timeSlicing.resources[0].replicas: 0 is not >= 2" in msg
    # ... and the inventory model (the conformance suite's reading) names variable and value.
    with pytest.raises(inventory.InventoryError) as exc:
        inventory.load(inv)
    problems = [str(p) for p in exc.value.problems]
    replicas = ("gpukit_device_plugin_configs.time-sliced.sharing.timeSlicing.resources[0]"
                ".replicas: 0 is not >= 2")  # fmt: skip
    # every host deploys every named config: one problem naming them all (issue 29)
    assert [sorted(p.hosts) for p in exc.value.problems if str(p).endswith(replicas)] == [
        sorted(HOSTS)]
    closed = (
        "host gpu-t4-01: nvidia_driver_kernel_modules: 'closed' is not one of open, proprietary"
    )
    assert closed in problems


def test_a_mig_profile_the_gpu_model_lacks_is_refused(broken: tuple[Path, PlayResult]) -> None:
    inv, _ = broken
    with pytest.raises(inventory.InventoryError) as exc:
        inventory.load(inv)
    assert (
        "host gpu-a100-01: gpukit_mig_configs.wrong-model[0].mig-devices: '3g.20gb' is not a MIG"
        " profile of A100-80GB (known: 1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb,"
        " 7g.80gb)"
    ) in [str(p) for p in exc.value.problems]
    # The MIG manager on the node refuses it the same way, for every GPU, before touching one.
    node = inventory.load(EXAMPLE).node("gpu-a100-01")
    configs = yaml.safe_load((inv / "group_vars/gpu_nodes/sharing.yml").read_text())
    with pytest.raises(planner.LayoutError) as lay:
        planner.plan(schema.parse(configs["gpukit_mig_configs"]), "wrong-model", _fresh_gpus(node))
    assert len(lay.value.problems) == 8
    assert lay.value.problems[0].startswith(
        "mig-configs.wrong-model[0].mig-devices.3g.20gb: unknown profile for NVIDIA A100-SXM4-80GB"
        " (GPU 0;"
    )


# --- planning without a node, through gpukit's library ----------------------------------------

# What `apt-cache madison` shows for the mirror of NVIDIA's CUDA repository.
MADISON = "".join(
    f"{name} | {version} | {MIRROR}nvidia/cuda/repos/ubuntu2404/x86_64  Packages\n"
    for name in ("nvidia-driver", "nvidia-kernel-open-dkms", "nvidia-kernel-dkms",
                 "nvidia-persistenced")
    for version in ("570.133.20-0ubuntu1", "550.163.01-0ubuntu1", "550.144.03-0ubuntu1")
)  # fmt: skip


def _driver_spec(host: str, rv: Mapping[str, Any]) -> driver.DriverSpec:
    return driver.DriverSpec(
        branch=rv["nvidia_driver_branch"], kernel_modules=rv["nvidia_driver_kernel_modules"],
        family=_family(host), channel=rv["nvidia_driver_channel"],
        persistenced=rv["nvidia_driver_persistenced"], version=rv["nvidia_driver_version"] or None,
    )  # fmt: skip


@pytest.mark.parametrize("host", HOSTS)
def test_driver_plan_per_host(host: str, role_vars: dict[str, dict[str, Any]]) -> None:
    spec = _driver_spec(host, role_vars[host])
    manager, branch, modules = EXPECTED[host][:3]
    kernel = {
        ("apt", "open"): "nvidia-kernel-open-dkms", ("apt", "proprietary"): "nvidia-kernel-dkms",
        ("dnf", "open"): "kmod-nvidia-open-dkms", ("dnf", "proprietary"): "kmod-nvidia-latest-dkms",
    }[(manager, modules)]  # fmt: skip
    if manager == "apt":
        newest = {"550": "550.163.01", "570": "570.133.20"}[branch]
        plan = driver.plan_apt(spec, installed={}, available=driver.parse_madison(MADISON))
        assert plan.problems == ()
        assert plan.install == (f"{kernel}={newest}-0ubuntu1", f"nvidia-driver={newest}-0ubuntu1",
                                f"nvidia-persistenced={newest}-0ubuntu1")  # fmt: skip
        assert plan.remove == () and plan.driver_version == newest
        assert plan.pin == (
            f"# Managed by gpukit (nvidia_driver): keep the NVIDIA driver on branch {branch}.\n"
            "Package: nvidia-* libnvidia-* libcuda* libnvcuvid* libnvoptix* firmware-nvidia-gsp*"
            " xserver-xorg-video-nvidia* libegl-nvidia* libgl1-nvidia-* libglx-nvidia*"
            " cuda-drivers*\n"
            f"Pin: version {branch}.*\n"
            "Pin-Priority: 1001\n"
        )  # fmt: skip
    else:
        assert driver.dnf_module_stream(spec) == (
            f"nvidia-driver:{branch}-{'open' if modules == 'open' else 'dkms'}"
        )
        assert driver.dnf_versionlock(spec) == (
            f"# Managed by gpukit (nvidia_driver): keep the NVIDIA driver on branch {branch}.\n"
            + "".join(f"{n}-3:{branch}.*\n" for n in ("nvidia-driver", "nvidia-driver-cuda",
                                                       "nvidia-driver-libs", kernel,
                                                       "nvidia-persistenced"))
        )  # fmt: skip


def test_driver_plan_for_the_h100_branch_bump_on_ubuntu(role_vars: dict[str, dict[str, Any]]
                                                        ) -> None:  # fmt: skip
    """An H100 Ubuntu node still on the fleet's 550 branch moves to the group's 570."""
    spec = _driver_spec("gpu-h100-01", role_vars["gpu-h100-01"])
    installed = {
        n: "550.163.01-0ubuntu1"
        for n in ("nvidia-driver", "nvidia-kernel-open-dkms", "nvidia-persistenced")
    }
    plan = driver.plan_apt(spec, installed, driver.parse_madison(MADISON))
    assert plan.summary() == [
        "upgrade nvidia-kernel-open-dkms 550.163.01-0ubuntu1 -> 570.133.20-0ubuntu1",
        "upgrade nvidia-driver 550.163.01-0ubuntu1 -> 570.133.20-0ubuntu1",
        "upgrade nvidia-persistenced 550.163.01-0ubuntu1 -> 570.133.20-0ubuntu1",
    ]
    assert "Pin: version 570.*\n" in plan.pin
    assert driver.reboot_decision(plan.driver_version, "550.163.01") == driver.RebootDecision(
        True, "driver 570.133.20 is installed, 550.163.01 is loaded"
    )


def test_driver_plan_switches_a_t4_node_to_the_proprietary_modules(
    role_vars: dict[str, dict[str, Any]],
) -> None:
    spec = _driver_spec("gpu-t4-01", role_vars["gpu-t4-01"])
    installed = {
        n: "550.144.03-0ubuntu1"
        for n in ("nvidia-driver", "nvidia-kernel-open-dkms", "nvidia-persistenced")
    }
    plan = driver.plan_apt(spec, installed, driver.parse_madison(MADISON))
    assert plan.install[0] == "nvidia-kernel-dkms=550.163.01-0ubuntu1"
    assert plan.remove == ("nvidia-kernel-open-dkms",)
    assert "remove nvidia-kernel-open-dkms 550.144.03-0ubuntu1" in plan.summary()


def _fresh_gpus(node: inventory.NodeDecl) -> list[GpuState]:
    """The declared GPUs as a new node reports them: MIG capable per the model's table, MIG off."""
    capable = node.gpu.mig_table is not None
    return [GpuState(index=i, uuid=f"GPU-{node.host}-{i}", product=node.gpu.product,
                     mig_current=False if capable else None,
                     mig_pending=False if capable else None)
            for i in range(node.gpu.count)]  # fmt: skip


@pytest.fixture(scope="module")
def fleet() -> inventory.GpuInventory:
    return inventory.load(EXAMPLE)


@pytest.mark.parametrize("host", HOSTS)
def test_mig_layout_is_planned_against_the_gpu_models_tables(
    host: str, role_vars: dict[str, dict[str, Any]], fleet: inventory.GpuInventory
) -> None:
    rv = role_vars[host]
    node = fleet.node(host)
    selected = rv["gpu_sharing_mig_config"]
    assert selected == EXPECTED[host][4] == node.mig_config_name
    # The file the gpu_sharing role writes for the MIG manager, and what the manager reads back.
    text = provision_mig.parted_config(rv["gpu_sharing_mig_configs"])
    configs = schema.parse(yaml.safe_load(text))
    assert sorted(yaml.safe_load(text)["mig-configs"]) == [
        "a100-80gb-mixed",
        "all-1g.10gb",
        "all-3g.40gb",
        "all-disabled",
        "b200-mixed",
        "h200-mixed",
    ]
    if selected is None:
        assert node.gpu.mig_table is None  # T4: not MIG capable, MIG left alone
        return
    plan = planner.plan(configs, selected, _fresh_gpus(node))
    targets = [g.target.describe() if g.target else None for g in plan.gpus]
    if selected == "all-disabled":
        assert targets == ["MIG disabled"] * 8 and not plan.changed
        return
    mixed = "MIG enabled: 2g.20gb@0 1g.10gb@2 1g.10gb@3 3g.40gb@4"
    small = "MIG enabled: " + " ".join(f"1g.10gb@{i}" for i in range(7))
    h200_mixed = "MIG enabled: 2g.35gb@0 1g.18gb@2 1g.18gb@3 3g.71gb@4"
    h200_small = "MIG enabled: " + " ".join(f"1g.18gb@{i}" for i in range(7))
    b200_mixed = "MIG enabled: 4g.90gb@0 3g.90gb@4"
    b200_small = "MIG enabled: " + " ".join(f"1g.23gb@{i}" for i in range(7))
    expected = {
        "a100-80gb-mixed": [mixed] * 4 + [small] * 4,
        "all-3g.40gb": ["MIG enabled: 3g.40gb@0 3g.40gb@4"] * 8,
        "h200-mixed": [h200_mixed] * 4 + [h200_small] * 4,
        "b200-mixed": [b200_mixed] * 4 + [b200_small] * 4,
    }[selected]
    assert targets == expected
    assert [g.gpu.index for g in plan.gpus if g.reset_required] == list(range(8))
    first = [a.text() for a in plan.gpus[0].actions]
    assert first[:2] == ["GPU 0: set MIG mode enabled",
                         "GPU 0: reset the GPU (applies the pending MIG mode)"]  # fmt: skip
    # The library's own layout check (the conformance suite's) agrees with the planner.
    per_gpu = [sorted(s.profile for s in g.target.slots) for g in plan.gpus if g.target]
    assert per_gpu == [list(g.profiles) for g in node.mig_gpus]


def test_device_plugin_configmap_is_the_same_for_the_whole_fleet(
    role_vars: dict[str, dict[str, Any]],
) -> None:
    # device_plugin renders the ConfigMap once (run_once) from whichever host comes first.
    keys = ("device_plugin_configs", "device_plugin_image", "device_plugin_namespace",
            "device_plugin_default_config", "device_plugin_node_selector")  # fmt: skip
    first = {k: role_vars[HOSTS[0]][k] for k in keys}
    for host in HOSTS:
        assert {k: role_vars[host][k] for k in keys} == first, host
    rv = role_vars[HOSTS[0]]
    objects = agent.render(
        image=rv["device_plugin_image"], configs=rv["device_plugin_configs"],
        namespace=rv["device_plugin_namespace"], default_config=rv["device_plugin_default_config"],
        driver_root=rv["device_plugin_driver_root"], nvml_library=rv["device_plugin_nvml_library"],
        node_selector=rv["device_plugin_node_selector"], env=rv["device_plugin_env"],
        host_mounts=rv["device_plugin_host_mounts"],
        image_pull_policy=rv["device_plugin_image_pull_policy"],
    )  # fmt: skip
    by_kind = {o["kind"]: o for o in objects}
    # The named configs' ConfigMap (beside it: the nodes' declarations, issue 30).
    (cm,) = [o for o in objects
             if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "gpukit-node-agent-configs"]
    assert cm["metadata"]["namespace"] == "gpukit-system"
    assert sorted(cm["data"]) == ["default", "mig-mixed", "time-sliced"]
    parsed = {k: yaml.safe_load(v) for k, v in cm["data"].items()}
    assert parsed["mig-mixed"]["flags"]["migStrategy"] == "mixed"
    assert parsed["default"]["flags"]["migStrategy"] == "none"
    assert parsed["time-sliced"]["sharing"]["timeSlicing"] == {
        "renameByDefault": False, "failRequestsGreaterThanOne": True,
        "resources": [{"name": "nvidia.com/gpu", "replicas": 4}],
    }  # fmt: skip
    pod = by_kind["DaemonSet"]["spec"]["template"]["spec"]
    assert [c["image"] for c in pod["containers"]] == [
        "registry.example.com/platform/gpukit-node-agent:0.1.0"
    ]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.deploy.device-plugin": "true"}


@pytest.mark.parametrize("host", HOSTS)
def test_node_labels_and_taints_per_host(host: str, role_vars: dict[str, dict[str, Any]]) -> None:
    rv = role_vars[host]
    labels = nodes.declared_labels(rv["node_labels_labels"], rv["node_labels_device_plugin_config"],
                                   rv["node_labels_mig_config"],
                                   rv["node_labels_deploy_device_plugin"])  # fmt: skip
    pool = {"a100_nodes": ("a100-mig", "training"), "h100_nodes": ("h100", "training"),
            "h200_nodes": ("h200-mig", "training"), "b200_nodes": ("b200-mig", "inference"),
            "t4_nodes": ("t4-shared", "inference")}  # fmt: skip
    (group,) = [g for g, hs in HARDWARE_GROUPS.items() if host in hs]
    expected = {
        "example.com/gpu-pool": pool[group][0],
        "example.com/workload": pool[group][1],
        "nvidia.com/device-plugin.config": EXPECTED[host][3],
        "nvidia.com/gpu.deploy.device-plugin": "true",
    }
    if EXPECTED[host][4]:
        expected["nvidia.com/mig.config"] = EXPECTED[host][4]
    assert labels == expected
    # A node that just joined: everything is added, gpukit records what it owns.
    fresh = {"metadata": {"name": host, "labels": {"kubernetes.io/hostname": host}}}
    patch = nodes.plan(fresh, labels, nodes.parse_taints(rv["node_labels_taints"],
                                                         "gpukit_node_taints"))  # fmt: skip
    assert patch.patch["metadata"]["labels"] == expected
    assert patch.patch["spec"] == {
        "taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule", "value": "present"}]
    }
    assert patch.patch["metadata"]["annotations"] == {
        nodes.MANAGED_LABELS: ",".join(sorted(expected)),
        nodes.MANAGED_TAINTS: "nvidia.com/gpu:NoSchedule",
    }
    assert "taint nvidia.com/gpu:NoSchedule: added" in patch.changes


@pytest.mark.parametrize("host", HOSTS)
def test_what_each_node_must_serve(host: str, fleet: inventory.GpuInventory,
                                   role_vars: dict[str, dict[str, Any]]) -> None:  # fmt: skip
    node = fleet.node(host)
    rv = role_vars[host]
    assert inventory.expected_resources(node) == EXPECTED[host][5]
    check = sharing.check(
        rv["gpu_sharing_plugin_configs"],
        rv["gpu_sharing_plugin_config"],
        rv["gpu_sharing_mig_configs"],
        rv["gpu_sharing_mig_config"],
    )
    assert check.ok and not check.warnings, check
    labels = inventory.expected_labels(node)
    assert labels["nvidia.com/cuda.driver-version.major"] == EXPECTED[host][1]
    if host.startswith("gpu-t4"):
        assert labels["nvidia.com/gpu.product"] == "Tesla-T4-SHARED"
        assert labels["nvidia.com/gpu.replicas"] == "4"
        assert labels["nvidia.com/mig.capable"] == "false"
    elif host.startswith("gpu-h100"):
        assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
        assert (
            labels["nvidia.com/mig.capable"] == "true" and "nvidia.com/mig.strategy" not in labels
        )
    elif host.startswith("gpu-h200"):  # MIG sizes from the H200 table (a driver's listing)
        assert labels["nvidia.com/mig.strategy"] == "mixed"
        assert labels["nvidia.com/mig-1g.18gb.memory"] == "16384"
    elif host.startswith("gpu-b200"):
        assert labels["nvidia.com/mig.strategy"] == "mixed"
        assert labels["nvidia.com/mig-1g.23gb.memory"] == "20992"
    else:
        assert labels["nvidia.com/mig.strategy"] == "mixed"
        assert labels["nvidia.com/mig-3g.40gb.memory"] == "40192"


# --- the nvidia_driver role's RHEL path, in check mode on the controller ----------------------


@pytest.fixture(scope="module")
def rhel_check(runs: dict[str, Future[Any]]) -> tuple[PlayResult, Path]:
    result: tuple[PlayResult, Path] = runs["rhel"].result()
    return result


def test_rhel_hosts_in_check_mode(rhel_check: tuple[PlayResult, Path],
                                  role_vars: dict[str, dict[str, Any]]) -> None:  # fmt: skip
    r, files = rhel_check
    assert r.rc == 0 and not r.failed, r.describe()
    assert sorted(r.stats) == sorted(OS_GROUPS["os_el9"])
    for host in OS_GROUPS["os_el9"]:
        res = r.results[host]
        assert set(r.changed[host]) == {"Add NVIDIA's dnf repository",
                                        "Hold the driver packages on the branch"}  # fmt: skip
        # The repository carries the mirror's credentials: its result is not logged.
        repo = res["Add NVIDIA's dnf repository"]
        assert repo.get("censored") and "diff" not in repo, repo
        lock = res["Hold the driver packages on the branch"]["diff"]
        expected = driver.dnf_versionlock(_driver_spec(host, role_vars[host]))
        assert lock["after"] == (f"# BEGIN gpukit nvidia_driver\n{expected}"
                                    "# END gpukit nvidia_driver\n"), (host, lock)  # fmt: skip
        assert lock["before"] == ""
        # The reboot decision's target: the installed driver when it is on the branch.
        assert res["Read the installed driver's version"]["rc"] == 0
        target = res["Note the planned driver version"]["ansible_facts"][
            "nvidia_driver_target_version"]  # fmt: skip
        assert target == ("550.90.07" if EXPECTED[host][1] == "550" else None), (host, target)
    # Check mode wrote nothing, and no task of the role showed the secret (this test's own
    # export task shows the role variables on purpose).
    assert list(files.iterdir()) == []
    password = role_vars[HOSTS[0]]["nvidia_driver_repo_credentials"]["password"]
    shown = {h: {t: v for t, v in res.items() if t != EXPORT_TASK} for h, res in r.results.items()}
    assert "Add NVIDIA's dnf repository" in shown["gpu-t4-03"]
    assert password not in json.dumps(shown) and password not in r.stderr


def test_a_fleet_wide_driver_change_rolls_in_the_declared_batches(listed: dict[str, Any]) -> None:
    """Per-group serial and order from group_vars/*/upgrade.yml: T4 inference two at a time
    first, A100 a third of the group at a time, H200, H100 and B200 one at a time last; the
    fleet's failure budget of 0 caps every batch at one node (two T4s could fail at once)."""
    from gpukit.provision import upgrade

    hostvars = listed["_meta"]["hostvars"]
    states = [
        upgrade.node_state({
            "host": h, "group": hv["gpukit_upgrade_group"], "serial": hv["gpukit_upgrade_serial"],
            "order": hv["gpukit_upgrade_order"], "changes": ["driver: 550 -> 570"],
        })
        for h, hv in sorted(hostvars.items())
    ]  # fmt: skip
    plan = upgrade.plan(states, hostvars["gpu-t4-01"]["gpukit_upgrade_max_failed"])
    assert plan.batches == [
        ["gpu-t4-01"], ["gpu-t4-02"], ["gpu-t4-03"],
        ["gpu-a100-01"], ["gpu-a100-02"], ["gpu-a100-03"],
        ["gpu-h200-01"], ["gpu-h200-02"],
        ["gpu-h100-01"], ["gpu-h100-02"], ["gpu-h100-03"],
        ["gpu-b200-01"], ["gpu-b200-02"],
    ]  # fmt: skip
    assert plan.max_failed == 0
    assert any(line.startswith("batches of t4_nodes hold at most 1 node(s)") for line in plan.lines)
