"""Rolling upgrade plans: which nodes, which batches, when to stop, what to report."""

from __future__ import annotations

from typing import Any

import pytest

from gpukit.provision import upgrade
from gpukit.provision.upgrade import NodeState, UpgradeSpecError


def node(host: str, group: str = "a100", serial: Any = 1,
         changes: tuple[str, ...] = ("driver: x",), order: int = 100) -> NodeState:
    return NodeState(host=host, node=host, group=group, serial=serial, order=order,
                     changes=changes)  # fmt: skip


def state(host: str, state_value: str) -> NodeState:
    return NodeState(host, host, "g", 1, labels={upgrade.STATE_LABEL: state_value})


@pytest.mark.parametrize(
    ("value", "group", "want"),
    [(1, 10, 1), ("3", 10, 3), ("25%", 10, 2), ("25%", 3, 1), ("100%", 4, 4), ("50%", 1, 1)],
)
def test_serial_counts_and_percents(value: Any, group: int, want: int) -> None:
    assert upgrade.serial_size(value, group) == want


@pytest.mark.parametrize("value", [0, "0", "-1", "abc", "150%", "0%", True, "2.5"])
def test_bad_serial_names_the_variable_and_value(value: Any) -> None:
    with pytest.raises(UpgradeSpecError, match=r"gpukit_upgrade_serial: .*" + repr(value)[:3]):
        upgrade.serial_size(value, 4)


@pytest.mark.parametrize(("value", "targets", "want"),
                         [(0, 5, 0), (2, 5, 2), ("20%", 5, 1), ("10%", 5, 0), ("100%", 3, 3)])  # fmt: skip
def test_failure_budget(value: Any, targets: int, want: int) -> None:
    assert upgrade.failure_budget(value, targets) == want


def test_only_nodes_that_differ_are_batched_per_group_in_order() -> None:
    nodes = [
        node("t4-1", "t4", "50%", order=20),
        node("a1", "a100", 2),
        node("a2", "a100", 2, changes=()),
        node("t4-2", "t4", "50%", order=20),
        node("a3", "a100", 2),
        node("a4", "a100", 2),
        node("t4-3", "t4", "50%", order=20),
        node("t4-4", "t4", "50%", order=20, changes=()),
    ]
    p = upgrade.plan(nodes, max_failed=1)
    # t4 (order 20) first, 50% of its 4 nodes = 2 at a time; then a100 two at a time.
    assert p.batches == [["t4-1", "t4-2"], ["t4-3"], ["a1", "a3"], ["a4"]]
    assert p.sizes == [2, 1, 2, 1]
    assert p.order == ["t4-1", "t4-2", "t4-3", "a1", "a3", "a4"]
    assert sorted(p.unchanged) == ["a2", "t4-4"]
    assert p.max_failed == 1
    assert "batch 1 (group t4, serial 2): t4-1, t4-2" in p.lines
    assert "  a1: driver: x" in p.lines
    assert p.lines[-1] == ("6 node(s) in 4 batch(es); the rollout stops after 2 failed node(s),"
                           " and before a batch that could take it past that")


def test_skip_label_and_unfinished_states() -> None:
    nodes = [
        NodeState("a", "a", "g", 1, changes=("driver: x",),
                  labels={upgrade.SKIP_LABEL: upgrade.SKIP_VALUE}),
        state("b", "failed"),  # nothing else differs, but it is still cordoned: retry
        state("c", "done"),
        state("d", "draining"),  # an interrupted run
    ]
    p = upgrade.plan(nodes)
    assert p.order == ["b", "d"]
    assert p.skipped == ["a"]
    assert p.unchanged == ["c"]
    assert p.touched["b"] == ["a previous rollout left it failed"]
    assert any(line.startswith("a: skipped (gpukit.io/upgrade=skip); would change: driver: x")
               for line in p.lines)  # fmt: skip


def test_a_group_must_agree_on_its_serial() -> None:
    with pytest.raises(UpgradeSpecError, match="gpukit_upgrade_serial: the nodes of upgrade group 'g'"):
        upgrade.plan([node("a", "g", 1), node("b", "g", 2)])


def test_node_state_from_the_planning_facts() -> None:
    s = upgrade.node_state({
        "host": "h1", "group": "a100", "serial": "25%", "order": "5", "changes": ["MIG: x"],
        "node": {"metadata": {"name": "node-1", "labels": {upgrade.STATE_LABEL: "failed"}},
                 "spec": {"unschedulable": True}},
    })  # fmt: skip
    assert (s.node, s.order, s.state, s.unschedulable) == ("node-1", 5, "failed", True)
    assert s.reasons() == ["MIG: x", "a previous rollout left it failed"]


def test_driver_changes() -> None:
    assert upgrade.driver_changes([], "570.1", "570.1") == []
    assert upgrade.driver_changes(["upgrade nvidia-driver 550-1 -> 570-1"], "570", "550") == [
        "driver: upgrade nvidia-driver 550-1 -> 570-1",
        "driver: 570 is not the running driver (550)",
    ]
    assert upgrade.driver_changes([], "570", None) == ["driver: 570 is not the running driver (none)"]
    assert upgrade.driver_changes([], None, "550") == []


def test_label_changes_keep_only_watched_labels() -> None:
    changes = ["label nvidia.com/device-plugin.config: 'a' -> 'b'", "label team: 'x' -> 'y'",
               "taint gpu:NoSchedule: added"]  # fmt: skip
    assert upgrade.label_changes(changes, ["nvidia.com/device-plugin.config"]) == [
        "labels: label nvidia.com/device-plugin.config: 'a' -> 'b'"
    ]


def pod(name: str, phase: str = "Running", owner: str | None = "Job", gpu: bool = True,
        deleting: bool = False) -> dict[str, Any]:  # fmt: skip
    meta: dict[str, Any] = {"name": name}
    if owner:
        meta["ownerReferences"] = [{"kind": owner, "name": "x"}]
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    limits = {"nvidia.com/gpu": "1"} if gpu else {"cpu": "1"}
    return {"metadata": meta, "status": {"phase": phase},
            "spec": {"containers": [{"resources": {"limits": limits}}]}}  # fmt: skip


def test_pods_to_wait_for_are_running_gpu_jobs() -> None:
    pods = [pod("job"), pod("done", phase="Succeeded"), pod("deploy", owner="ReplicaSet"),
            pod("cpu-job", gpu=False), pod("going", deleting=True), pod("pending", "Pending")]  # fmt: skip
    assert upgrade.pods_to_wait_for(pods) == ["job", "pending"]
    # No owner filter: every running GPU pod (the caller selected them by label).
    assert upgrade.pods_to_wait_for(pods, owner_kinds=()) == ["deploy", "job", "pending"]
    mig = pod("mig-job")
    mig["spec"]["containers"][0]["resources"] = {"requests": {"nvidia.com/mig-1g.5gb": "1"}}
    assert upgrade.pods_to_wait_for([mig]) == ["mig-job"]


def test_node_serves_declared_resources_when_ready() -> None:
    ready = {"conditions": [{"type": "Ready", "status": "True"}]}
    n = {"status": {**ready, "allocatable": {"nvidia.com/gpu": "8", "cpu": "2",
                                             "nvidia.com/mig-1g.5gb": "0"}}}  # fmt: skip
    assert upgrade.node_serves(n, {"nvidia.com/gpu": 8})
    assert not upgrade.node_serves(n, {"nvidia.com/gpu": 4})
    assert not upgrade.node_serves(n, {"nvidia.com/gpu": 8, "nvidia.com/mig-1g.5gb": 2})
    not_ready = {"status": {"conditions": [{"type": "Ready", "status": "False"}],
                            "allocatable": {"nvidia.com/gpu": "8"}}}  # fmt: skip
    assert not upgrade.node_serves(not_ready, {"nvidia.com/gpu": 8})


def test_report() -> None:
    planned = upgrade.plan([node("a"), node("b"), node("c"), node("d", changes=())]).as_dict()
    r = upgrade.report(planned, {"a": "done", "b": "failed"}, {"b": "Drain the node: timeout"})
    assert (r.done, r.failed, r.not_reached, r.complete) == (["a"], ["b"], ["c"], False)
    assert r.summary == "rollout STOPPED: 1 upgraded, 1 failed, 1 not reached"
    assert "b: FAILED, left cordoned: Drain the node: timeout" in r.lines
    assert "d: matches the inventory" in r.lines
    ok = upgrade.report(planned, {"a": "done", "b": "done", "c": "done"})
    assert ok.complete and ok.summary.startswith("rollout complete: 3 upgraded")
    dry = upgrade.report(planned, {}, check_mode=True)
    assert dry.complete and dry.lines[0] == "a: would be upgraded"


def test_a_node_cordoned_by_someone_else_is_left_alone() -> None:
    admin = NodeState("a", "a", "g", 1, changes=("driver: x",), unschedulable=True)
    ours = NodeState("b", "b", "g", 1, unschedulable=True,
                     labels={upgrade.STATE_LABEL: "validating"})  # fmt: skip
    p = upgrade.plan([admin, ours])
    assert p.order == ["b"] and p.skipped == ["a"]
    assert "a: cordoned by someone else, left alone; would change: driver: x" in p.lines


def test_fleet_settings_must_agree() -> None:
    a = NodeState("a", "a", "g", 1, order=10, changes=("x",), max_failed=0)
    with pytest.raises(UpgradeSpecError, match="gpukit_upgrade_order: the nodes of upgrade group 'g'"):
        upgrade.plan([a, NodeState("b", "b", "g", 1, order=20, changes=("x",))])
    with pytest.raises(UpgradeSpecError, match="gpukit_upgrade_max_failed: the nodes of the fleet"):
        upgrade.plan([a, NodeState("b", "b", "h", 1, changes=("x",), max_failed="50%")])
    assert upgrade.plan([a, NodeState("b", "b", "h", 1, changes=("x",), max_failed=0)]).max_failed == 0
    with pytest.raises(UpgradeSpecError, match="gpukit_upgrade_serial"):
        upgrade.serial_size("²", 3)  # a digit to str.isdigit, not a number


def test_an_interrupted_node_counts_as_failed() -> None:
    results = {"a": "done", "b": "interrupted", "c": "failed", "d": None, "e": "skipped"}
    assert upgrade.failed_so_far(results) == ["b", "c"]
    planned = upgrade.plan([node("a"), node("b")]).as_dict()
    r = upgrade.report(planned, {"a": "done", "b": "interrupted"})
    assert r.failed == ["b"] and not r.complete
    assert r.lines[1].startswith("b: FAILED, interrupted")


def test_pods_left_after_a_drain() -> None:
    ds = {"metadata": {"namespace": "s", "name": "agent", "ownerReferences": [{"kind": "DaemonSet"}]},
          "status": {"phase": "Running"}}  # fmt: skip
    mirror = {"metadata": {"namespace": "s", "name": "static",
                           "annotations": {"kubernetes.io/config.mirror": "x"}},
              "status": {"phase": "Running"}}  # fmt: skip
    done = {"metadata": {"namespace": "s", "name": "job"}, "status": {"phase": "Succeeded"}}
    stuck = {"metadata": {"namespace": "s", "name": "web", "ownerReferences": [{"kind": "ReplicaSet"}]},
             "status": {"phase": "Running"}}  # fmt: skip
    assert upgrade.pods_left([ds, mirror, done, stuck]) == ["s/web"]


def agent(phase: str = "Running", started: str | None = "2026-11-22T07:30:05Z",
          ready: bool = True) -> dict[str, Any]:  # fmt: skip
    state = {"running": {"startedAt": started}} if started else {"waiting": {}}
    return {"status": {"phase": phase,
                       "containerStatuses": [{"ready": ready, "state": state}]}}  # fmt: skip


def test_the_node_agent_must_have_started_since_the_upgrade() -> None:
    since = "2026-11-22T07:30:00Z"
    assert upgrade.agent_started_since([agent()], since)
    assert upgrade.agent_started_since([agent(started="2026-11-22T07:30:00+00:00")], since)
    assert not upgrade.agent_started_since([agent(started="2026-11-22T07:29:59Z")], since)
    assert not upgrade.agent_started_since([agent(ready=False)], since)
    assert not upgrade.agent_started_since([agent(started=None)], since)
    assert not upgrade.agent_started_since([agent(phase="Pending")], since)
    assert not upgrade.agent_started_since([], since)


def test_node_serves_the_running_driver() -> None:
    n = {"metadata": {"labels": {upgrade.DRIVER_LABEL: "550.90.07"}},
         "status": {"conditions": [{"type": "Ready", "status": "True"}],
                    "allocatable": {"nvidia.com/gpu": "2"}}}  # fmt: skip
    assert upgrade.node_serves(n, {"nvidia.com/gpu": 2}, "550.90.07")
    assert not upgrade.node_serves(n, {"nvidia.com/gpu": 2}, "570.86.15")
    assert upgrade.node_serves(n, {"nvidia.com/gpu": 2})
