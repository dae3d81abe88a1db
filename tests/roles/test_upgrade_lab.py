"""playbooks/upgrade.yml on the lab: a driver branch change rolls node by node.

The tests share one lab and run in order. The inventory is a copy of the lab's (this
instance's) that the tests edit the way a user would (group_vars/gpu_nodes.yml's
`nvidia_driver_branch`). A Timeline watches nodes and pods for the whole of each run, so
the order of each node's states, the number of unschedulable nodes at any moment and the
fate of pods are observed, not inferred from the play's output.

Story: the lab converged on 550; `--check` with 570 lists the batches and changes nothing;
a rollout to 570 with the new driver's post-install failing on the first node stops there
(that node cordoned and labelled failed, the other untouched); after the fix a rerun
resumes (the failed node retried, then the other), evicting and rescheduling a GPU
Deployment's pod and waiting for a GPU Job to finish; a third run touches nothing. The
lab is left on 570; the module's fixture converges it to the inventory first.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest
from kubernetes import client
from labplay import (
    ROLL,
    assert_nothing_rolled,
    branch_version,
    plan_lines,
    report_lines,
)
from labtools import DriverLab, delete_namespace, release_nodes, site_lab

from gpukit.lab.images import SHELL
from gpukit.lab.observe import Timeline
from gpukit.provision.upgrade import MESSAGE_ANNOTATION, STATE_LABEL

pytestmark = pytest.mark.lab

FIRST, SECOND = "gpu-a100", "gpu-t4"  # batch order: group a100_nodes, then t4_nodes
NS = "gpukit-upgrade-test"
FAIL_SWITCH = "/etc/gpukit-lab/fail-postinst"


@dataclass
class Lab(DriverLab):
    results: Path

    def installed_driver(self, node: str) -> str:
        return self.sh(node, "dpkg-query -W -f='${Version}' nvidia-driver").strip()

    def node(self, name: str) -> Any:
        return self.core.read_node(name)


def validation_failures(lab: Lab) -> str:
    """The conformance failures of the rollout's validations (JUnit files per node)."""
    out = []
    for f in sorted(lab.results.glob("upgrade-*.xml")):
        root = ElementTree.parse(f).getroot()
        for case in root.iter("testcase"):
            for bad in [*case.findall("failure"), *case.findall("error")]:
                out.append(f"{f.name} {case.get('name')}: {(bad.get('message') or '')[:300]}")
    return "\n".join(out)


@pytest.fixture(scope="module")
def lab(lab_cluster: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    base = site_lab(tmp_path_factory, "upgrade")
    results = tmp_path_factory.mktemp("upgrade-results")
    (base.inventory / "group_vars" / "all.yml").write_text(
        (base.inventory / "group_vars" / "all.yml").read_text()
        + f"\ngpukit_upgrade_results_dir: {results}\n")  # fmt: skip
    lab = base.as_(Lab, core=client.CoreV1Api(), results=results)
    # A clean start: no fail switch, nodes schedulable, no upgrade state from an earlier run,
    # and the nodes as the inventory declares (550).
    for name in (FIRST, SECOND):
        lab.sh(name, f"rm -f {FAIL_SWITCH}")
    release_nodes(lab.core, [FIRST, SECOND], STATE_LABEL)
    r = lab.site(var_files=())
    assert r.rc == 0 and not r.failed, r.describe()
    delete_namespace(lab.core, NS, timeout=60)
    lab.core.create_namespace({"metadata": {"name": NS}})
    yield lab
    delete_namespace(lab.core, NS, timeout=60)


def test_check_lists_the_batches_and_changes_nothing(lab: Lab) -> None:
    lab.set_branch("570")
    with Timeline(lab.core) as seen:
        r = lab.upgrade("--check")
    assert r.rc == 0 and not r.failed, r.describe()
    lines = plan_lines(r)
    assert lines.index(f"batch 1 (group a100_nodes, serial 1): {FIRST}") < lines.index(
        f"batch 2 (group t4_nodes, serial 1): {SECOND}")  # fmt: skip
    old, new = branch_version("550"), branch_version("570")
    for node in (FIRST, SECOND):
        assert f"  {node}: driver: upgrade nvidia-driver {old}-1 -> {new}-1" in lines
        assert f"  {node}: driver: {new} is not the running driver ({old})" in lines
    assert lines[-1] == "2 node(s) in 2 batch(es); the rollout stops after 1 failed node(s)"
    assert "check mode: 2 node(s) would be upgraded" in str(r.results)
    # Nothing happened: no cordon, no state label, the old driver installed and running.
    assert all(not e.unschedulable and not e.state for e in seen.nodes), seen.nodes
    for node in (FIRST, SECOND):
        assert lab.installed_driver(node) == f"{old}-1"
        assert lab.running_driver(node) == old


def test_injected_failure_stops_the_rollout(lab: Lab) -> None:
    lab.set_branch("570")
    lab.sh(FIRST, f"mkdir -p /etc/gpukit-lab && echo nvidia-driver-570 > {FAIL_SWITCH}")
    with Timeline(lab.core) as seen:
        r = lab.upgrade()
    assert r.rc != 0, "a failed node must fail the play"
    report = report_lines(r)
    assert any(line.startswith(f"{FIRST}: FAILED, left cordoned: Install the driver packages")
               for line in report), report  # fmt: skip
    assert f"{SECOND}: not touched (the rollout stopped before its batch)" in report
    # The failed node: cordoned, labelled failed, the reason on it; it went through the
    # steps up to the upgrade.
    assert seen.states(FIRST) == ["", "cordoned", "draining", "upgrading", "failed"]
    node = lab.node(FIRST)
    assert node.spec.unschedulable is True
    assert node.metadata.labels[STATE_LABEL] == "failed"
    assert node.metadata.annotations[MESSAGE_ANNOTATION].startswith("Install the driver packages")
    # The other node was never touched.
    assert seen.node_events(SECOND) and all(
        not e.unschedulable and not e.state for e in seen.node_events(SECOND))
    assert lab.installed_driver(SECOND) == f"{branch_version('550')}-1"
    assert lab.running_driver(SECOND) == branch_version("550")


def _gpu_pod_spec(node: str | None, command: list[str]) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 1,
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        "containers": [{
            "name": "main", "image": SHELL, "imagePullPolicy": "Never",
            "command": command,
            "resources": {"limits": {"nvidia.com/gpu": "1"}},
        }],
    }  # fmt: skip
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return spec


def _start_deployment(lab: Lab) -> client.V1Pod:
    apps = client.AppsV1Api()
    labels = {"app": "gpu-service"}
    apps.create_namespaced_deployment(NS, {
        "metadata": {"name": "gpu-service"},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels},
                              "spec": _gpu_pod_spec(None, ["sleep", "3600"])}},
    })  # fmt: skip
    client.PolicyV1Api().create_namespaced_pod_disruption_budget(NS, {
        "metadata": {"name": "gpu-service"},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": labels}},
    })  # fmt: skip
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        pods = lab.core.list_namespaced_pod(NS, label_selector="app=gpu-service").items
        running = [p for p in pods if p.status.phase == "Running"]
        if running:
            return running[0]
        time.sleep(1)
    raise AssertionError("the GPU Deployment's pod did not start")


GATE = "/run/gpukit-upgrade-gate"


def _start_gated_job(lab: Lab, node: str) -> client.V1Pod:
    """A GPU Job on `node` that runs until the test opens its gate (a file on the node)."""
    lab.sh(node, f"mkdir -p {GATE} && rm -f {GATE}/open")
    spec = _gpu_pod_spec(node, ["sh", "-c", "while [ ! -e /gate/open ]; do sleep 1; done"])
    spec["restartPolicy"] = "Never"
    spec["containers"][0]["volumeMounts"] = [{"name": "gate", "mountPath": "/gate"}]
    spec["volumes"] = [{"name": "gate", "hostPath": {"path": GATE, "type": "Directory"}}]
    client.BatchV1Api().create_namespaced_job(NS, {
        "metadata": {"name": "gpu-job"},
        "spec": {"backoffLimit": 0, "template": {"metadata": {"labels": {"app": "gpu-job"}},
                                                 "spec": spec}},
    })  # fmt: skip
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        pods = lab.core.list_namespaced_pod(NS, label_selector="app=gpu-job").items
        if pods and pods[0].status.phase == "Running":
            return pods[0]
        time.sleep(1)
    raise AssertionError("the GPU Job's pod did not start")


def _open_gate_when_cordoned(lab: Lab, seen: Timeline, node: str,
                             opened: dict[str, float]) -> threading.Thread:  # fmt: skip
    """Let the Job finish a few seconds after the rollout has cordoned its node (the
    rollout must be waiting for it then)."""

    def run() -> None:
        deadline = time.monotonic() + 1200
        while seen.first(node, "cordoned") is None and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(8)
        lab.sh(node, f"touch {GATE}/open")
        opened["at"] = time.monotonic()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


@pytest.mark.timeout(1500)  # two nodes, each drained, rebooted and validated
def test_rerun_after_the_fix_resumes_node_by_node(lab: Lab) -> None:
    # This time the branch comes from -e, the inventory's files say 550 again: each node's
    # validation must hold it to what the play applied (570), not to the files.
    lab.set_branch("550")
    lab.sh(FIRST, f"rm -f {FAIL_SWITCH}")
    assert lab.node(FIRST).spec.unschedulable is True  # still cordoned from the failure
    service = _start_deployment(lab)
    # The first node is cordoned, so the service runs on the second.
    assert service.spec.node_name == SECOND
    job = _start_gated_job(lab, SECOND)
    gate: dict[str, float] = {}
    with Timeline(lab.core, NS) as seen:
        opener = _open_gate_when_cordoned(lab, seen, SECOND, gate)
        r = lab.upgrade("-e", "nvidia_driver_branch=570")
        opener.join(timeout=5)
    assert r.rc == 0 and not r.failed, r.describe() + validation_failures(lab)
    assert len(seen.errors) < 5, seen.errors
    lines = plan_lines(r)
    assert f"  {FIRST}: a previous rollout left it failed" in lines
    assert report_lines(r) == [f"{FIRST}: upgraded and validated",
                               f"{SECOND}: upgraded and validated"]  # fmt: skip
    # Each node went through every step in order, one node after the other, and never
    # were two nodes unschedulable at once (serial 1).
    assert seen.states(FIRST) == ["failed", *ROLL]
    assert seen.states(SECOND) == ["", *ROLL]
    done_first, cordon_second = seen.first(FIRST, "done"), seen.first(SECOND, "cordoned")
    assert done_first is not None and cordon_second is not None and done_first < cordon_second
    assert seen.max_unschedulable() == 1
    new = branch_version("570")
    for node in (FIRST, SECOND):
        # Uncordoned only after validation; the new driver appeared during the upgrade step.
        periods = seen.unschedulable_periods(node)
        assert len(periods) == 1 and periods[0][1] is not None, periods
        validating = seen.first(node, "validating")
        assert validating is not None and periods[0][1] > validating
        upgrading = seen.first(node, "upgrading")
        upgraded = next(e.at for e in seen.node_events(node) if e.driver == new)
        # (the node agent relabels the driver once the node is back: before the uncordon)
        assert upgrading is not None and upgrading < upgraded < periods[0][1]
        assert lab.installed_driver(node) == f"{new}-1"
        assert lab.running_driver(node) == new
        n = lab.node(node)
        assert not n.spec.unschedulable and n.metadata.labels[STATE_LABEL] == "done"
    # The GPU Job on the second node, running when that node was cordoned, ran to
    # completion: the rollout waited for it before draining.
    job_pods = [e for e in seen.pod_events("gpu-job") if e.uid == job.metadata.uid]
    succeeded = [e.at for e in job_pods if e.phase == "Succeeded"]
    assert gate and succeeded, [(e.kind, e.phase) for e in job_pods]
    draining_second = seen.first(SECOND, "draining")
    assert draining_second is not None and cordon_second < gate["at"] < succeeded[0]
    assert succeeded[0] < draining_second
    assert not [e for e in job_pods if e.deleting and e.at < succeeded[0]]
    # The service's pod was evicted when its node drained and rescheduled on the node
    # that was already done; the Deployment is whole again.
    gone = [e.at for e in seen.pod_events("gpu-service")
            if e.uid == service.metadata.uid and e.kind == "DELETED"]  # fmt: skip
    assert gone and draining_second <= gone[0], "the service pod was not evicted by the drain"
    replacements = [e for e in seen.pod_events("gpu-service")
                    if e.uid != service.metadata.uid and e.phase == "Running"]  # fmt: skip
    assert replacements and replacements[0].node == FIRST
    done_second = seen.first(SECOND, "done")
    assert done_second is not None and replacements[0].at < done_second
    apps = client.AppsV1Api()
    dep = apps.read_namespaced_deployment("gpu-service", NS)
    assert dep.status.available_replicas == 1


def test_a_third_run_touches_nothing(lab: Lab) -> None:
    lab.set_branch("570")  # the files catch up with the -e of the rerun
    with Timeline(lab.core) as seen:
        r = lab.upgrade()
    assert_nothing_rolled(r, seen.nodes, (FIRST, SECOND))
