"""The DRA plugin's served-vs-declared watchdog (issue 30): on a DRA node the plugin compares
the healthy devices it publishes (by kind: whole GPUs, MIG devices per profile) with its
node's declaration entry and reports as the agent does: the condition GpuDeclarationMismatch,
an Event, the gauges; a tainted (unhealthy) device counts as not served."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from dra_testlib import mig_and_whole_gpu_plugin
from plugin_testlib import FakeNode

from gpukit.contracts import node_declaration as nd
from gpukit.plugin.dra.kubelet_plugin import DraKubeletPlugin
from gpukit.provision.upgrade import declaration_served

GPU = nd.dra_kind("gpu")
MIG = nd.dra_kind("mig", "3g.20gb")


@pytest.fixture
def dra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[DraKubeletPlugin, FakeNode]:
    """A node with a MIG device (3g.20gb on GPU 0) and a whole GPU 1, declared so."""
    declare(tmp_path / "decl", {GPU: 1, MIG: 1})
    a = mig_and_whole_gpu_plugin(tmp_path, monkeypatch, declaration_dir=str(tmp_path / "decl"))
    sink = FakeNode({})
    a.declaration.sink, a.declaration.reread_seconds = sink, 0
    return a, sink


def declare(directory: Path, devices: dict[str, int] | None = None,
            resources: dict[str, int] | None = None) -> None:
    directory.mkdir(exist_ok=True)
    (directory / "n1").write_text(nd.render(nd.NodeDeclaration(
        "n1", resources or {}, dra_devices=devices)))


def gauge(a: DraKubeletPlugin, which: str, kind: str) -> float | None:
    return a.metrics.registry.get_sample_value(f"gpukit_node_gpus_{which}", {"resource": kind})


def node(condition: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "n1"}, "status": {"conditions": [condition]}}


def test_a_lost_gpu_raises_condition_event_and_gauge_and_recovery_clears_them(
        dra: tuple[DraKubeletPlugin, FakeNode]) -> None:
    a, sink = dra
    assert a.check_declaration() is None  # nothing published yet: nothing said
    a.rescan()
    a.check_declaration()
    [ok] = sink.conditions
    assert (ok["type"], ok["status"], ok["reason"]) == (nd.CONDITION_TYPE, "False",
                                                       nd.REASON_OK)
    assert ok["message"] == ("node n1 serves its declaration: gpu.nvidia.com/gpu 1, "
                             "gpu.nvidia.com/mig-3g.20gb 1")
    # What site.yml's wait and the rolling upgrade read: the declared counts, named.
    assert declaration_served(node(ok), {GPU: 1, MIG: 1})
    assert not declaration_served(node(ok), {GPU: 2, MIG: 1})
    assert sink.events == []

    a.tracker.on_probe(a.devices()["gpu-1"].unit.uuid, "GPU is lost")
    a.publish()  # tainted, still published
    a.check_declaration()
    lost = sink.conditions[-1]
    assert (lost["status"], lost["reason"]) == ("True", nd.REASON_DEVICES)
    assert lost["message"] == "node n1: gpu.nvidia.com/gpu declared 1, served 0"
    assert sink.events == [(nd.EVENT_MISMATCH, lost["message"], "Warning")]
    assert (gauge(a, "declared", GPU), gauge(a, "served", GPU)) == (1, 0)
    assert (gauge(a, "declared", MIG), gauge(a, "served", MIG)) == (1, 1)

    a.tracker.on_probe(a.devices()["gpu-1"].unit.uuid, "")  # seen again
    a.publish()
    a.check_declaration()
    back = sink.conditions[-1]
    assert (back["status"], back["reason"], back["message"]) == ("False", nd.REASON_OK,
                                                                 ok["message"])
    assert sink.events[-1] == (nd.EVENT_CLEARED, back["message"], "Normal")
    assert (gauge(a, "served", GPU), len(sink.conditions)) == (1, 3)


def test_a_changed_declaration_is_compared_at_once(
        dra: tuple[DraKubeletPlugin, FakeNode], tmp_path: Path) -> None:
    a, sink = dra
    a.rescan()
    a.check_declaration()
    declare(tmp_path / "decl", {GPU: 2, MIG: 1, nd.dra_kind("mig", "1g.5gb"): 2})
    a.check_declaration()
    assert sink.conditions[-1]["message"] == (
        "node n1: gpu.nvidia.com/gpu declared 2, served 1; gpu.nvidia.com/mig-1g.5gb declared "
        "2, served 0")


def test_a_device_plugin_nodes_entry_is_left_to_the_agent(
        dra: tuple[DraKubeletPlugin, FakeNode], tmp_path: Path) -> None:
    """A node declared for the device plugin (e.g. while it is switched) is the agent's to
    report on: the DRA plugin says nothing, so the two never fight over the condition."""
    a, sink = dra
    declare(tmp_path / "decl", None, {"nvidia.com/gpu": 2})
    a.rescan()
    assert a.check_declaration() is None
    assert sink.conditions == [] and gauge(a, "declared", GPU) is None


def test_the_agent_leaves_a_dra_nodes_entry_to_the_dra_plugin(tmp_path: Path) -> None:
    from gpukit.plugin.declaration_watch import DeclarationWatch
    from gpukit.plugin.metrics import PluginMetrics
    from gpukit.plugin.served import Served

    declare(tmp_path, {GPU: 2})
    sink = FakeNode({})
    w = DeclarationWatch(str(tmp_path), "n1", PluginMetrics(), sink, reread_seconds=0)
    assert w.check(lambda: Served({})) is None and sink.conditions == []
