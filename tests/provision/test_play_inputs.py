"""gpukit.provision.play_inputs: the library fed from a play's hostvars, k8s_info results and
slurp output (what the collection's filters hand over)."""

from __future__ import annotations

import base64
from typing import Any

import pytest
import yaml

from gpukit import inventory
from gpukit.provision import agent, play_inputs, upgrade
from gpukit.provision import sharing_rollout as sr


def ts(replicas: int) -> dict[str, Any]:
    return {"version": "v1", "flags": {"migStrategy": "none"},
            "sharing": {"timeSlicing": {"resources": [
                {"name": "nvidia.com/gpu", "replicas": replicas}]}}}  # fmt: skip


OLD = {"default": ts(1), "time-sliced": ts(4)}
NEW = {"default": ts(1), "time-sliced": ts(8)}
NS = "gpukit-system"


# -- per-host facts ------------------------------------------------------------------------


def test_host_facts_reads_each_host_and_gives_none_for_what_is_missing() -> None:
    hostvars = {"a": {"r": "done"}, "b": {}}
    assert play_inputs.host_facts(hostvars, ["a", "b", "gone"], "r") == {
        "a": "done", "b": None, "gone": None}


def test_merged_plugin_configs_skips_hosts_without_the_fact() -> None:
    hostvars = {"a": {"cfg": {"x": ts(2)}}, "b": {"cfg": {"y": ts(4)}}, "c": {}}
    assert play_inputs.merged_plugin_configs(["a", "b", "c"], hostvars, "cfg") == {
        "x": ts(2), "y": ts(4)}


def test_merged_plugin_configs_refuses_one_name_for_two_configs() -> None:
    hostvars = {"a": {"cfg": {"x": ts(2)}}, "b": {"cfg": {"x": ts(4)}}}
    with pytest.raises(agent.AgentSpecError, match=r"\['x'\]: differs between a and b"):
        play_inputs.merged_plugin_configs(["a", "b"], hostvars, "cfg")


def test_failed_hosts_counts_interrupted_and_failed_but_not_untouched_hosts() -> None:
    hostvars = {"a": {"rolling_upgrade_result": "done"}, "b": {"rolling_upgrade_result": "failed"},
                "c": {"rolling_upgrade_result": "draining"}, "d": {}}
    assert play_inputs.failed_hosts(hostvars, ["a", "b", "c", "d"]) == ["b", "c"]
    assert play_inputs.failed_hosts({"a": {"mine": "failed"}}, ["a"], "mine") == ["a"]


def test_upgrade_report_reads_the_planned_hosts_results_and_failures() -> None:
    planned = {"order": ["a", "b", "c"]}
    hostvars = {"a": {"rolling_upgrade_result": "done"},
                "b": {"rolling_upgrade_result": "failed", "rolling_upgrade_failure": "no GPU"},
                "c": {}, "unplanned": {"rolling_upgrade_result": "failed"}}
    r = play_inputs.upgrade_report(planned, hostvars)
    assert r == upgrade.report(planned, {"a": "done", "b": "failed", "c": None},
                               {"b": "no GPU"}).as_dict()
    assert (r["done"], r["failed"], r["not_reached"]) == (["a"], ["b"], ["c"])
    assert "b: FAILED, left cordoned: no GPU" in r["lines"]
    assert play_inputs.upgrade_report(planned, hostvars, check_mode=True)["complete"]


# -- the sharing rollout from k8s_info results ---------------------------------------------


def test_live_configs_takes_the_first_resource_or_the_object() -> None:
    cm = sr.config_map(OLD, NS)
    assert play_inputs.live_configs([cm]) == play_inputs.live_configs(cm) == OLD
    assert play_inputs.live_configs([]) is None and play_inputs.live_configs(None) is None


def test_publish_wraps_the_changed_configs_in_the_configmap_and_then_has_nothing_to_do() -> None:
    published = play_inputs.sharing_publish([sr.config_map(OLD, NS)], NEW, NS)
    assert published is not None
    assert published["metadata"]["name"] == sr.CONFIG_MAP
    assert published["metadata"]["namespace"] == NS
    versioned = sr.config_map({"x": ts(8)}, NS)["data"]["x"]
    assert published["data"]["time-sliced"] == sr.config_map(OLD, NS)["data"]["time-sliced"]
    assert versioned in published["data"].values() and len(published["data"]) == 3
    assert play_inputs.sharing_publish([published], NEW, NS) is None
    assert play_inputs.sharing_publish([], NEW, NS) is None  # no ConfigMap: site.yml writes it


def test_node_plan_reads_the_live_configmap() -> None:
    plan = play_inputs.sharing_node_plan([sr.config_map(OLD, NS)], NEW, "time-sliced", "default",
                                         "time-sliced")
    assert plan["changes"] and plan["label"] != "time-sliced"
    assert play_inputs.sharing_node_plan([sr.config_map(NEW, NS)], NEW, "time-sliced", "",
                                         "time-sliced") == {
        "changes": [], "label": "time-sliced", "plan_label": "time-sliced"}


def test_node_uses_match_nodes_to_hosts_by_node_name() -> None:
    objs: list[dict[str, Any]] = [
        {"metadata": {"name": "k8s-a", "labels": {"nvidia.com/device-plugin.config": "x"}}},
        {"metadata": {"name": "b", "labels": {}}},
        {"metadata": {"name": "stranger"}}]
    hostvars = {"a": {"gpukit_node_name": "k8s-a", "gpukit_device_plugin_config": "x"},
                "b": {"gpukit_device_plugin_config": ""}}
    assert play_inputs.node_uses(objs, hostvars, ["a", "b"]) == [
        sr.NodeUse("k8s-a", "x", "a", "x"), sr.NodeUse("b", None, "b", None),
        sr.NodeUse("stranger", None, None, None)]
    assert play_inputs.node_uses(None, hostvars, ["a"]) == []


def test_finish_gives_configmaps_to_apply() -> None:
    published = play_inputs.sharing_publish([sr.config_map(OLD, NS)], NEW, NS)
    versioned = next(k for k in published["data"] if k not in NEW)  # type: ignore[index]
    objs = [{"metadata": {"name": "n1", "labels": {"nvidia.com/device-plugin.config": versioned}}}]
    hostvars = {"n1": {"gpukit_device_plugin_config": "time-sliced"}}
    out = play_inputs.sharing_finish([published], NEW, objs, hostvars, ["n1"], "default", True, NS)
    assert out["needed"] and out["relabel"] == {"n1": "time-sliced"}
    assert out["stage"]["kind"] == "ConfigMap" and versioned in out["stage"]["data"]
    assert out["final"]["data"] == sr.config_map(NEW, NS)["data"]
    waiting = play_inputs.sharing_finish([published], NEW, objs, hostvars, ["n1"], "default",
                                         False, NS)
    assert not waiting["needed"] and waiting["stage"] is None and waiting["final"] is None


def test_mounted_decodes_slurp_and_is_false_for_what_is_not_base64_text() -> None:
    text = base64.b64encode(yaml.safe_dump(ts(8)).encode()).decode()
    assert play_inputs.sharing_mounted(text, ts(8))
    assert not play_inputs.sharing_mounted(text, ts(4))
    assert not play_inputs.sharing_mounted("not base64!", ts(8))
    assert not play_inputs.sharing_mounted(base64.b64encode(b"\xff\xfe").decode(), ts(8))
    assert not play_inputs.sharing_mounted(None, ts(8))


# -- a host's declaration ------------------------------------------------------------------


class _HostVars(dict[str, Any]):
    """A host's variables as a play resolves them: reading one templates it, and a variable
    that cannot be templated (here: every one but the declaration's) fails when read."""

    def __getitem__(self, key: str) -> Any:
        if not key.startswith(("gpukit_", "nvidia_driver_")) and key != "ansible_host":
            raise AssertionError(f"{key} was read")
        return super().__getitem__(key)


def test_expected_resources_reads_the_declaration_variables_only() -> None:
    host_vars = _HostVars({"gpukit_gpu": {"product": "Tesla T4", "count": 2},
                           "gpukit_device_plugin_configs": {"time-sliced": ts(4)},
                           "gpukit_device_plugin_config": "time-sliced",
                           # NVIDIA's default strategy (envvar) needs the runtime's opt-out:
                           # a declaration variable, read like the others.
                           "gpukit_runtime_accept_envvar_unprivileged": True,
                           "ansible_host": "10.0.0.1", "role_var": "{{ undefined }}"})
    assert play_inputs.expected_resources(host_vars, "n1") == {"nvidia.com/gpu": 8}


def test_expected_resources_names_the_host_and_variable_of_a_bad_declaration() -> None:
    with pytest.raises(inventory.InventoryError, match=r"n1.*gpukit_gpu"):
        play_inputs.expected_resources({"gpukit_gpu": {"count": "two"}}, "n1")
