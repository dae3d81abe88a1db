"""Plan and apply against the mock NVML through pynvml, in-process: end to end, idempotence,
keeping matching instances, processes and force, T4, export round trip, pause and state."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from migtest import MockNode, RecordingPause, RecordingReporter, configs

from gpukit.contracts import mig_parted as schema
from gpukit.lab.nvml.control import MockNvmlError
from gpukit.mig.planner import LayoutError, plan
from gpukit.plugin.mig.applier import ApplyError, ProcessesRunning, apply, verify
from gpukit.plugin.mig.export import export_config, export_warnings

pytestmark = pytest.mark.nvml


def test_discovery_reads_mode_instances_and_processes(a100: MockNode) -> None:
    a100.make(0, [("3g.20gb", 4)])
    a100.ctl.set_process(0, pid=4242, mem_mb=64, gi=1, ci=0)
    g0, g1 = a100.gpus()[:2]
    assert (g0.product, g0.pci_device_id, g0.mig_current, g0.mig_pending) == (
        "NVIDIA A100-SXM4-40GB", 0x20B010DE, True, True)
    (gi,) = g0.gpu_instances
    assert (gi.id, gi.profile, gi.profile_id, gi.start, gi.size) == (1, "3g.20gb", 2, 4, 4)
    assert [(c.id, c.profile_id, c.start, c.size) for c in gi.compute_instances] == [(0, 2, 0, 3)]
    assert [(p.pid, p.gi, p.ci, p.used_mb) for p in g0.processes] == [(4242, 1, 0, 64)]
    assert (g1.mig_current, g1.gpu_instances, g1.processes) == (False, (), ())


def test_plan_from_scratch(a100: MockNode) -> None:
    p = plan(configs(), "mixed-a100", a100.gpus())
    assert [g.index for g in (x.gpu for x in p.changed_gpus)] == [0, 1]
    g0 = p.gpus[0]
    assert g0.target is not None and g0.reset_required
    assert [s.describe() for s in g0.target.slots] == [
        "2g.10gb@0", "1g.5gb@2", "1g.5gb@3", "3g.20gb@4"]
    assert [a.kind.value for a in g0.actions] == [
        "set-mig-mode", "reset-gpu", *["create-gpu-instance"] * 4,
        *["create-compute-instance"] * 4]
    doc = p.to_json()
    assert doc["changed"] is True and doc["reset_required"] == [0, 1]
    assert doc["gpus"][0]["diff"] == {
        "before": "MIG disabled",
        "after": "MIG enabled: 2g.10gb@0 1g.5gb@2 1g.5gb@3 3g.20gb@4"}
    assert len(doc["actions"]) == 20 and doc["actions"][0] == {
        "action": "set-mig-mode", "gpu": 0, "enabled": True,
        "text": "GPU 0: set MIG mode enabled"}


def test_plan_keeps_matching_instances(a100: MockNode) -> None:
    # GPU 0: a 3g at 4 (wanted) and a 2g at 0 (not wanted; its GI id is 5 on an A100)
    a100.make(0, [("3g.20gb", 4), ("2g.10gb", 0)])
    p = plan(configs(), "all-3g", a100.gpus())
    g0 = p.gpus[0]
    assert [s.describe() for s in g0.kept] == ["3g.20gb@4"]
    assert [a.text() for a in g0.actions] == [
        "GPU 0: destroy compute instance 0 of GPU instance 5 (2g.10gb at slice 0)",
        "GPU 0: destroy GPU instance 5 (2g.10gb at slice 0)",
        "GPU 0: create GPU instance 3g.20gb at slice 0",
        "GPU 0: create compute instance 3g.20gb in the GPU instance at slice 0",
    ]


def test_apply_end_to_end_then_noop(a100: MockNode) -> None:
    c = configs()
    reporter, pause = RecordingReporter(), RecordingPause()
    r = apply(c, "mixed-a100", a100.backend, a100.reset, reporter=reporter, pauser=pause)
    assert r.changed and len(r.executed) == 20 and not r.skipped
    assert pause.events == [("pause", [0, 1]), ("resume", None)]
    assert [s for s, _ in reporter.states] == ["pending", "success"]
    layout = a100.layout()
    assert layout[0] == (True, True, ("2g.10gb@0/1ci", "1g.5gb@2/1ci", "1g.5gb@3/1ci",
                                      "3g.20gb@4/1ci"))
    assert layout[1] == layout[0] and layout[2] == (False, False, ())
    assert verify(r.plan, a100.gpus()) == []  # assert passes
    # the MIG devices exist as the plugin will see them
    from gpukit.plugin import nvml

    inv = nvml.discover(with_topology=False)
    assert sorted(m.profile for m in inv.gpus[0].mig_devices) == [
        "1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"]
    uuids = {m.uuid for m in inv.gpus[0].mig_devices}
    # second apply: nothing to do, nothing paused, instances untouched
    reporter2, pause2 = RecordingReporter(), RecordingPause()
    r2 = apply(c, "mixed-a100", a100.backend, a100.reset, reporter=reporter2, pauser=pause2)
    assert not r2.changed and not r2.plan.actions
    assert pause2.events == [("resume", None)]  # only clears a stale pause, never pauses
    assert [s for s, _ in reporter2.states] == ["success"]
    assert {m.uuid for m in nvml.discover(with_topology=False).gpus[0].mig_devices} == uuids


def test_apply_switches_layouts_and_back(h100: MockNode) -> None:
    doc = {
        "small": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}],
        "two": [{"devices": [0, 1], "mig-enabled": True,
                 "mig-devices": {"4g.40gb": 1, "3g.40gb": 1}},
                {"devices": [2, 3, 4, 5, 6, 7], "mig-enabled": False}],
    }
    c = schema.parse(doc)
    apply(c, "small", h100.backend, h100.reset)
    assert all(len(v[2]) == 7 for v in h100.layout().values())
    r = apply(c, "two", h100.backend, h100.reset)
    # GPUs 0-1 keep MIG on (no reset), GPUs 2-7 destroy 7 CIs + 7 GIs, disable, reset
    assert [a.kind.value for a in r.plan.gpus[0].actions].count("reset-gpu") == 0
    assert [a.kind.value for a in r.plan.gpus[2].actions][-2:] == ["set-mig-mode", "reset-gpu"]
    assert h100.layout()[0] == (True, True, ("4g.40gb@0/1ci", "3g.40gb@4/1ci"))
    assert h100.layout()[7] == (False, False, ())
    assert not apply(c, "two", h100.backend, h100.reset).changed


def test_refused_while_processes_run_unless_forced(a100: MockNode) -> None:
    a100.make(0, [("3g.20gb", 0)])
    a100.ctl.set_process(0, pid=777, mem_mb=10, gi=2, ci=0)  # in the 3g at 0 (id 2)
    before = a100.layout()
    reporter, pause = RecordingReporter(), RecordingPause()
    with pytest.raises(ProcessesRunning, match=r"GPU 0: pid 777.*apply with force"):
        apply(configs(), "all-3g", a100.backend, a100.reset, reporter=reporter, pauser=pause)
    assert a100.layout() == before and pause.events == []
    assert reporter.states[-1][0] == "failed"
    # GPUs 1-7 need a mode change, so force alone is not enough for them: select GPU 0 only
    only0 = schema.parse({"x": [{"devices": [0], "mig-enabled": True,
                                 "mig-devices": {"3g.20gb": 2}}]})
    with pytest.raises(ProcessesRunning):
        apply(only0, "x", a100.backend, a100.reset)
    r = apply(only0, "x", a100.backend, a100.reset, force=True)
    assert [a.text() for a in r.executed] == [
        "GPU 0: create GPU instance 3g.20gb at slice 4",
        "GPU 0: create compute instance 3g.20gb in the GPU instance at slice 4"]
    assert [p.pid for p in a100.gpus()[0].processes] == [777]  # its instance was kept


def test_forced_apply_that_the_gpu_refuses_fails_cleanly(a100: MockNode) -> None:
    a100.ctl.set_process(1, pid=555, mem_mb=10)
    c = schema.parse({"x": [{"devices": [1], "mig-enabled": True,
                             "mig-devices": {"7g.40gb": 1}}]})
    reporter, pause = RecordingReporter(), RecordingPause()
    with pytest.raises(MockNvmlError, match="In use"):
        apply(c, "x", a100.backend, a100.reset, force=True, reporter=reporter, pauser=pause)
    assert [s for s, _ in reporter.states] == ["pending", "failed"]
    assert pause.events == [("pause", [1]), ("resume", None)]  # the plugin is not left paused
    a100.ctl.clear_processes()
    assert apply(c, "x", a100.backend, a100.reset).changed  # converges once the GPU is free
    assert a100.layout()[1] == (True, True, ("7g.40gb@0/1ci",))


def test_t4_mig_enabled_refused(t4: MockNode) -> None:
    with pytest.raises(LayoutError) as e:
        apply(configs(), "all-3g", t4.backend, t4.reset)
    assert e.value.problems == [
        f"GPU {i} (Tesla T4): mig-configs.all-3g[0] sets mig-enabled: true, but this GPU is not "
        "MIG capable (NVML reports no MIG mode); select it with mig-enabled: false or leave it "
        "out of the entry's devices/device-filter" for i in (0, 1)]
    r = apply(configs(), "all-disabled", t4.backend, t4.reset)
    assert not r.changed and [g.note for g in r.plan.gpus] == ["not MIG capable"] * 2
    assert export_config(t4.gpus()) == {"version": "v1", "mig-configs": {
        "current": [{"devices": "all", "mig-enabled": False}]}}


def test_impossible_layout_touches_nothing(a100: MockNode) -> None:
    c = schema.parse({"x": [{"devices": [0], "mig-enabled": True, "mig-devices": {"3g.20gb": 2}},
                            {"devices": [1], "mig-enabled": True,
                             "mig-devices": {"3g.20gb": 2, "1g.5gb": 1}}]})
    reporter = RecordingReporter()
    with pytest.raises(LayoutError, match=r"GPU 1 .*needs 9 memory slices"):
        apply(c, "x", a100.backend, a100.reset, reporter=reporter)
    assert a100.layout()[0] == (False, False, ())  # GPU 0 was valid, but nothing was touched
    assert reporter.states[0][0] == "failed"


@pytest.mark.parametrize("profile", ["a100-sxm4-40gb-x8", "h100-80gb-x8"])
def test_export_round_trip(node_factory: Callable[..., MockNode], profile: str) -> None:
    node = node_factory(profile)
    table = node.gpus()[0].table
    assert table is not None
    one_g = table.gpu_instance_profiles[0].name  # 1g.5gb / 1g.10gb
    node.make(0, [("3g." + one_g.split(".")[1].replace("5gb", "20gb").replace("10gb", "40gb"),
                   4), (one_g, 1)])
    node.make(3, [(one_g, 6)])
    exported = export_config(node.gpus(), "snap")
    entries = exported["mig-configs"]["snap"]
    assert [e["devices"] for e in entries] == [[0], [1, 2, 4, 5, 6, 7], [3]]
    assert export_warnings(node.gpus()) == []
    # the 1g at 1 and at 6 are odd places: planning the export keeps them -> no change
    p = plan(schema.parse(exported), "snap", node.gpus())
    assert not p.changed, p.to_json()["actions"]
    assert not apply(schema.parse(exported), "snap", node.backend, node.reset).changed


def test_export_warns_about_what_it_cannot_say(a100: MockNode) -> None:
    a100.make(0, [("3g.20gb", 0)], cis=False)
    a100.backend.set_mig_mode(1, True)  # pending
    warnings = export_warnings(a100.gpus())
    assert warnings == [
        "GPU 0 (NVIDIA A100-SXM4-40GB): GPU instance 3g.20gb@0 does not have exactly one "
        "full-size compute instance; exported as one MIG device",
        "GPU 1 (NVIDIA A100-SXM4-40GB): MIG disabled (enable pending reset); exported as the "
        "current mode"]


def test_verify_reports_drift(a100: MockNode) -> None:
    r = apply(configs(), "4g-3g", a100.backend, a100.reset)
    assert verify(r.plan, a100.gpus()) == []
    gi = a100.gpus()[0].gpu_instances[0]
    a100.backend.destroy_compute_instance(0, gi.id, gi.compute_instances[0].id)
    assert verify(r.plan, a100.gpus()) == [
        "GPU 0 (NVIDIA A100-SXM4-40GB): GPU instance 4g.20gb@0 should have one full compute "
        "instance, has 0"]
    a100.backend.destroy_gpu_instance(0, gi.id)
    assert "expected GPU instances 4g.20gb@0 3g.20gb@4, found 3g.20gb@4" in verify(
        r.plan, a100.gpus())[0]


def test_apply_verifies_what_the_gpu_did(a100: MockNode) -> None:
    class Liar:
        """A backend whose GPU instance creation silently does nothing."""

        def __init__(self) -> None:
            self.real = a100.backend

        def __getattr__(self, name: str) -> object:
            return getattr(self.real, name)

        def create_gpu_instance(self, index: int, profile_id: int, start: int, size: int) -> int:
            return 99

        def create_compute_instance(self, index: int, gi_id: int, profile_id: int) -> int:
            return 0

    with pytest.raises(ApplyError, match=r"does not match the plan: GPU 0 .*expected GPU "
                                         r"instances 4g.20gb@0 3g.20gb@4, found none"):
        apply(configs(), "4g-3g", Liar(), a100.reset)  # type: ignore[arg-type]
