"""Playbooks and roles without a lab: syntax, lint, variable checks, the RHEL path in check
mode (facts from a fact cache), the per-concern playbooks."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from labplay import BIN, REPO, PlayResult, run_playbook

PLAYBOOKS = ["site.yml", "playbooks/provision.yml", "playbooks/sharing.yml", "playbooks/mig.yml",
             "playbooks/upgrade.yml"]
HERE = Path(__file__).resolve().parent


def test_syntax_check_every_playbook() -> None:
    r = subprocess.run([str(BIN / "ansible-playbook"), "--syntax-check", *PLAYBOOKS],
                       cwd=REPO, capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.skipif(not (BIN / "ansible-lint").exists(), reason="ansible-lint is not installed")
def test_ansible_lint_production_profile() -> None:
    r = subprocess.run(
        [str(BIN / "ansible-lint"), "--profile", "production", "--nocolor", *PLAYBOOKS,
         "roles", "collections/ansible_collections/gpukit"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-5000:]


def test_every_role_has_typed_argument_specs() -> None:
    import yaml

    for role in sorted(p for p in (REPO / "roles").iterdir() if p.is_dir()):
        specs = yaml.safe_load((role / "meta/argument_specs.yml").read_text())["argument_specs"]
        options = specs["main"]["options"]
        defaults = yaml.safe_load((role / "defaults/main.yml").read_text()) or {}
        for name in defaults:
            assert name in options, f"{role.name}: default {name} has no argument spec"
        for name, opt in options.items():
            assert opt.get("type") and opt.get("description"), f"{role.name}: {name}"


def check_args(role: str, **extra: Any) -> PlayResult:
    """The role's argument check alone (nothing of the role runs, whatever it decides)."""
    return run_playbook(str(HERE / "playbooks/argspec.yml"), "localhost,", "--tags",
                        "gpukit_argspec", var_files=(),
                        extra_vars={"role_under_test": role, **extra})  # fmt: skip


def argspec(role: str, **extra: Any) -> str:
    r = check_args(role, **extra)
    assert r.rc != 0, f"{role} accepted {extra}"
    return json.dumps(r.failed)


@pytest.mark.parametrize(
    ("role", "extra", "needle"),
    [
        ("nvidia_driver", {"nvidia_driver_branch": "550", "nvidia_driver_kernel_modules": "closed"},
         "nvidia_driver_kernel_modules must be one of: open, proprietary, got: closed"),
        ("nvidia_driver", {"nvidia_driver_branch": "550", "nvidia_driver_reboot": "sometimes"},
         "nvidia_driver_reboot must be one of: auto, never"),
        ("container_toolkit", {"gpukit_container_runtime": "docker"},
         "container_toolkit_runtime must be one of: containerd, crio, got: docker"),
        ("device_plugin", {"gpukit_device_plugin_configs": "not-a-dict"},
         "device_plugin_configs"),
        ("node_labels", {"gpukit_node_taints": [{"key": "a", "effect": "Never"}]},
         "effect must be one of: NoSchedule, PreferNoSchedule, NoExecute"),
        ("gpu_sharing", {"gpukit_mig_configs": ["not", "a", "mapping"]},
         "gpu_sharing_mig_configs"),
        ("rolling_upgrade", {"rolling_upgrade_reasons": ["x"], "gpukit_upgrade_job_timeout": "soon"},
         "rolling_upgrade_job_timeout"),
        ("rolling_upgrade", {"rolling_upgrade_reasons": "not-a-list-of", "gpukit_upgrade_validate": "maybe"},
         "rolling_upgrade_validate"),
        # Wrong types, each refused by the type its argument spec gives.
        ("nvidia_driver", {"nvidia_driver_branch": {"major": 550}},
         "argument 'nvidia_driver_branch' is of type dict and we were unable to convert to int"),
        ("nvidia_driver", {"nvidia_driver_branch": "55x"},
         "argument 'nvidia_driver_branch' is of type str and we were unable to convert to int"),
        ("nvidia_driver", {"nvidia_driver_branch": ["550"]},
         "argument 'nvidia_driver_branch' is of type list and we were unable to convert to int"),
        ("nvidia_driver", {"nvidia_driver_branch": "550", "nvidia_driver_reboot_timeout": "10m"},
         "argument 'nvidia_driver_reboot_timeout' is of type str and we were unable to convert to int"),
        ("nvidia_driver", {"nvidia_driver_branch": "550", "nvidia_driver_repo_credentials": ["a"]},
         "argument 'nvidia_driver_repo_credentials' is of type list and we were unable to convert to dict"),
        ("gpukit_node", {"gpukit_node_wheel_platforms": {"linux": "x86_64"}},
         "argument 'gpukit_node_wheel_platforms' is of type dict and we were unable to convert to list"),
        ("container_toolkit", {"container_toolkit_set_as_default": "sometimes"},
         "argument 'container_toolkit_set_as_default' is of type str and we were unable to convert to bool"),
        ("device_plugin", {"gpukit_device_plugin_host_mounts": [{"name": "x", "host_path": "/x", "read_only": "rw"}]},
         "argument 'read_only' is of type str found in 'device_plugin_host_mounts'. and we were unable to convert to bool"),
        ("node_labels", {"gpukit_node_labels": ["gpu=yes"]},
         "argument 'node_labels_labels' is of type list and we were unable to convert to dict"),
        ("gpu_sharing", {"gpukit_mig_config": "all-1g", "gpu_sharing_mig_force": {"yes": True}},
         "argument 'gpu_sharing_mig_force' is of type dict and we were unable to convert to bool"),
        ("rolling_upgrade", {"rolling_upgrade_reasons": ["x"], "gpukit_upgrade_order": "first"},
         "argument 'rolling_upgrade_order' is of type str and we were unable to convert to int"),
    ],
)  # fmt: skip
def test_argument_specs_reject_bad_variables(role: str, extra: dict[str, Any], needle: str) -> None:
    assert needle in argspec(role, **extra)


@pytest.mark.parametrize("branch", ["550", 570])
def test_a_driver_branch_is_a_number_quoted_or_not(branch: object) -> None:
    r = check_args("nvidia_driver", nvidia_driver_branch=branch)
    assert r.rc == 0 and not r.failed, r.describe()


def test_argument_types_are_as_narrow_as_ansible_allows() -> None:
    """Every option has a type; `raw` (anything) only where the value is a union no argument
    spec type expresses. Ansible's `str` turns any value into text, so a variable that is a
    number is typed int (the driver branch): a mapping or a list is then refused."""
    import yaml

    raw_allowed = {"rolling_upgrade_serial", "rolling_upgrade_max_failed"}  # count or "25%"
    numbers = {"nvidia_driver_branch", "nvidia_driver_reboot_timeout", "device_plugin_wait_timeout",
               "rolling_upgrade_order", "rolling_upgrade_job_timeout"}  # fmt: skip
    seen: dict[str, str] = {}
    for spec_file in sorted((REPO / "roles").glob("*/meta/argument_specs.yml")):
        for entry in yaml.safe_load(spec_file.read_text())["argument_specs"].values():
            for name, opt in entry.get("options", {}).items():
                assert opt.get("type"), f"{spec_file}: {name} has no type"
                seen[name] = opt["type"]
                for sub, sub_opt in (opt.get("options") or {}).items():
                    assert sub_opt.get("type"), f"{spec_file}: {name}.{sub} has no type"
    assert {n for n, t in seen.items() if t == "raw"} == raw_allowed
    assert {n: seen[n] for n in numbers} == dict.fromkeys(numbers, "int")


@pytest.fixture
def rhel_inventory(tmp_path: Path) -> Path:
    inv = tmp_path / "hosts.yml"
    inv.write_text(
        "all:\n  children:\n    rhel:\n      hosts:\n        rhel9:\n"
        "          ansible_connection: local\n"
        "          ansible_python_interpreter: '{{ ansible_playbook_python }}'\n"
        "          ansible_become: false\n"
    )
    return inv


def test_redhat_path_in_check_mode(rhel_inventory: Path, tmp_path: Path) -> None:
    inv = rhel_inventory
    r = run_playbook(
        str(HERE / "playbooks/redhat_check.yml"), inv, "--check", "--diff",
        "--tags", "nvidia_driver_packages", "--skip-tags", "nvidia_driver_dnf",
        var_files=(),
        extra_vars={"nvidia_driver_branch": "550", "nvidia_driver_kernel_modules": "open",
                    "nvidia_driver_dnf_reposdir": str(tmp_path),
                    "nvidia_driver_dnf_versionlock_list": str(tmp_path / "versionlock.list")},
    )  # fmt: skip
    assert r.rc == 0 and not r.failed, r.describe()
    res = r.results["rhel9"]
    repo = json.dumps(res["Add NVIDIA's dnf repository"]["diff"])
    assert "compute/cuda/repos/rhel9/x86_64" in repo
    lock = json.dumps(res["Hold the driver packages on the branch"]["diff"])
    assert "nvidia-driver-3:550.*" in lock and "kmod-nvidia-open-dkms-3:550.*" in lock
    assert "BEGIN gpukit nvidia_driver" in lock
    assert set(r.changed["rhel9"]) == {"Add NVIDIA's dnf repository",
                                       "Hold the driver packages on the branch"}  # fmt: skip
    assert not list(tmp_path.glob("*.repo")) and not (tmp_path / "versionlock.list").exists()
