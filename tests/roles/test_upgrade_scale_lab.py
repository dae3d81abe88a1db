"""playbooks/upgrade.yml on a lab of 4 or more nodes: percent serial and the failure budget.

Runs on a lab whose GPUKIT_LAB_NODES has at least 4 nodes (`make scale`'s; for example
`gpu-a100=a100-sxm4-40gb-x8,gpu-t4=t4-x2,gpu-a100-b=a100-sxm4-40gb-x8,gpu-t4-b=t4-x2`), and is
skipped by name on smaller labs (`make test`'s). In a copy of the lab's inventory every node is
in one upgrade group `fleet` with `gpukit_upgrade_serial: "50%"`, so the first four nodes roll in
two batches of two (a fifth and later node of a larger lab are kept out with `skip` labels).

The change: every named device plugin config gets `flags.failOnInitError: true`, the value the
agent assumes without it. The rollout sees new content on every node (the config ConfigMap's
keys differ), so each node is cordoned, drained, moved to the versioned config, validated by the
conformance suite and uncordoned; the agent serves the same devices, so validation passes as
before. A Timeline watches the nodes for the whole of each run.

Story: `--check` with budget 0 lists four batches of one (the budget caps the 50% serial) and
changes nothing; with budget 1 the change rolls in two batches of two, never more than two
nodes unschedulable, each node validated; reverting it with budget 1 and the first node's
validation failing (its suite is handed an option it refuses) stops the rollout after batch 1:
that node cordoned and labelled failed, its batch mate done, the second batch untouched, and the
report says the next batch could have taken the rollout past its budget. The module's teardown
uncordons the nodes and converges the lab to its own inventory with site.yml.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from labplay import ROLL, PlayResult, plan_lines, report_lines, run_playbook
from labtools import SiteLab, release_nodes, site_lab

from gpukit.lab.config import load_spec
from gpukit.lab.observe import Timeline
from gpukit.provision.upgrade import MESSAGE_ANNOTATION, SKIP_LABEL, SKIP_VALUE, STATE_LABEL

NODES = 4
pytestmark = [
    pytest.mark.lab,
    # The fixture's first site.yml converges 4 new nodes (about 10 min on a loaded 2-core host).
    pytest.mark.timeout(3600),
    pytest.mark.skipif(len(load_spec().nodes) < NODES,
                       reason=f"needs a lab of {NODES} or more nodes (GPUKIT_LAB_NODES; make scale)"),
]  # fmt: skip

BATCH = re.compile(r"^batch (\d+) \(group fleet, ([^)]*)\): (.*)$")


@dataclass
class Lab(SiteLab):
    core: client.CoreV1Api
    hosts: list[str]  # the nodes the rollouts touch, in inventory order

    def set_vars(self, **values: Any) -> None:
        path = self.inventory / "group_vars" / "gpu_nodes.yml"
        doc = yaml.safe_load(path.read_text())
        doc.update(values)
        path.write_text(yaml.safe_dump(doc, sort_keys=False))

    def set_fail_on_init_error(self, on: bool) -> None:
        path = self.inventory / "group_vars" / "gpu_nodes.yml"
        doc = yaml.safe_load(path.read_text())
        for cfg in doc["gpukit_device_plugin_configs"].values():
            flags = cfg.setdefault("flags", {})
            if on:
                flags["failOnInitError"] = True
            else:
                flags.pop("failOnInitError", None)
        path.write_text(yaml.safe_dump(doc, sort_keys=False))

    def fail_validation(self, host: str | None) -> None:
        """Hand `host`'s validation an option the conformance suite refuses (pytest usage
        error): the rollout's validation step fails there, at once, every time."""
        path = self.inventory / "host_vars" / f"{host}.yml"
        for old in (self.inventory / "host_vars").glob("*.yml"):
            old.unlink()
        if host:
            path.write_text(yaml.safe_dump(
                {"gpukit_upgrade_conformance_args": ["--gpukit-scale-test-refused-option"]}))

    def upgrade(self, *args: str) -> PlayResult:
        return run_playbook("playbooks/upgrade.yml", self.inventory, *args, var_files=(),
                            timeout=2400)  # fmt: skip

    def converge(self, inventory: Path) -> PlayResult:
        return self.site(inventory=inventory, var_files=(), timeout=2400)


def batches(r: PlayResult) -> list[tuple[str, list[str]]]:
    """(serial text, hosts) of each planned batch, in order."""
    out = []
    for line in plan_lines(r):
        if m := BATCH.match(line):
            out.append((m.group(2), m.group(3).split(", ")))
    return out


@pytest.fixture(scope="module")
def lab(lab_cluster: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    base = site_lab(tmp_path_factory, "upgrade-scale")
    (base.inventory / "host_vars").mkdir(exist_ok=True)
    core = client.CoreV1Api()
    names = base.spec.node_names()
    hosts = [h for g in yaml.safe_load((base.inventory / "hosts.yml").read_text())["all"][
        "children"]["gpu_nodes"]["children"].values() for h in g["hosts"]][:NODES]  # fmt: skip
    lab = base.as_(Lab, core=core, hosts=hosts)
    release_nodes(core, names, STATE_LABEL, SKIP_LABEL)
    # Converged on the lab's own inventory before the edits.
    r = lab.converge(lab.original)
    assert r.rc == 0 and not r.failed, r.describe()
    # One upgrade group, half of it at a time; nodes beyond the first four left alone.
    lab.set_vars(gpukit_upgrade_group="fleet", gpukit_upgrade_serial="50%")
    for extra in names:
        if extra not in hosts:
            core.patch_node(extra, {"metadata": {"labels": {SKIP_LABEL: SKIP_VALUE}}})
    yield lab
    release_nodes(core, names, STATE_LABEL, SKIP_LABEL)
    r = lab.converge(lab.original)
    assert r.rc == 0 and not r.failed, r.describe()


def test_check_caps_the_percent_serial_at_the_failure_budget(lab: Lab) -> None:
    lab.set_fail_on_init_error(True)
    lab.set_vars(gpukit_upgrade_max_failed=0)
    with Timeline(lab.core) as seen:
        r = lab.upgrade("--check")
    assert r.rc == 0 and not r.failed, r.describe()
    planned = batches(r)
    assert [hosts for _, hosts in planned] == [[h] for h in lab.hosts], plan_lines(r)
    assert {serial for serial, _ in planned} == {"serial 1, 2 capped by the failure budget"}
    lines = plan_lines(r)
    assert ("batches of fleet hold at most 1 node(s): a batch never holds more nodes than may"
            " fail (gpukit_upgrade_max_failed 0 -> 0)") in lines, lines
    for h in lab.hosts:
        assert any(line.startswith(f"  {h}: sharing config ") and "failOnInitError" in line
                   for line in lines), lines  # fmt: skip
    assert all(not e.unschedulable and not e.state for e in seen.nodes), seen.nodes


def test_half_the_fleet_at_a_time_each_node_validated(lab: Lab) -> None:
    lab.set_fail_on_init_error(True)
    lab.set_vars(gpukit_upgrade_max_failed=1)
    t0 = time.monotonic()
    with Timeline(lab.core) as seen:
        r = lab.upgrade()
    seconds = time.monotonic() - t0
    print(f"rollout of {NODES} nodes, serial 50%: {seconds:.0f} s")
    assert r.rc == 0 and not r.failed, r.describe()
    first, second = lab.hosts[:2], lab.hosts[2:]
    assert batches(r) == [("serial 2", first), ("serial 2", second)], plan_lines(r)
    assert plan_lines(r)[-1] == ("4 node(s) in 2 batch(es); the rollout stops after 2 failed"
                                 " node(s), and before a batch that could take it past that")
    assert report_lines(r)[:NODES] == [f"{h}: upgraded and validated" for h in lab.hosts]
    # Every node went through every step; two at a time: the second batch began after the
    # first was done, and never more than two nodes were unschedulable.
    for h in lab.hosts:
        assert seen.states(h)[-len(ROLL):] == ROLL, (h, seen.states(h))
        assert "Validate the node with the conformance suite" in r.results[h]
        assert r.results[h]["Validate the node with the conformance suite"].get("rc") == 0
    done = [seen.first(h, "done") for h in first]
    cordoned = [seen.first(h, "cordoned") for h in second]
    assert None not in done and None not in cordoned
    assert max(d for d in done if d) < min(c for c in cordoned if c)
    assert seen.max_unschedulable() == 2
    for h in lab.hosts:
        node = lab.core.read_node(h)
        assert not node.spec.unschedulable and node.metadata.labels[STATE_LABEL] == "done"


def test_a_failed_node_stops_the_rollout_before_a_batch_that_could_pass_the_budget(
        lab: Lab) -> None:
    lab.set_fail_on_init_error(False)  # back to the lab's content, on every node
    lab.set_vars(gpukit_upgrade_max_failed=1)
    bad, mate = lab.hosts[0], lab.hosts[1]
    untouched = lab.hosts[2:]
    lab.fail_validation(bad)
    try:
        with Timeline(lab.core) as seen:
            r = lab.upgrade()
    finally:
        lab.fail_validation(None)
    assert r.rc != 0, "a failed node must fail the play"
    assert [hosts for _, hosts in batches(r)] == [[bad, mate], untouched], plan_lines(r)
    report = report_lines(r)
    assert any(line.startswith(f"{bad}: FAILED, left cordoned: Validate the node with the"
                               " conformance suite") for line in report), report  # fmt: skip
    assert f"{mate}: upgraded and validated" in report, report
    for h in untouched:
        assert f"{h}: not touched (the rollout stopped before its batch)" in report, report
    assert ("the rollout stopped before batch 2: 1 node(s) failed, its 2 node(s) could take the"
            " rollout past its stop point (2 failed)") in report, report
    assert "rollout STOPPED: 1 upgraded, 1 failed, 2 not reached" in str(r.results)
    # The failed node: cordoned, labelled failed, the reason on it, after its validation began.
    assert seen.states(bad)[-3:] == ["upgrading", "validating", "failed"], seen.states(bad)
    node = lab.core.read_node(bad)
    assert node.spec.unschedulable is True
    assert node.metadata.labels[STATE_LABEL] == "failed"
    assert node.metadata.annotations[MESSAGE_ANNOTATION].startswith(
        "Validate the node with the conformance suite")
    assert seen.states(mate)[-len(ROLL):] == ROLL
    # The second batch was never touched: schedulable throughout, still `done` from before.
    for h in untouched:
        events = seen.node_events(h)
        assert events and all(not e.unschedulable and e.state == "done" for e in events), events
