"""Run gpukit's playbooks the way a user does (ansible-playbook), and read what happened.

Results come from the json stdout callback: per host, the names of the tasks that changed
(and failed), the recap counts, and the diffs in --diff runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
# The lab inventory's provisioning settings (its apt repository, the agent image and the mock
# NVML mounts): the roles' lab tests run their plays with them, as site.yml on the lab does.
LAB_VARS = REPO / "inventories" / "lab" / "group_vars" / "all.yml"
# The upgrade-state labels a node goes through in a complete rollout, in order.
ROLL = ["cordoned", "draining", "upgrading", "validating", "done"]


@dataclass
class PlayResult:
    rc: int
    seconds: float
    stats: dict[str, dict[str, int]]
    changed: dict[str, list[str]] = field(default_factory=dict)
    failed: dict[str, list[str]] = field(default_factory=dict)
    results: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    stderr: str = ""

    def changed_count(self, host: str) -> int:
        return self.stats.get(host, {}).get("changed", 0)

    def describe(self) -> str:
        return json.dumps(
            {"rc": self.rc, "changed": self.changed, "failed": self.failed,
             "stats": self.stats, "stderr": self.stderr[-3000:]}, indent=1)  # fmt: skip


def _msg(res: dict[str, Any]) -> str:
    return str(res.get("msg") or res.get("stderr") or "")[:500]


def run_playbook(
    playbook: str,
    inventory: Path | str,
    *args: str,
    extra_vars: dict[str, Any] | None = None,
    var_files: Sequence[Path] = (LAB_VARS,),
    timeout: float = 900,
    env: dict[str, str] | None = None,
    command: Sequence[str] = (str(BIN / "ansible-playbook"),),
    cwd: Path = REPO,
    inherit_env: bool = True,
) -> PlayResult:
    """`env` adds to this process's environment, or with inherit_env=False is the whole of it
    (a play that must see none of the caller's PYTHONPATH or ANSIBLE_* settings)."""
    argv = [*command, "-i", str(inventory), playbook]
    for f in var_files:
        argv += ["-e", f"@{f}"]
    if extra_vars:
        argv += ["-e", json.dumps(extra_vars)]
    argv += list(args)
    full_env = {
        **(os.environ if inherit_env else {}),
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json",
        "ANSIBLE_CALLBACK_RESULT_FORMAT": "json",
        "ANSIBLE_FORCE_COLOR": "0",
        "ANSIBLE_NOCOLOR": "1",
        **(env or {}),
    }
    t0 = time.monotonic()
    proc = subprocess.run(argv, cwd=cwd, env=full_env, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip
    seconds = time.monotonic() - t0
    try:
        doc = json.loads(proc.stdout[proc.stdout.index("{") :])
    except ValueError:
        return PlayResult(proc.returncode, seconds, {}, stderr=proc.stdout + proc.stderr)
    out = PlayResult(proc.returncode, seconds, doc.get("stats", {}), stderr=proc.stderr)
    for play in doc.get("plays", []):
        for task in play.get("tasks", []):
            # "role : task" -> "task": tests name tasks as the role files do.
            name = task["task"]["name"].split(" : ", 1)[-1]
            for host, res in task.get("hosts", {}).items():
                out.results.setdefault(host, {})[name] = res
                if res.get("changed"):
                    out.changed.setdefault(host, []).append(name)
                if res.get("failed") or res.get("unreachable"):
                    out.failed.setdefault(host, []).append(f"{name}: {_msg(res)}")
    return out


def plan_lines(r: PlayResult) -> list[str]:
    """What playbooks/upgrade.yml's plan play showed."""
    for res in r.results.values():
        if "Show the plan" in res:
            return list(res["Show the plan"]["msg"])
    raise AssertionError(f"no plan in the output: {r.describe()}")


def report_lines(r: PlayResult) -> list[str]:
    """What playbooks/upgrade.yml's report play showed."""
    for res in r.results.values():
        if "Show each node's result" in res:
            return list(res["Show each node's result"]["msg"])
    raise AssertionError(f"no report in the output: {r.describe()}")


def assert_nothing_rolled(r: PlayResult, node_events: Any, hosts: tuple[str, ...]) -> None:
    """An upgrade.yml run that found every node matching: no batch, no node unschedulable
    at any moment (`node_events`: a gpukit.lab.observe Timeline's nodes), nothing changed."""
    assert r.rc == 0 and not r.failed, r.describe()
    lines = plan_lines(r)
    for host in hosts:
        assert f"{host}: matches the inventory, not touched" in lines
    assert lines[-1].startswith("0 node(s) in 0 batch(es)")
    assert all(not e.unschedulable for e in node_events)
    assert all(r.changed_count(h) == 0 for h in hosts), r.changed


def branch_version(branch: str) -> str:
    """The driver version the lab's stand-in packages ship on `branch`."""
    from gpukit.lab.packages import BRANCHES

    return next(b.driver_version for b in BRANCHES if b.name == branch)
