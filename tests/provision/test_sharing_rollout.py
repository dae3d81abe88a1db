"""Rolling a device plugin config's content change: plan, versioned names, publish, finish."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from gpukit import agent_manifests as deploy
from gpukit.contracts import config_versions as cv
from gpukit.contracts import label_syntax
from gpukit.provision import sharing_rollout as sr
from gpukit.provision.sharing_rollout import NodeUse


def ts(replicas: int) -> dict[str, Any]:
    return {"version": "v1", "flags": {"migStrategy": "none"},
            "sharing": {"timeSlicing": {"renameByDefault": False, "resources": [
                {"name": "nvidia.com/gpu", "replicas": replicas}]}}}  # fmt: skip


DEFAULT = {"version": "v1", "flags": {"migStrategy": "none"}}
MIG = {"version": "v1", "flags": {"migStrategy": "mixed"}}
OLD = {"default": DEFAULT, "mig-mixed": MIG, "time-sliced": ts(4)}
NEW = {"default": DEFAULT, "mig-mixed": MIG, "time-sliced": ts(8)}


def live(configs: dict[str, Any]) -> dict[str, Any] | None:
    """What the planner reads back from the cluster's ConfigMap."""
    return sr.parse_data(sr.config_map(configs, "gpukit-system"))


# -- versioned names -----------------------------------------------------------------------


def test_versioned_name_is_stable_and_follows_the_content() -> None:
    v8 = cv.versioned_name("time-sliced", ts(8))
    assert v8.startswith("time-sliced-") and len(v8) == len("time-sliced-") + 8
    # Key order does not matter, content does.
    reordered = {"sharing": ts(8)["sharing"], "flags": ts(8)["flags"], "version": "v1"}
    assert cv.versioned_name("time-sliced", reordered) == v8
    assert cv.versioned_name("time-sliced", ts(4)) != v8
    assert cv.is_version_of(v8, "time-sliced")
    assert not cv.is_version_of("time-sliced", "time-sliced")
    assert not cv.is_version_of("time-sliced-x", "time-sliced")
    assert not cv.is_version_of(cv.versioned_name("default", ts(8)), "time-sliced")


def test_the_conformance_suite_accepts_the_versioned_name_of_the_declared_content() -> None:
    assert cv.label_selects("time-sliced", "time-sliced", ts(8))
    assert cv.label_selects(cv.versioned_name("time-sliced", ts(8)), "time-sliced", ts(8))
    assert not cv.label_selects(cv.versioned_name("time-sliced", ts(4)), "time-sliced", ts(8))
    assert not cv.label_selects(None, "time-sliced", ts(8))


def test_versioned_name_of_a_long_name_is_a_valid_label_value_and_key() -> None:
    name = "a" * 60 + "-.b"
    v = cv.versioned_name(name, ts(8))
    assert len(v) <= 63 and label_syntax.value_ok(v), v
    assert cv.is_version_of(v, name)
    assert sr.base_of(v, ["other", name]) == name


def test_the_configmap_renders_as_the_device_plugin_role_does() -> None:
    ours = sr.config_map(OLD, "gpukit-system")
    role = deploy.config_map(deploy.AgentDeployment(image="x", configs=copy.deepcopy(OLD)))
    assert ours == role


# -- plan ----------------------------------------------------------------------------------


def test_a_node_on_the_old_content_differs_with_the_setting_named() -> None:
    p = sr.node_plan(live(OLD), NEW, "time-sliced", "default", "time-sliced")
    assert p.changes == [
        "sharing config time-sliced: sharing.timeSlicing.resources[nvidia.com/gpu].replicas"
        " 4 -> 8"]
    assert p.label == cv.versioned_name("time-sliced", ts(8))
    assert p.plan_label == "time-sliced"


def test_a_node_selecting_an_unchanged_config_does_not_differ() -> None:
    p = sr.node_plan(live(OLD), NEW, "mig-mixed", "default", "mig-mixed")
    assert p.changes == [] and p.label == "mig-mixed"
    # Nothing differs once the ConfigMap carries the inventory's content.
    p = sr.node_plan(live(NEW), NEW, "time-sliced", "default", "time-sliced")
    assert p.changes == [] and p.label == "time-sliced" and p.plan_label == "time-sliced"


def test_a_node_without_a_declared_config_compares_the_default_config() -> None:
    new = {**OLD, "default": {**DEFAULT, "flags": {"migStrategy": "single"}}}
    p = sr.node_plan(live(OLD), new, None, "default", None)
    assert p.changes == ["sharing config default: flags.migStrategy none -> single"]
    assert p.label == cv.versioned_name("default", new["default"])
    assert p.plan_label is None
    assert sr.node_plan(live(OLD), new, None, None, None).changes == []


def test_a_rolled_node_on_the_versioned_name_does_not_differ_and_keeps_its_label() -> None:
    published = sr.publish(live(OLD), NEW)
    assert published is not None
    v = cv.versioned_name("time-sliced", ts(8))
    p = sr.node_plan(published, NEW, "time-sliced", "default", v)
    assert p.changes == [] and p.label == v and p.plan_label == v


def test_a_node_on_an_older_version_differs() -> None:
    stopped = {**OLD, cv.versioned_name("time-sliced", ts(8)): ts(8)}
    v8 = cv.versioned_name("time-sliced", ts(8))
    new = {**OLD, "time-sliced": ts(16)}
    p = sr.node_plan(live(stopped), new, "time-sliced", "default", v8)
    assert p.changes == [
        "sharing config time-sliced: sharing.timeSlicing.resources[nvidia.com/gpu].replicas"
        " 8 -> 16"]
    assert p.label == cv.versioned_name("time-sliced", ts(16))


def test_a_node_switching_configs_is_the_label_plan_s_business() -> None:
    p = sr.node_plan(live(OLD), NEW, "time-sliced", "default", "mig-mixed")
    assert p.changes == [] and p.label == cv.versioned_name("time-sliced", ts(8))


def test_no_configmap_no_sharing_plan() -> None:
    p = sr.node_plan(None, NEW, "time-sliced", "default", "time-sliced")
    assert p.changes == [] and p.label == "time-sliced"


def test_a_config_the_configmap_lacks_or_cannot_read() -> None:
    p = sr.node_plan(live({"default": DEFAULT}), NEW, "time-sliced", "default", "time-sliced")
    assert p.changes == ["sharing config time-sliced: not in the cluster's ConfigMap"
                         " gpukit-node-agent-configs yet"]
    assert p.label == "time-sliced"  # publishing adds it under its own name
    broken = sr.parse_data({"data": {"time-sliced": "a: [", "default": "version: v1\n"}})
    p = sr.node_plan(broken, NEW, "time-sliced", "default", "time-sliced")
    assert p.changes and "not YAML" in p.changes[0]


def test_many_differences_are_summarised() -> None:
    new = {"version": "v1", "flags": {"migStrategy": "single", "failOnInitError": False,
                                      "plugin": {"passDeviceSpecs": True,
                                                 "deviceListStrategy": "cdi-cri",
                                                 "deviceIDStrategy": "index"}}}  # fmt: skip
    (line,) = sr.describe("default", DEFAULT, new)
    assert line.endswith("(and 1 more)"), line


# -- publish -------------------------------------------------------------------------------


def test_publish_keeps_the_old_content_and_adds_the_versioned_key() -> None:
    data = sr.publish(live(OLD), NEW)
    v = cv.versioned_name("time-sliced", ts(8))
    assert data is not None and set(data) == {*OLD, v}
    assert data["time-sliced"] == ts(4) and data[v] == ts(8)
    assert sr.publish(data, NEW) is None  # published already: nothing to write
    assert sr.publish(live(NEW), NEW) is None
    assert sr.publish(None, NEW) is None


def test_publish_adds_a_new_config_under_its_own_name() -> None:
    data = sr.publish(live({"default": DEFAULT}), NEW)
    assert data is not None and set(data) == set(NEW)


# -- finish --------------------------------------------------------------------------------

V8 = cv.versioned_name("time-sliced", ts(8))


def nodes(t4_label: str | None) -> list[NodeUse]:
    return [NodeUse("gpu-a100", "mig-mixed", "gpu-a100", "mig-mixed"),
            NodeUse("gpu-t4", t4_label, "gpu-t4", "time-sliced")]  # fmt: skip


def test_finish_promotes_relabels_and_drops_the_versioned_key() -> None:
    published = sr.publish(live(OLD), NEW)
    f = sr.finish(published, NEW, nodes(V8), "default", complete=True)
    assert f.stage is not None and f.stage["time-sliced"] == ts(8) and V8 in f.stage
    assert f.relabel == {"gpu-t4": "time-sliced"}
    assert f.final is not None and set(f.final) == set(NEW)
    assert sr.config_map(f.final, "gpukit-system") == sr.config_map(NEW, "gpukit-system")


def test_finish_does_nothing_when_the_rollout_did_not_complete() -> None:
    published = sr.publish(live(OLD), NEW)
    f = sr.finish(published, NEW, nodes(V8), "default", complete=False)
    assert f.stage is None and f.relabel == {} and f.final is None
    assert f.lines and "did not complete" in f.lines[0]
    assert not f.as_dict()["needed"]


def test_finish_keeps_the_old_content_while_a_node_still_selects_it() -> None:
    published = sr.publish(live(OLD), NEW)
    skipped = [*nodes(V8), NodeUse("gpu-t4-b", "time-sliced", None, None)]
    f = sr.finish(published, NEW, skipped, "default", complete=True)
    assert f.stage is None and f.relabel == {} and f.final is None
    assert "gpu-t4-b still serve(s) the old content" in f.lines[0]


def test_finish_counts_unlabelled_nodes_as_users_of_the_default_config() -> None:
    new = {**OLD, "default": {**DEFAULT, "flags": {"migStrategy": "single"}}}
    published = sr.publish(live(OLD), new)
    vd = cv.versioned_name("default", new["default"])
    f = sr.finish(published, new, [NodeUse("a", None, "a", None)], "default", complete=True)
    assert f.stage is None and f.relabel == {}
    # Once rolled (labelled with the version), the label goes away again.
    f = sr.finish(published, new, [NodeUse("a", vd, "a", None)], "default", complete=True)
    assert f.relabel == {"a": "default"}
    assert f.final is not None and vd not in f.final and f.final["default"] == new["default"]


def test_finish_after_a_crash_between_its_steps_resumes() -> None:
    # The promoted content was written, the node still carries the versioned label.
    staged = live({**NEW, V8: ts(8)})
    f = sr.finish(staged, NEW, nodes(V8), "default", complete=True)
    assert f.stage is None and f.relabel == {"gpu-t4": "time-sliced"}
    assert f.final is not None and V8 not in f.final
    # Relabelled, not yet dropped.
    f = sr.finish(staged, NEW, nodes("time-sliced"), "default", complete=True)
    assert f.stage is None and f.relabel == {} and f.final is not None and V8 not in f.final


def test_finish_keeps_a_versioned_key_a_node_still_selects() -> None:
    published = sr.publish(live(OLD), NEW)
    foreign = [*nodes(V8), NodeUse("not-in-inventory", V8)]
    f = sr.finish(published, NEW, foreign, "default", complete=True)
    assert f.relabel == {"gpu-t4": "time-sliced"}
    assert f.stage is not None and f.final is None  # V8 stays: a node selects it


def test_a_finished_rollout_s_finish_changes_nothing() -> None:
    f = sr.finish(live(NEW), NEW, nodes("time-sliced"), "default", complete=True)
    assert f.stage is None and f.relabel == {} and f.final is None and f.lines == []


@pytest.mark.parametrize("text", [yaml.safe_dump(ts(8)), yaml.safe_dump(ts(8), sort_keys=True)])
def test_mounted_compares_content(text: str) -> None:
    assert sr.mounted(text, ts(8))
    assert not sr.mounted(yaml.safe_dump(ts(4)), ts(8))
    assert not sr.mounted(None, ts(8)) and not sr.mounted("a: [", ts(8))


# -- the Ansible filter adapters -------------------------------------------------------------


def _filters() -> Any:
    """The collection's sharing filters, imported as Ansible imports them (ansible_collections
    is a namespace package: the checkout's collections/ joins it)."""
    import importlib
    import sys
    from pathlib import Path

    collections = str(Path(__file__).resolve().parents[2] / "collections")
    if collections not in sys.path:
        sys.path.append(collections)
    module = importlib.import_module("ansible_collections.gpukit.gpu.plugins.filter.sharing")
    return module.FilterModule().filters()


def test_the_filters_plan_publish_and_finish_from_k8s_info_results() -> None:
    f = _filters()
    cm = sr.config_map(OLD, "gpukit-system")
    p = f["sharing_node_plan"]([cm], NEW, "time-sliced", "default", "time-sliced")
    assert p["changes"] and p["label"] == V8
    assert f["sharing_node_plan"]([], NEW, "time-sliced", "default", "time-sliced")["changes"] == []
    published = f["sharing_publish"]([cm], NEW, "gpukit-system")
    assert published["metadata"]["name"] == sr.CONFIG_MAP and V8 in published["data"]
    assert f["sharing_publish"]([published], NEW, "gpukit-system") is None
    node_objs = [{"metadata": {"name": "gpu-t4", "labels": {"nvidia.com/device-plugin.config": V8}}},
                 {"metadata": {"name": "gpu-a100",
                               "labels": {"nvidia.com/device-plugin.config": "mig-mixed"}}}]
    hostvars = {"gpu-t4": {"gpukit_device_plugin_config": "time-sliced"},
                "gpu-a100": {"gpukit_device_plugin_config": "mig-mixed"}}
    out = f["sharing_finish"]([published], NEW, node_objs, hostvars, ["gpu-a100", "gpu-t4"],
                              "default", True, "gpukit-system")
    assert out["needed"] and out["relabel"] == {"gpu-t4": "time-sliced"}
    assert out["final"]["data"] == sr.config_map(NEW, "gpukit-system")["data"]
    out = f["sharing_finish"]([published], NEW, node_objs, hostvars, ["gpu-a100", "gpu-t4"],
                              "default", False, "gpukit-system")
    assert not out["needed"]
    import base64

    text = base64.b64encode(yaml.safe_dump(ts(8)).encode()).decode()
    assert f["sharing_mounted"](text, ts(8)) and not f["sharing_mounted"](text, ts(4))
