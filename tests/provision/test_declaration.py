"""gpukit.provision.declaration: the preflight's per-host result (gpukit_declaration) and what
the roles' filters read of it. With the result for the very values a role was handed, nothing
is parsed or validated again; with other values, or none (a role on its own), the filter
validates them through the same model entries and gives the same answers."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpukit import agent_manifests, inventory
from gpukit.contracts import node_declaration as nd
from gpukit.contracts import plugin_config
from gpukit.inventory import validate
from gpukit.provision import agent, declaration, nodes, sharing, toolkit_config

REPO = Path(__file__).resolve().parents[2]
OPT_OUT = toolkit_config.OPT_OUT_VARIABLE


@pytest.fixture(scope="module")
def example() -> dict[str, dict[str, Any]]:
    """The example fleet's per-host results, as the preflight hands them to the hosts."""
    facts = declaration.facts(inventory.check(REPO / "inventories" / "example"))
    assert len(facts) == 13
    return facts


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """Calls of the config parser and of the host validation, wherever the library binds them."""
    seen: Counter[str] = Counter()
    real_parse, real_node = plugin_config.parse_config, validate.node_from_vars

    def parse(*args: Any, **kwargs: Any) -> Any:
        seen["parse_config"] += 1
        return real_parse(*args, **kwargs)

    def node(*args: Any, **kwargs: Any) -> Any:
        seen["node_from_vars"] += 1
        return real_node(*args, **kwargs)

    monkeypatch.setattr(validate, "parse_config", parse)
    monkeypatch.setattr(validate, "node_from_vars", node)
    monkeypatch.setattr(inventory, "node_from_vars", node)
    yield seen


def inputs(fact: dict[str, Any]) -> dict[str, Any]:
    return dict(fact["inputs"])


def test_the_fact_holds_what_the_model_validated_and_what_it_implies(
        example: dict[str, dict[str, Any]]) -> None:
    fact = example["gpu-t4-01"]
    decl = inventory.load(REPO / "inventories" / "example").node("gpu-t4-01")
    assert fact["host"] == "gpu-t4-01" and fact["node_name"] == decl.node_name
    assert fact["inputs"]["gpukit_device_plugin_configs"] == decl.plugin_configs
    assert fact["inputs"]["gpukit_gpu"] == {"product": decl.gpu.product, "count": decl.gpu.count,
                                            "memory_mib": decl.gpu.memory_mib}
    assert fact["expected_resources"] == inventory.expected_resources(decl)
    assert fact["expected_labels"] == inventory.expected_labels(decl)
    assert fact["labels"] == decl.labels and fact["device_plugin_config"] == "time-sliced"
    assert fact["sharing"]["shared_replicas"] == {"nvidia.com/gpu": 4}
    assert fact["sharing"]["strategy"] == "time-slicing"
    assert "gpukit_kubeconfig" not in fact["inputs"] or fact["inputs"]["gpukit_kubeconfig"]


def test_a_check_with_problems_hands_out_no_declarations(tmp_path: Path) -> None:
    assert declaration.facts(inventory.check(tmp_path / "missing")) == {}


def test_every_role_reads_the_fact_without_parsing_again(
        example: dict[str, dict[str, Any]], parses: Counter[str]) -> None:
    for host, fact in example.items():
        v = inputs(fact)
        configs, selected = v["gpukit_device_plugin_configs"], v.get("gpukit_device_plugin_config")
        mig_configs, mig = v.get("gpukit_mig_configs"), v.get("gpukit_mig_config")
        check = declaration.sharing_check(fact, configs, selected, mig_configs, mig)
        assert check.ok and check.warnings == fact["sharing"]["warnings"]
        assert declaration.hardening_problems(fact, configs, bool(v.get(OPT_OUT)), host) == []
        labels = declaration.labels(fact, v.get("gpukit_node_labels"), selected, mig)
        assert labels == nodes.declared_labels(v.get("gpukit_node_labels"), selected, mig)
        taints = declaration.taints(fact, v.get("gpukit_node_taints"))
        assert taints == nodes.parse_taints(v.get("gpukit_node_taints"), "gpukit_node_taints")
        assert declaration.expected_resources(fact, v, host) == fact["expected_resources"]
    # nodes.* above parse labels and taints, never configs or hosts: the fact was enough.
    assert parses == Counter()


def test_without_the_fact_a_role_validates_through_the_same_entries(
        example: dict[str, dict[str, Any]], parses: Counter[str]) -> None:
    fact = example["gpu-a100-01"]
    v = inputs(fact)
    configs = v["gpukit_device_plugin_configs"]
    alone = declaration.sharing_check(None, configs, v["gpukit_device_plugin_config"],
                                      v["gpukit_mig_configs"], v["gpukit_mig_config"])
    assert alone == sharing.SharingCheck(**fact["sharing"])
    assert parses["parse_config"] == len(configs)
    assert declaration.expected_resources(None, v, "gpu-a100-01") == fact["expected_resources"]
    assert parses["node_from_vars"] == 1


def test_other_values_than_the_declarations_are_validated(
        example: dict[str, dict[str, Any]], parses: Counter[str]) -> None:
    # The rolling upgrade selects a versioned config name: the fact does not describe it.
    fact = example["gpu-t4-01"]
    v = inputs(fact)
    labels = declaration.labels(fact, v.get("gpukit_node_labels"), "time-sliced-v2", None)
    assert labels["nvidia.com/device-plugin.config"] == "time-sliced-v2"
    with pytest.raises(nodes.NodeSpecError, match="gpukit_device_plugin_config: 'a b'"):
        declaration.labels(fact, v.get("gpukit_node_labels"), "a b", None)
    broken = {**v["gpukit_device_plugin_configs"], "x": {"version": "v2"}}
    check = declaration.sharing_check(fact, broken, "time-sliced", None, None)
    assert not check.ok and "gpukit_device_plugin_configs.x" in check.problems[0]
    unhardened = {"env": {"version": "v1"}}
    assert declaration.hardening_problems(fact, unhardened, False, "gpu-t4-01")
    with pytest.raises(inventory.InventoryError, match=r"gpukit_gpu\.count"):
        declaration.expected_resources(fact, {**v, "gpukit_gpu": {"product": "T", "count": -1}},
                                       "gpu-t4-01")
    assert parses["parse_config"] > 0


def test_unset_null_and_empty_are_the_same_value() -> None:
    fact = {"inputs": {"gpukit_node_labels": {}, OPT_OUT: False}}
    assert declaration.matches(fact, gpukit_node_labels=None, gpukit_node_taints=[])
    assert declaration.matches(fact, **{OPT_OUT: None})
    assert not declaration.matches(fact, **{OPT_OUT: True})
    assert not declaration.matches(None, gpukit_node_labels=None)
    assert not declaration.matches({"no": "inputs"})


def test_the_hardening_opt_out_is_a_declaration_variable(tmp_path: Path) -> None:
    # The preflight reads it from the inventory like the others (it used to see only the
    # variables it loaded, which left the opt-out out: an envvar config was then refused).
    inv = tmp_path / "inv"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text("all:\n  children:\n    gpu_nodes:\n      hosts:\n        n1:\n")
    (inv / "group_vars/gpu_nodes.yml").write_text(
        "gpukit_gpu: {product: Tesla T4, count: 2}\n"
        "gpukit_device_plugin_configs: {default: {version: v1}}\n")
    checked = inventory.check(inv)
    assert [p.variable for p in checked.problems] == ["gpukit_device_plugin_configs.default"]
    with (inv / "group_vars/gpu_nodes.yml").open("a") as f:
        f.write(f"{OPT_OUT}: true\n")
    checked = inventory.check(inv)
    assert checked.problems == ()
    assert declaration.facts(checked)["n1"]["inputs"][OPT_OUT] is True


def test_each_agent_s_declaration_is_the_check_s_answer_and_nodes_merge_by_name(
        example: dict[str, dict[str, Any]], parses: Counter[str]) -> None:
    """Served vs declared (issue 30): what the agent compares with is what the preflight's
    check (the suite's oracle) says the node must serve; no validation again."""
    fact = example["gpu-t4-01"]
    entry = agent.node_declaration(fact, inputs(fact), "gpu-t4-01")
    assert entry == {"version": "v1", "node": fact["node_name"],
                     "devicePluginConfig": "time-sliced",
                     "resources": fact["expected_resources"]}
    assert parses == Counter()
    # Without the fact: validated now, the same answer.
    assert agent.node_declaration(None, inputs(fact), "gpu-t4-01") == entry
    merged = agent.merge_declarations({h: agent.declaration_entry(f)
                                       for h, f in example.items()})
    assert len(merged) == len(example)
    other = {**entry, "resources": {"nvidia.com/gpu": 1}}
    with pytest.raises(agent.AgentSpecError, match="hosts a and b both declare node"):
        agent.merge_declarations({"a": entry, "b": other})


def test_a_dra_node_s_declaration_counts_the_oracle_s_devices_by_kind(tmp_path: Path) -> None:
    """A DRA node's entry (for its DRA plugin's watchdog): the oracle's expected_dra_devices
    counted by kind, whole GPUs and MIG devices per profile; no resources, no config."""
    inv = tmp_path / "inv"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text("all:\n  children:\n    gpu_nodes:\n      hosts:\n        n1:\n")
    (inv / "group_vars/gpu_nodes.yml").write_text(
        "gpukit_gpu: {product: NVIDIA A100-SXM4-40GB, count: 2}\n"
        "gpukit_gpu_allocation: dra\n"
        "gpukit_mig_config: mixed\n"
        "gpukit_mig_configs: {mixed: [{devices: [0], mig-enabled: true,\n"
        "  mig-devices: {1g.5gb: 2, 3g.20gb: 1}}, {devices: [1], mig-enabled: false}]}\n")
    fact = declaration.facts(inventory.check(inv))["n1"]
    entry = agent.node_declaration(fact, inputs(fact), "n1")
    assert entry == {"version": "v1", "node": "n1", "devicePluginConfig": "", "resources": {},
                     "draDevices": {"gpu.nvidia.com/gpu": 1, "gpu.nvidia.com/mig-1g.5gb": 2,
                                    "gpu.nvidia.com/mig-3g.20gb": 1}}
    assert agent.merge_declarations({"n1": entry}) == {"n1": entry}
    rendered = agent_manifests.declarations_config_map({"n1": entry}, "ns")["data"]["n1"]
    assert nd.parse(rendered).dra_devices == entry["draDevices"]
    # site.yml's last wait: the DRA plugin's condition names exactly these counts.
    said = {"type": nd.CONDITION_TYPE, "status": "False",
            "message": nd.served_message("n1", entry["draDevices"])}
    node = {"metadata": {"name": "n1"}, "status": {"conditions": [said]}}
    assert agent.dra_declaration_served(node, fact["expected_dra_devices"])
    assert not agent.dra_declaration_served(node, fact["expected_dra_devices"][1:])
    assert not agent.dra_declaration_served(
        {**node, "status": {"conditions": [{**said, "status": "True"}]}},
        fact["expected_dra_devices"])


def test_a_limited_run_keeps_the_other_nodes_declarations() -> None:
    """site.yml --limit gpu-t4 writes gpu-t4's entry and keeps gpu-a100's from the cluster's
    ConfigMap; an entry that no longer parses is dropped."""
    from gpukit.contracts import node_declaration as nd
    from gpukit.provision.play_inputs import declarations_kept

    a100 = nd.NodeDeclaration("gpu-a100", {"nvidia.com/gpu": 8}, "default")
    found = [{"data": {"gpu-a100": nd.render(a100), "gpu-t4": "stale", "gone": "version: v9"}}]
    t4 = {"version": "v1", "node": "gpu-t4", "devicePluginConfig": "ts",
          "resources": {"nvidia.com/gpu": 4}}
    assert declarations_kept(found, {"gpu-t4": t4}, ["gpu-t4"]) == {
        "gpu-a100": a100.as_dict(), "gpu-t4": t4}
    assert declarations_kept([], {"gpu-t4": t4}, ["gpu-t4"]) == {"gpu-t4": t4}


def test_a_rollout_hands_one_node_its_new_declaration() -> None:
    """The rolling upgrade rewrites only its node's entry (the others as the cluster has
    them), removes it when the node moves to DRA, and applies nothing when it is current."""
    from gpukit.contracts import node_declaration as nd
    from gpukit.provision.play_inputs import declaration_update

    a100 = nd.NodeDeclaration("gpu-a100", {"nvidia.com/gpu": 8}, "default")
    old = nd.NodeDeclaration("gpu-t4", {"nvidia.com/gpu": 8}, "time-sliced")
    new = nd.NodeDeclaration("gpu-t4", {"nvidia.com/gpu": 16}, "time-sliced")
    found = [{"data": {"gpu-a100": nd.render(a100), "gpu-t4": nd.render(old)}}]
    cm = declaration_update(found, "gpu-t4", new.as_dict(), "ns")
    assert cm is not None and cm["metadata"] == {
        "name": "gpukit-node-agent-declarations", "namespace": "ns",
        "labels": {"app.kubernetes.io/name": "gpukit-node-agent",
                   "app.kubernetes.io/part-of": "gpukit"}}
    assert cm["data"] == {"gpu-a100": nd.render(a100), "gpu-t4": nd.render(new)}
    assert declaration_update([cm], "gpu-t4", new.as_dict(), "ns") is None
    moved = declaration_update(found, "gpu-t4", None, "ns")
    assert moved is not None and moved["data"] == {"gpu-a100": nd.render(a100)}
    assert declaration_update([moved], "gpu-t4", None, "ns") is None
    assert declaration_update([], "gpu-t4", new.as_dict(), "ns")["data"] == {  # type: ignore[index]
        "gpu-t4": nd.render(new)}


def test_the_agent_s_condition_serves_only_with_the_expected_counts() -> None:
    """The rollout waits for the agent's condition to name the counts the node now declares:
    a False condition about the declaration before is not enough."""
    from gpukit.contracts import node_declaration as nd
    from gpukit.plugin.served import Served, compare
    from gpukit.provision.upgrade import declaration_served

    def node(status: str, message: str) -> dict[str, Any]:
        return {"metadata": {"name": "gpu-t4"}, "status": {"conditions": [
            {"type": "Ready", "status": "True"},
            {"type": nd.CONDITION_TYPE, "status": status, "message": message}]}}

    verdict = compare(nd.NodeDeclaration("gpu-t4", {"nvidia.com/gpu": 16, "nvidia.com/mig-1g.5gb": 0}),
                      Served({"nvidia.com/gpu": 16}))
    assert not verdict.mismatch
    assert declaration_served(node("False", verdict.message), {"nvidia.com/gpu": 16})
    assert not declaration_served(node("False", verdict.message), {"nvidia.com/gpu": 8})
    assert not declaration_served(node("True", verdict.message), {"nvidia.com/gpu": 16})
    assert not declaration_served({"metadata": {"name": "gpu-t4"}}, {"nvidia.com/gpu": 16})
    other = nd.served_message("gpu-a100", {"nvidia.com/gpu": 16})
    assert not declaration_served(node("False", other), {"nvidia.com/gpu": 16})
