"""A node's GPU allocation as role node_labels labels it (gpukit.provision.nodes.with_allocation,
filter gpukit.gpu.node_labels) and what role device_plugin waits for on a DRA node (filters
gpukit.gpu.expected_dra_devices and dra_node_serves): the label gpukit.io/gpu.allocation from
gpukit_gpu_allocation, nvidia.com/gpu.deploy.device-plugin=false on a DRA node, and adding the
label to a node provisioned before it is no disruptive change for playbooks/upgrade.yml."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import pytest

from gpukit import inventory as inv
from gpukit.provision import declaration, dra_switch, nodes, upgrade
from gpukit.provision.nodes import NodeSpecError

ALLOCATION = "gpukit.io/gpu.allocation"
DEPLOY = "nvidia.com/gpu.deploy.device-plugin"
T4: dict[str, Any] = {"gpukit_gpu": {"product": "Tesla T4", "count": 2, "memory_mib": 15360},
      "gpukit_device_plugin_configs": {"default": {"version": "v1", "flags": {"plugin": {
          "deviceListStrategy": "volume-mounts"}}}},
      "gpukit_device_plugin_config": "default"}
# The labels role rolling_upgrade watches (roles/rolling_upgrade/tasks/plan.yml).
WATCHED = ["nvidia.com/device-plugin.config", "nvidia.com/mig.config"]


def _filter(plugin: str) -> Any:
    """A filter plugin, imported as Ansible does (the checkout's collections/ joins the
    ansible_collections namespace package)."""
    collections = str(Path(__file__).resolve().parents[2] / "collections")
    if collections not in sys.path:
        sys.path.append(collections)
    return importlib.import_module(f"ansible_collections.gpukit.gpu.plugins.filter.{plugin}")


def test_the_allocation_label_and_the_agent_s_selector() -> None:
    base = nodes.declared_labels({"team": "ml"}, "default")
    assert nodes.with_allocation(base, "device-plugin") == {**base, ALLOCATION: "device-plugin"}
    assert nodes.with_allocation(base, None)[ALLOCATION] == "device-plugin"  # the default
    dra = nodes.with_allocation(base, "dra")
    assert (dra[ALLOCATION], dra[DEPLOY]) == ("dra", "false")
    assert dra["nvidia.com/device-plugin.config"] == "default"  # selection labels stay
    # Not labelled for the agent at all (node_labels_deploy_device_plugin false): a DRA node
    # is still kept off its DaemonSet.
    assert nodes.with_allocation({}, "dra") == {ALLOCATION: "dra", DEPLOY: "false"}
    with pytest.raises(NodeSpecError, match="gpukit_gpu_allocation: 'DRA' is not one of "
                                            "device-plugin, dra"):
        nodes.with_allocation({}, "DRA")


def test_the_filter_takes_the_mode_given_or_the_declaration_s() -> None:
    f = _filter("nodes")
    fact = declaration.for_vars("n1", {**T4, "gpukit_gpu_allocation": "dra"})
    # The role passes it (node_labels_gpu_allocation); the rolling upgrade's plan does not:
    # the preflight's declaration says it.
    assert f.node_labels({}, "default", declaration=fact, gpu_allocation="dra")[DEPLOY] == "false"
    planned = f.node_labels({}, "default", declaration=fact)
    assert (planned[ALLOCATION], planned[DEPLOY]) == ("dra", "false")
    plain = f.node_labels({}, "default")
    assert (plain[ALLOCATION], plain[DEPLOY]) == ("device-plugin", "true")
    from ansible.errors import AnsibleFilterError  # type: ignore[import-untyped]

    with pytest.raises(AnsibleFilterError, match="gpukit_gpu_allocation: 'gpu'"):
        f.node_labels({}, gpu_allocation="gpu")


def _node(labels: dict[str, str], managed: str) -> dict[str, Any]:
    return {"metadata": {"name": "n1", "labels": labels,
                         "annotations": {nodes.MANAGED_LABELS: managed}}, "spec": {}}


def test_labelling_a_device_plugin_node_of_before_is_no_disruptive_change() -> None:
    """A node site.yml provisioned before the label existed: adding
    gpukit.io/gpu.allocation=device-plugin is a label change node_labels applies, no change
    the rolling upgrade rolls (its watched labels, the switch's current mode)."""
    before = {"nvidia.com/device-plugin.config": "default", DEPLOY: "true"}
    node = _node(before, ",".join(sorted(before)))
    labels = nodes.with_allocation(nodes.declared_labels({}, "default"), "device-plugin")
    p = nodes.plan(node, labels, [])
    assert p.changes == (f"label {ALLOCATION}: None -> 'device-plugin'",)
    assert p.patch["metadata"]["labels"] == {ALLOCATION: "device-plugin"}
    assert upgrade.label_changes(p.changes, WATCHED) == []
    assert dra_switch.allocation_change(node, "device-plugin") is None
    # Declared DRA, the same node: the agent's label flips, and the switch is a change.
    dra = nodes.plan(node, nodes.with_allocation(nodes.declared_labels({}, "default"), "dra"), [])
    assert dra.patch["metadata"]["labels"] == {ALLOCATION: "dra", DEPLOY: "false"}
    assert dra_switch.allocation_change(node, "dra")
    # Converged: nothing to do.
    done = _node({**before, ALLOCATION: "device-plugin"},
                 ",".join(sorted({*before, ALLOCATION})))
    assert not nodes.plan(done, labels, []).changed


def test_the_devices_a_dra_node_must_publish() -> None:
    f = _filter("agent")
    host_vars = {**T4, "gpukit_gpu_allocation": "dra"}
    fact = declaration.for_vars("n1", host_vars)
    want = inv.expected_dra_devices(inv.node_from_vars("n1", host_vars))
    assert [d["name_pattern"] for d in want] and len(want) == 2
    assert f.expected_dra_devices(host_vars, "n1", declaration=fact) == want
    assert f.expected_dra_devices(host_vars, "n1") == want  # no preflight: validated now
    # The fact of other values (a role handed something else) is not trusted.
    other = declaration.for_vars("n1", {**host_vars, "gpukit_gpu": {**T4["gpukit_gpu"],
                                                                     "count": 1}})
    assert f.expected_dra_devices(host_vars, "n1", declaration=other) == want
    assert f.expected_dra_devices(T4, "n1") == []  # the device plugin's node
    # What the role's wait then compares: nothing published yet is not served.
    assert f.dra_node_serves([], want) is False
    assert f.dra_node_serves([], []) is True
