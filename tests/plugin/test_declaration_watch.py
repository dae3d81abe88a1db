"""The agent's served-vs-declared watchdog (issue 30): a node that does not serve its
declaration gets the condition GpuDeclarationMismatch, an Event and gauges that say so, all
cleared once it serves it again; the declaration is its own node's ConfigMap entry."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from plugin_testlib import T4, FakeBackend, FakeKubelet, FakeNode, make_gpu, make_inventory

from gpukit.contracts import label_names as ln
from gpukit.contracts import node_declaration as nd
from gpukit.plugin.config_source import ConfigSource, Override
from gpukit.plugin.declaration_watch import DeclarationWatch
from gpukit.plugin.manager import ManagerOptions, PluginManager
from gpukit.plugin.metrics import PluginMetrics
from gpukit.plugin.served import Served

GPU = ln.GPU_RESOURCE


def declare(directory: Path, node: str, resources: dict[str, int], config: str = "") -> None:
    directory.mkdir(exist_ok=True)
    (directory / node).write_text(nd.render(nd.NodeDeclaration(node, resources, config)))


def gauge(m: PluginMetrics, which: str, resource: str = GPU) -> float | None:
    return m.registry.get_sample_value(f"gpukit_node_gpus_{which}", {"resource": resource})


def watch(directory: Path, node: FakeNode | None, metrics: PluginMetrics) -> DeclarationWatch:
    return DeclarationWatch(str(directory), "n1", metrics, node, reread_seconds=0)


def test_a_mismatch_sets_condition_event_and_gauges_and_recovery_clears_them(
        tmp_path: Path) -> None:
    declare(tmp_path, "n1", {GPU: 8}, "ts")
    node, metrics = FakeNode({}), PluginMetrics()
    w = watch(tmp_path, node, metrics)

    w.check(lambda: Served({GPU: 8}))
    [ok] = node.conditions
    assert (ok["type"], ok["status"], ok["reason"]) == (nd.CONDITION_TYPE, "False",
                                                       nd.REASON_OK)
    assert node.events == []  # serving the declaration from the start is no news

    w.check(lambda: Served({GPU: 7}))
    lost = node.conditions[-1]
    assert (lost["status"], lost["reason"]) == ("True", nd.REASON_DEVICES)
    assert lost["message"] == "node n1: nvidia.com/gpu declared 8, served 7"
    assert node.events == [(nd.EVENT_MISMATCH, lost["message"], "Warning")]
    assert (gauge(metrics, "declared"), gauge(metrics, "served")) == (8, 7)

    w.check(lambda: Served({GPU: 7}))  # nothing new: nothing written
    assert len(node.conditions) == 2 and len(node.events) == 1

    w.check(lambda: Served({GPU: 6}))  # worse: said again, same transition
    assert node.conditions[-1]["lastTransitionTime"] == lost["lastTransitionTime"]
    assert node.events[-1][1] == "node n1: nvidia.com/gpu declared 8, served 6"

    w.check(lambda: Served({GPU: 8}))
    back = node.conditions[-1]
    assert (back["status"], back["reason"]) == ("False", nd.REASON_OK)
    assert node.events[-1] == (nd.EVENT_CLEARED, back["message"], "Normal")
    assert (gauge(metrics, "declared"), gauge(metrics, "served")) == (8, 8)


def test_a_failed_report_is_tried_again_and_the_agent_goes_on(tmp_path: Path) -> None:
    declare(tmp_path, "n1", {GPU: 2})

    class Down(FakeNode):
        def set_condition(self, node: str, condition: dict[str, object]) -> None:
            raise OSError("connection refused")

    metrics = PluginMetrics()
    w = watch(tmp_path, Down({}), metrics)
    verdict = w.check(lambda: Served({GPU: 1}))
    assert verdict is not None and verdict.mismatch
    assert gauge(metrics, "served") == 1
    assert metrics.registry.get_sample_value("gpukit_plugin_errors_total",
                                             {"kind": "declaration"}) == 1
    node = FakeNode({})
    w.sink = node
    w.check(lambda: Served({GPU: 1}))
    assert node.conditions[-1]["status"] == "True"


def test_no_entry_for_the_node_reports_nothing_and_drops_the_gauges(tmp_path: Path) -> None:
    declare(tmp_path, "n1", {GPU: 2})
    node, metrics = FakeNode({}), PluginMetrics()
    w = watch(tmp_path, node, metrics)
    w.check(lambda: Served({GPU: 2}))
    assert gauge(metrics, "declared") == 2
    (tmp_path / "n1").unlink()
    assert w.check(lambda: Served({GPU: 0})) is None
    assert gauge(metrics, "declared") is None and gauge(metrics, "served") is None
    assert len(node.conditions) == 1


@pytest.mark.parametrize(("text", "problem"), [
    ("version: v1\nnode: n1\nresources: {nvidia.com/gpu: many}\n",
     "resources.nvidia.com/gpu: 'many' is not a count >= 0"),
    ("version: v1\nnode: n2\n", ".node: 'n2' is not this node ('n1')"),
])
def test_an_unusable_entry_is_one_error_line_and_no_report(
        tmp_path: Path, text: str, problem: str, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "n1").write_text(text)
    node, metrics = FakeNode({}), PluginMetrics()
    w = watch(tmp_path, node, metrics)
    for _ in range(3):
        assert w.check(lambda: Served({GPU: 2})) is None
    [line] = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert problem in line and str(tmp_path / "n1") in line
    assert node.conditions == [] and gauge(metrics, "declared") is None


def wait_until(what: str, check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_the_agent_reports_a_lost_gpu_and_a_config_fallback_and_clears_them(
        kubelet: FakeKubelet, short_tmp: Path) -> None:
    configs, decls = short_tmp / "configs", short_tmp / "declarations"
    configs.mkdir()
    (configs / "default").write_text("version: v1\n")
    declare(decls, "n1", {GPU: 2}, "default")
    node = FakeNode({ln.DEVICE_PLUGIN_CONFIG: "default"})
    source = ConfigSource(config_dir=configs, node_name="n1", label_reader=node.labels,
                          overrides=[Override("gpukit.kubeletDir", str(short_tmp), "test"),
                                     Override("gpukit.rescanIntervalSeconds", 0, "test")])
    m = PluginManager(source, FakeBackend(make_inventory([make_gpu(0, T4), make_gpu(1, T4)])),
                      options=ManagerOptions(tick=0.05, health=False, config_poll_seconds=0.1,
                                             node_labels=True,
                                             declaration_dir=str(decls)),
                      node_client=node)  # type: ignore[arg-type]
    m.start()

    def status() -> tuple[str, str] | None:
        c = node.conditions[-1] if node.conditions else None
        return (c["status"], c["reason"]) if c else None

    try:
        wait_until("served declaration", lambda: status() == ("False", nd.REASON_OK))
        # A GPU lost (the health monitor's probe): still advertised, Unhealthy, not served.
        uuid = m.devices.gpus[1].uuid
        m.tracker.on_probe(uuid, "GPU is lost")
        m.refresh_health()
        wait_until("lost GPU reported", lambda: status() == ("True", nd.REASON_DEVICES))
        assert node.conditions[-1]["message"] == "node n1: nvidia.com/gpu declared 2, served 1"
        assert gauge(m.metrics, "served") == 1 and gauge(m.metrics, "declared") == 2
        m.tracker.clear()
        m.refresh_health()
        wait_until("recovered", lambda: status() == ("False", nd.REASON_OK))
        assert gauge(m.metrics, "served") == 2

        # The selected config refused (a typo in the label): the running one is kept.
        node.labels_now[ln.DEVICE_PLUGIN_CONFIG] = "defualt"
        wait_until("fallback reported", lambda: status() == ("True", nd.REASON_CONFIG))
        assert "config 'default' declared, refused" in node.conditions[-1]["message"]
        node.labels_now[ln.DEVICE_PLUGIN_CONFIG] = "default"
        wait_until("fallback cleared", lambda: status() == ("False", nd.REASON_OK))
        reasons = [r for r, _, _ in node.events if r.startswith("GpuDeclaration")]
        assert reasons == [nd.EVENT_MISMATCH, nd.EVENT_CLEARED] * 2
    finally:
        m.stop()
