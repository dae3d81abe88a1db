"""Checks before touching hosts: every playbook that acts on GPU nodes first runs the
gpukit.gpu.preflight play, which validates every GPU node's declaration on the controller
through the inventory model (gpukit.inventory.check, as `gpukit inventory check`), reports every
problem at once naming host, variable and value, and ends the playbook before any connection.

No host is reachable here: the example fleet's addresses are documentation ranges, and ssh is a
stand-in that records each call and fails as an unreachable host does. A control run shows the
stand-in would see a contact (a valid fleet passes the preflight and reaches the nodes' facts).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from counted_playbook import counts
from labplay import BIN, REPO

from gpukit import inventory

EXAMPLE = REPO / "inventories" / "example"
PLAYBOOKS = ["site.yml", *sorted(f"playbooks/{p.name}" for p in (REPO / "playbooks").glob("*.yml"))]
PREFLIGHT_PLAY = "PLAY [Check every GPU node's declaration before touching any host]"
PREFLIGHT_TASK = "TASK [Validate the GPU nodes' declarations through the inventory model]"
ALL = sorted([f"gpu-{g}-0{i}" for g in ("a100", "h100", "t4") for i in (1, 2, 3)]
             + [f"gpu-{g}-0{i}" for g in ("h200", "b200") for i in (1, 2)])


def _edit(path: Path, change: Callable[[Any], None]) -> None:
    doc = yaml.safe_load(path.read_text())
    change(doc)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def broken_example(tmp: Path) -> Path:
    """A copy of inventories/example with: the fleet's time-sliced config at `replicas: 0`, a
    config with a typo (`timeSlicng`), one with an unknown sharing mode (`spacePartitioning`),
    the A100 80GB group on a layout of `3g.20gb` (an A100 40GB profile), and gpu-t4-03 in the
    h100_nodes group too (its GPUs, config, layout and labels disagree with t4_nodes')."""
    inv = tmp / "broken"
    shutil.copytree(EXAMPLE, inv)

    def plugin_configs(doc: dict[str, Any]) -> None:
        configs = doc["gpukit_device_plugin_configs"]
        configs["time-sliced"]["sharing"]["timeSlicing"]["resources"][0]["replicas"] = 0
        share = {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}
        configs["typo"] = {"version": "v1", "sharing": {"timeSlicng": share}}
        configs["partitioned"] = {"version": "v1", "sharing": {"spacePartitioning": share}}

    def layout_40gb(doc: dict[str, Any]) -> None:
        doc["gpukit_mig_configs"]["halves-40gb"] = [
            {"devices": "all", "mig-enabled": True, "mig-devices": {"3g.20gb": 2}}]

    def two_hardware_groups(doc: dict[str, Any]) -> None:
        doc["all"]["children"]["gpu_nodes"]["children"]["h100_nodes"]["hosts"]["gpu-t4-03"] = None

    _edit(inv / "group_vars/gpu_nodes/device_plugin.yml", plugin_configs)
    _edit(inv / "group_vars/gpu_nodes/sharing.yml", layout_40gb)
    _edit(inv / "group_vars/a100_nodes/sharing.yml",
          lambda d: d.update(gpukit_mig_config="halves-40gb"))
    _edit(inv / "hosts.yml", two_hardware_groups)
    return inv


# A problem every host shares (the configs every host deploys) is one line naming the hosts
# (issue 29): the first five, then how many more.
IN_ORDER = [d.host for d in inventory.load(EXAMPLE).nodes]  # as the inventory lists them
EVERY_HOST = f"hosts {', '.join(IN_ORDER[:5])} and {len(IN_ORDER) - 5} more: "
EXPECTED = [
    f"{EVERY_HOST}gpukit_device_plugin_configs.time-sliced.sharing.timeSlicing.resources[0]"
    ".replicas: 0 is not >= 2",
    f"{EVERY_HOST}gpukit_device_plugin_configs.typo.sharing.timeSlicng: unknown field "
    "(did you mean 'timeSlicing'?",
    f"{EVERY_HOST}gpukit_device_plugin_configs.partitioned.sharing.spacePartitioning: "
    "unknown field (known: mps, timeSlicing)",
    "hosts gpu-a100-01, gpu-a100-02: gpukit_mig_configs.halves-40gb[0].mig-devices: '3g.20gb' "
    "is not a MIG profile of A100-80GB",
    "host gpu-t4-03: gpukit_gpu: {'product': 'Tesla T4', 'count': 4, 'memory_mib': 15360} comes "
    "from group t4_nodes, but group h100_nodes sets {'product': 'NVIDIA H100 80GB HBM3', "
    "'count': 8, 'memory_mib': 81559} (neither group is inside the other",
    "host gpu-t4-03: gpukit_device_plugin_config: 'time-sliced' comes from group t4_nodes, "
    "but group h100_nodes sets 'default'",
    "host gpu-t4-03: gpukit_mig_config: None comes from group t4_nodes, but group h100_nodes "
    "sets 'all-disabled'",
    "host gpu-t4-03: gpukit_node_labels: {'example.com/gpu-pool': 't4-shared', "
    "'example.com/workload': 'inference'} comes from group t4_nodes, but group h100_nodes sets "
    "{'example.com/gpu-pool': 'h100', 'example.com/workload': 'training'}",
]  # fmt: skip


@pytest.fixture
def fake_ssh(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """Ansible's environment with ssh replaced by a stand-in that logs each call and fails like
    an unreachable host (exit 255); Ansible's own files in tmp_path."""
    calls = tmp_path / "ssh-calls.log"
    ssh = tmp_path / "bin/ssh"
    ssh.parent.mkdir()
    ssh.write_text(f'#!/bin/sh\necho "$*" >> {calls}\necho "ssh: connect: no route" >&2\n'
                   "exit 255\n")  # fmt: skip
    ssh.chmod(0o755)
    (tmp_path / "ansible-tmp").mkdir()
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "ANSIBLE_SSH_EXECUTABLE": str(ssh),
        "ANSIBLE_HOME": str(tmp_path / "ansible-home"),
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-tmp"),
        "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.default",
        "ANSIBLE_CALLBACK_RESULT_FORMAT": "json",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
        "ANSIBLE_TIMEOUT": "5",
        "ANSIBLE_SSH_RETRIES": "0",
    }
    return env, calls


def headers(out: str, kind: str) -> list[str]:
    """The PLAY [...] or TASK [...] headers of the default callback's output, in order."""
    return [m.group(0) for m in re.finditer(rf"^{kind} \[.*\]", out, re.M)]


def failures(out: str) -> list[dict[str, Any]]:
    """The results of failed tasks (`fatal: [host]: FAILED! => {...}`)."""
    return [json.loads(line.split(" => ", 1)[1]) for line in out.splitlines()
            if line.startswith("fatal: [")]  # fmt: skip


def play(playbook: str, inv: Path, env: dict[str, str], *args: str
         ) -> subprocess.CompletedProcess[str]:  # fmt: skip
    return subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inv), playbook, *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)  # fmt: skip


@pytest.mark.parametrize("playbook", PLAYBOOKS)
def test_a_broken_fleet_fails_in_the_preflight_before_any_host_is_contacted(
    playbook: str, tmp_path: Path, fake_ssh: tuple[dict[str, str], Path]
) -> None:
    env, calls = fake_ssh
    inv = broken_example(tmp_path)
    r = play(playbook, inv, env, "--check")
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    # The only play that ran is the preflight; its one task failed, once, on the controller.
    assert headers(r.stdout, "PLAY") == [PREFLIGHT_PLAY], out
    assert headers(r.stdout, "TASK") == [PREFLIGHT_TASK], out
    (failed,) = failures(r.stdout)
    # Every problem at once, each naming host, variable and value.
    problems = failed["problems"]
    assert len(problems) == len(EXPECTED), problems
    for needle in EXPECTED:
        assert any(p.startswith(needle) for p in problems), f"missing: {needle}\n{problems}"
    assert failed["msg"].startswith(f"{inv}: {len(EXPECTED)} problem(s) in the GPU nodes' declarations"
                                    " (nothing was touched):\n  host"), failed["msg"][:300]
    assert all(f"\n  {p}" in failed["msg"] for p in problems)
    # Nothing was contacted.
    assert "UNREACHABLE" not in out and "unreachable=1" not in out, out
    assert "Gathering Facts" not in out
    assert not calls.exists(), calls.read_text()


def test_the_stand_in_ssh_sees_a_contact_once_the_preflight_passes(
    tmp_path: Path, fake_ssh: tuple[dict[str, str], Path]
) -> None:
    """The control of the test above: with the example fleet as it is, the preflight passes and
    the next play reaches for the node (through the stand-in, which fails it)."""
    env, calls = fake_ssh
    r = play("site.yml", EXAMPLE, env, "--check", "--limit", "gpu-t4-01")
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "ok: [gpu-t4-01]" in out  # the preflight, run once for the limited host
    assert "UNREACHABLE" in out and "198.51.100.31" in calls.read_text(), out  # its address


def test_declarations_given_with_extra_vars_are_checked(
    tmp_path: Path, fake_ssh: tuple[dict[str, str], Path]
) -> None:
    """-e wins over the inventory in the plays: the preflight checks what they would apply."""
    env, calls = fake_ssh
    r = play("playbooks/upgrade.yml", EXAMPLE, env, "--check", "-e", "nvidia_driver_branch=55x")
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    # One value for every host: one problem naming them (issue 29), not 13 lines.
    assert (f"{EVERY_HOST}nvidia_driver_branch: '55x' is not a driver branch such as "
            '"550"') in out, out  # fmt: skip
    assert "1 problem(s)" in out and "UNREACHABLE" not in out and not calls.exists()


def test_the_preflight_validates_each_host_once_and_hands_it_its_declaration(
    tmp_path: Path, fake_ssh: tuple[dict[str, str], Path]
) -> None:
    """Counted, not timed: the preflight validates every host once and parses each distinct
    device plugin config once (13 hosts share 3 configs from group_vars), then each host holds
    the model's result as gpukit_declaration (the roles read it instead of validating again)."""
    env, calls = fake_ssh
    counted = tmp_path / "calls.txt"
    r = subprocess.run([sys.executable, str(REPO / "tests/roles/counted_playbook.py"),
                        str(counted), "-i", str(EXAMPLE), "gpukit.gpu.preflight", "-v"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    lines = counted.read_text().splitlines()
    assert sorted(ln.split()[1] for ln in lines if ln.startswith("node_from_vars ")) == ALL
    configs = {json.dumps(c, sort_keys=True) for h in ALL
               for c in inventory.load(EXAMPLE).node(h).plugin_configs.values()}  # fmt: skip
    assert counts(counted)["parse_config"] == len(configs) == 3
    assert counts(counted)["sharing"] == 0
    # The second task hands each host its own result.
    handed = re.findall(r"^ok: \[(\S+)\] => .*\n?", r.stdout, re.M)
    assert sorted(set(handed)) == ALL, r.stdout[-3000:]
    assert '"gpukit_declaration"' in r.stdout and '"expected_resources"' in r.stdout
    assert not calls.exists()


def test_the_preflight_playbook_passes_the_example_fleet(
    tmp_path: Path, fake_ssh: tuple[dict[str, str], Path]
) -> None:
    env, calls = fake_ssh
    r = play("gpukit.gpu.preflight", EXAMPLE, env, "-v")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "inventories/example: 13 GPU node(s), every declaration valid" in out
    assert not calls.exists()


# --- the inventory model: a host in two groups that disagree ---------------------------------


def _two_groups(tmp: Path) -> Path:
    inv = tmp / "inv"
    shutil.copytree(EXAMPLE, inv)
    _edit(inv / "hosts.yml", lambda d: d["all"]["children"]["gpu_nodes"]["children"][
        "h100_nodes"]["hosts"].update({"gpu-a100-02": None}))  # fmt: skip
    return inv


def test_a_host_in_two_hardware_groups_that_disagree_is_refused(tmp_path: Path) -> None:
    inv = _two_groups(tmp_path)
    with pytest.raises(inventory.InventoryError) as exc:
        inventory.load(inv)
    problems = {p.variable: p for p in exc.value.problems}
    assert {p.host for p in exc.value.problems} == {"gpu-a100-02"}
    # Declaration variables both groups set, differently; nvidia_driver_branch comes from
    # h100_nodes over gpu_nodes (a child over its parent: not a conflict).
    assert sorted(problems) == ["gpukit_device_plugin_config", "gpukit_gpu", "gpukit_mig_config",
                                "gpukit_node_labels"]  # fmt: skip
    gpu = problems["gpukit_gpu"]
    assert gpu.value == {"product": "NVIDIA H100 80GB HBM3", "count": 8, "memory_mib": 81559}
    assert "comes from group h100_nodes, but group a100_nodes sets {'product': " in gpu.message
    # The same through the command line.
    r = subprocess.run([sys.executable, "-m", "gpukit", "inventory", "check", str(inv)],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 2 and "host gpu-a100-02: gpukit_gpu: {'product': 'NVIDIA H100" in (
        r.stderr), r.stderr


def test_a_host_level_value_settles_two_groups(tmp_path: Path) -> None:
    """A value the host sets itself (host_vars, -e) wins over both groups: no conflict left for
    that variable."""
    inv = _two_groups(tmp_path)
    (inv / "host_vars/gpu-a100-02").mkdir()
    (inv / "host_vars/gpu-a100-02/hardware.yml").write_text(
        "gpukit_gpu: {product: NVIDIA A100-SXM4-80GB, count: 8, memory_mib: 81920}\n"
        "gpukit_node_labels: {example.com/gpu-pool: a100-mig}\n")
    extra = {"gpu-a100-02": {"gpukit_device_plugin_config": "mig-mixed",
                             "gpukit_mig_config": "a100-80gb-mixed"}}  # fmt: skip
    with pytest.raises(inventory.InventoryError) as exc:
        inventory.load(inv)
    assert sorted(p.variable for p in exc.value.problems) == ["gpukit_device_plugin_config",
                                                              "gpukit_mig_config"]  # fmt: skip
    node = inventory.load(inv, host_vars=extra).node("gpu-a100-02")
    assert node.gpu.product == "NVIDIA A100-SXM4-80GB" and node.mig_config_name == "a100-80gb-mixed"


# --- the agent image's version against the collection's (issue 29) ---------------------------

IMAGE = "registry.example.com/platform/gpukit-node-agent"


def test_an_agent_image_of_another_release_is_refused_unless_pinned(
    tmp_path: Path, fake_ssh: tuple[dict[str, str], Path]
) -> None:
    """The example fleet runs the image of the collection's version; another release's image is
    one line naming the variable and both versions, before any host; pinned, a warning."""
    from gpukit.provision import image_version

    env, calls = fake_ssh
    version = yaml.safe_load((REPO / "collections/ansible_collections/gpukit/gpu/galaxy.yml")
                             .read_text())["version"]  # fmt: skip
    assert inventory.load(EXAMPLE).nodes and f"{IMAGE}:{version}" in (
        EXAMPLE / "group_vars/gpu_nodes/device_plugin.yml").read_text()
    r = play("gpukit.gpu.preflight", EXAMPLE, env, "-e", f"gpukit_device_plugin_image={IMAGE}:0.0.9")
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    (failed,) = failures(r.stdout)
    assert failed["problems"] == [
        f"gpukit_device_plugin_image: '{IMAGE}:0.0.9' is version 0.0.9, the collection gpukit.gpu"
        f" is {version}; use the image of version {version}, or set"
        f" {image_version.PINNED_VARIABLE}: true to deploy this one on purpose"]  # fmt: skip
    pinned = play("gpukit.gpu.preflight", EXAMPLE, env, "-e",
                  f"gpukit_device_plugin_image={IMAGE}:v0.0.9",
                  "-e", "gpukit_device_plugin_image_pinned=true")  # fmt: skip
    out = pinned.stdout + pinned.stderr
    assert pinned.returncode == 0, out
    assert "[WARNING]: gpukit_device_plugin_image:" in out and "is version 0.0.9" in out, out
    # A tag that is no release version (the lab's :dev) is deployed with a warning.
    dev = play("gpukit.gpu.preflight", EXAMPLE, env, "-e", f"gpukit_device_plugin_image={IMAGE}:dev")
    out = dev.stdout + dev.stderr
    assert dev.returncode == 0, out
    assert "is not tagged with a release version" in out, out
    assert not calls.exists()
