"""Scheduling the suite's per-node work (conformance.schedule), without a cluster: the plan
from the collected tests, once-only stages shared by tests and node workers, the bound on
nodes worked at once, a node's stages one after the other in plan order."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gpukit.conformance import plugin
from gpukit.conformance.schedule import StageKey, Stages, Use, key_for, plan

REPO = Path(__file__).resolve().parents[2]


def test_plan_orders_each_nodes_stages_by_first_use() -> None:
    uses = [
        Use("a", "", ("helper",)),
        Use("b", "", ("helper",)),
        Use("a", "nvidia.com/gpu", ("fill", "probe")),
        Use("a", "nvidia.com/mig-1g.5gb", ("fill", "probe")),
        Use("b", "nvidia.com/gpu", ("fill",)),
        Use("a", "nvidia.com/gpu", ("release", "workload")),
        Use("a", "nvidia.com/mig-1g.5gb", ("release", "workload")),
        Use("b", "nvidia.com/gpu", ("release", "gt1")),
    ]
    steps = plan(uses)
    assert list(steps) == ["a", "b"]
    assert [str(k) for k in steps["a"]] == [
        "helper", "fill", "probe", "release", "workload[nvidia.com/gpu]",
        "workload[nvidia.com/mig-1g.5gb]"]
    assert [str(k) for k in steps["b"]] == ["helper", "fill", "release", "gt1[nvidia.com/gpu]"]


def test_a_per_node_stage_ignores_the_resource_and_an_unknown_one_is_named() -> None:
    assert key_for("fill", "nvidia.com/gpu") == StageKey("fill")
    assert key_for("gt1", "nvidia.com/gpu") == StageKey("gt1", "nvidia.com/gpu")
    with pytest.raises(ValueError, match="unknown stage 'filll'"):
        key_for("filll")


def test_a_stage_is_computed_once_and_its_error_reaches_every_caller() -> None:
    stages = Stages()
    calls: list[str] = []

    def compute() -> str:
        calls.append("x")
        time.sleep(0.05)
        return "done"

    threads = [threading.Thread(target=stages.once, args=("a", key_for("fill"), compute))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert stages.once("a", key_for("fill"), compute) == "done"
    assert calls == ["x"]

    def fail() -> str:
        raise RuntimeError("node a: pods were not deleted")

    for _ in range(2):
        with pytest.raises(RuntimeError, match="pods were not deleted"):
            stages.once("a", key_for("release"), fail)


class Recorder:
    """A fake cluster: how many nodes are worked at once, and each node's stage order."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.busy: set[str] = set()
        self.most = 0
        self.order: dict[str, list[str]] = {}
        self.overlap_in_a_node = False

    def run(self, node: str, key: StageKey) -> str:
        with self.lock:
            if node in self.busy:
                self.overlap_in_a_node = True
            self.busy.add(node)
            self.most = max(self.most, len(self.busy))
            self.order.setdefault(node, []).append(str(key))
        time.sleep(0.02)
        with self.lock:
            self.busy.discard(node)
        if key.stage == "gt1":
            raise RuntimeError(f"{node}: admission said no")
        return f"{node}:{key}"

    def through(self, stages: Stages) -> Callable[[str, StageKey], str]:
        """What the suite gives the workers: each stage through `once`, as tests ask."""
        return lambda node, key: stages.once(node, key, lambda: self.run(node, key))


@pytest.mark.parametrize("parallelism", [2, 3, 8])
def test_workers_keep_to_the_bound_and_to_each_nodes_order(parallelism: int) -> None:
    nodes = [f"n{i}" for i in range(8)]
    uses = [Use(n, "", ("helper",)) for n in nodes]
    uses += [Use(n, "r", ("fill", "probe")) for n in nodes]
    uses += [Use(n, "r", ("release", "gt1", "workload")) for n in nodes]
    steps = plan(uses)
    rec = Recorder()
    stages = Stages()
    stages.start(steps, rec.through(stages), parallelism)
    # The tests' thread reads the results in the tests' order: a stage no worker has reached
    # yet it computes itself (at first use, as sequentially), else it waits for the worker's.
    got: dict[tuple[str, StageKey], str] = {}
    for use in uses:
        for stage in use.stages:
            key = key_for(stage, use.resource)
            try:
                got[use.node, key] = stages.once(use.node, key, lambda n=use.node, k=key:
                                                 rec.run(n, k))
            except RuntimeError as exc:
                got[use.node, key] = str(exc)
    stages.stop()
    assert got["n3", key_for("workload", "r")] == "n3:workload[r]"
    # an error in one stage is kept for its test; the node's next stages still ran
    assert got["n3", key_for("gt1", "r")] == "n3: admission said no"
    assert 2 <= rec.most <= parallelism + 1  # the workers, and the tests' thread
    assert not rec.overlap_in_a_node
    assert all(rec.order[n] == [str(k) for k in steps[n]] for n in nodes)


def test_workers_work_nodes_ahead_of_the_tests() -> None:
    steps = plan([Use(f"n{i}", "r", ("fill", "workload")) for i in range(4)])
    rec = Recorder()
    stages = Stages()
    stages.start(steps, rec.through(stages), 4)
    deadline = time.monotonic() + 5
    while sum(map(len, rec.order.values())) < 8 and time.monotonic() < deadline:
        time.sleep(0.01)
    stages.stop()
    assert rec.most == 4
    assert {n: len(o) for n, o in rec.order.items()} == {f"n{i}": 2 for i in range(4)}


def test_parallelism_one_works_nothing_ahead() -> None:
    rec = Recorder()
    stages = Stages()
    stages.start(plan([Use("a", "", ("fill",))]), rec.through(stages), 1)
    stages.stop()
    assert rec.order == {}
    assert stages.once("a", key_for("fill"), lambda: "at first use") == "at first use"


def test_a_test_that_needs_a_stage_first_computes_it_and_the_worker_waits() -> None:
    stages = Stages()
    started = threading.Event()
    release = threading.Event()

    def slow() -> str:
        started.set()
        release.wait(5)
        return "the test's"

    t = threading.Thread(target=stages.once, args=("a", key_for("fill"), slow))
    t.start()
    started.wait(5)
    rec = Recorder()
    stages.start({"a": [key_for("fill"), key_for("release")]}, rec.through(stages), 2)
    time.sleep(0.1)
    assert rec.order == {}  # the worker waits for the test's fill before the release
    release.set()
    t.join()
    deadline = time.monotonic() + 5
    while not stages.done("a", key_for("release")) and time.monotonic() < deadline:
        time.sleep(0.01)
    stages.stop()
    assert rec.order == {"a": ["release"]}
    assert stages.once("a", key_for("fill"), lambda: "again") == "the test's"


class PlanOfCollection:
    def __init__(self) -> None:
        self.steps: dict[str, list[StageKey]] = {}

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.steps = plan(plugin.stage_uses(session.items))


def test_the_lab_inventory_plans_fill_before_release_before_the_exclusive_pods() -> None:
    rec = PlanOfCollection()
    rc = pytest.main(["gpukit/conformance", "--inventory", str(REPO / "inventories/lab"),
                      "--collect-only", "-q", "-p", "no:cacheprovider"], plugins=[rec])
    assert rc == 0
    a100 = [str(k) for k in rec.steps["gpu-a100"]]
    t4 = [str(k) for k in rec.steps["gpu-t4"]]
    assert a100[:4] == ["helper", "probe", "host", "fill"]
    assert a100.index("fill") < a100.index("release") < a100.index("workload[nvidia.com/gpu]")
    assert "gt1[nvidia.com/gpu]" in t4 and not any(s.startswith("gt1") for s in a100)
    assert t4.index("release") < t4.index("gt1[nvidia.com/gpu]") < t4.index(
        "workload[nvidia.com/gpu]")


def test_node_parallelism_must_be_a_whole_number_of_nodes() -> None:
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "gpukit/conformance",
                        "--inventory", "inventories/lab", "--node-parallelism", "0",
                        "--collect-only"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 4, r.stdout + r.stderr
    assert "--node-parallelism: '0' is not a whole number of nodes >= 1" in r.stderr


class SkipsOfCollection(PlanOfCollection):
    def __init__(self) -> None:
        super().__init__()
        self.skips: dict[str, str] = {}

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        super().pytest_collection_finish(session)
        for item in session.items:
            mark = item.get_closest_marker("skip")
            self.skips[item.nodeid.split("::")[-1]] = str(mark.kwargs["reason"]) if mark else ""


def test_api_only_skips_what_needs_a_kubelet_naming_it_and_works_nothing_ahead() -> None:
    rec = SkipsOfCollection()
    rc = pytest.main(["gpukit/conformance", "--inventory", str(REPO / "inventories/lab"), "--api-only",
                      "--collect-only", "-q", "-p", "no:cacheprovider"], plugins=[rec])
    assert rc == 0
    s = rec.skips
    # API-side checks run
    for name in ("test_capacity_and_allocatable[gpu-a100-gpu]", "test_gfd_labels[gpu-t4]",
                 "test_mig_resources_match_the_layout[gpu-a100]",
                 "test_shared_resource_names[gpu-t4]"):
        assert s[name] == "", name
    # A check no node can run without a kubelet is one skipped test for all of them.
    assert s["test_kubelet_sees_the_same_devices[every-node-of-2]"] == (
        "every node (2): --api-only (no kubelet): needs the kubelet's PodResources API"
        " (a pod on the node)")
    assert s["test_devices_are_disjoint[every-node-of-2]"] == (
        "every node (2): --api-only (no kubelet): needs pods running on the node, NVML on the"
        " host over SSH")
    assert s["test_driver_branch[every-node-of-2]"].endswith(
        "needs the host over SSH, NVML on the host over SSH")
    assert s["test_cuda_smoke[every-node-of-2]"] == (
        "every node (2): --api-only (no kubelet): needs NVML on the host over SSH, pods running"
        " on the node, a real GPU")
    assert not any(k.startswith("test_devices_are_disjoint[gpu-") for k in s)
    assert rec.steps == {}  # nothing is worked ahead for skipped tests
    ran = [n for n, why in s.items() if not why]
    assert len(ran) >= 15 and len(ran) < len(s)


def test_a_nodes_waits_watch_only_its_own_pods() -> None:
    from kubernetes import client

    from gpukit.conformance.cluster import NODE_LABEL, RUN_LABEL, Kube, pod_manifest

    kube = Kube(client.ApiClient())
    selector = kube._selector("gpu-a100-80-b")
    labels = pod_manifest("p", run_id=kube.run_id, role="fill", node="gpu-a100-80-b",
                          image="x", command=["true"])["metadata"]["labels"]
    wanted = dict(term.split("=") for term in selector.split(","))
    assert wanted == {RUN_LABEL: kube.run_id, NODE_LABEL: "gpu-a100-80-b"}
    assert wanted.items() <= labels.items()
    assert kube._selector(None) == f"{RUN_LABEL}={kube.run_id}"  # the run's cleanup: all
