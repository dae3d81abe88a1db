"""Labels: GFD labels match the declaration; declared labels and taints are on the node; the
labels agree with the advertised resources."""

from __future__ import annotations

from typing import Any

import pytest

from gpukit import inventory as inv
from gpukit.conformance import expect
from gpukit.conformance.checks import Check
from gpukit.conformance.common import need_decl, need_node_agent
from gpukit.contracts import config_versions
from gpukit.contracts import label_names as ln
from gpukit.k8s.nodes import capacity

pytestmark = pytest.mark.labels


def _labels(suite: Any, node: str) -> dict[str, str]:
    obj = suite.listed_node(node)
    return dict(obj.metadata.labels or {}) if obj is not None else {}


def test_gfd_labels(gpukit_suite: Any, node: str, check: Check) -> None:
    """product, count, memory, replicas, sharing-strategy, mig.strategy, mig.capable, driver
    major and the per-MIG-profile labels."""
    decl = need_decl(gpukit_suite, node)
    try:
        expected = expect.expected_labels(decl)
    except inv.InventoryError as exc:
        pytest.fail(f"node {node}: the inventory's declaration is inconsistent: {exc}",
                    pytrace=False)
    check.subset("label", expected, _labels(gpukit_suite, node))
    check.verify()


def test_agent_serves_the_selected_config(gpukit_suite: Any, node: str, check: Check) -> None:
    """The node agent accepted the config its node selects. An unknown, malformed or empty
    one leaves it serving its last good config, which this label and a node Event report."""
    decl = need_decl(gpukit_suite, node)
    if decl.gpu.count == 0:
        check.skip("declares no GPUs")
    if decl.dra:
        check.skip("not served by the device plugin (gpukit_gpu_allocation: dra)")
    need_node_agent(gpukit_suite, node, check, f"the label {ln.DEVICE_PLUGIN_CONFIG_STATE}")
    state = _labels(gpukit_suite, node).get(ln.DEVICE_PLUGIN_CONFIG_STATE)
    observed = state or "absent"
    if state == ln.CONFIG_STATE_FAILED:
        observed += f" (the agent serves its last good config; kubectl describe node {node})"
    check.equal(f"label {ln.DEVICE_PLUGIN_CONFIG_STATE}", ln.CONFIG_STATE_SUCCESS, observed)
    check.verify()


def test_declared_node_labels(gpukit_suite: Any, node: str, check: Check) -> None:
    """gpukit_node_labels, and the config selectors (device-plugin.config, mig.config)."""
    decl = need_decl(gpukit_suite, node)
    expected = {**decl.labels, **decl.selection_labels()}
    if not expected:
        check.skip("declares no node labels")
    have = _labels(gpukit_suite, node)
    # In a rolling upgrade's batch (playbooks/upgrade.yml), the node selects the declared
    # config's new content under its versioned name: that is the declared config.
    name = decl.plugin_config_name
    if name and name in decl.plugin_configs and config_versions.label_selects(
            have.get(inv.DEVICE_PLUGIN_CONFIG_LABEL), name, decl.plugin_configs[name]):
        have[inv.DEVICE_PLUGIN_CONFIG_LABEL] = name
    check.subset("label", expected, have)
    check.verify()


@pytest.mark.applies_to("taints")
def test_declared_taints(gpukit_suite: Any, node: str, check: Check) -> None:
    decl = need_decl(gpukit_suite, node)
    if not decl.taints:
        check.skip("declares no taints (gpukit_node_taints)")
    obj = gpukit_suite.listed_node(node)
    have = {(t.key, t.value or "", t.effect) for t in (obj.spec.taints or [])} if obj else set()
    for t in decl.taints:
        want = f"{t.key}={t.value}:{t.effect}"
        check.equal("taint", want, want if (t.key, t.value, t.effect) in have else
                    "absent (" + ", ".join(sorted(f"{k}={v}:{e}" for k, v, e in have)) + ")")
    check.verify()


def test_labels_agree_with_resources(gpukit_suite: Any, node: str, check: Check) -> None:
    """Needs no inventory: each `<resource>.count` x `.replicas` label matches capacity."""
    labels = _labels(gpukit_suite, node)
    cap = capacity(gpukit_suite.listed_node(node))
    migs = sorted(k.removesuffix(".count") for k in labels
                  if k.startswith(ln.MIG_RESOURCE_PREFIX) and k.endswith(".count"))
    resources = migs + ([ln.GPU_RESOURCE] if not migs and ln.GPU_COUNT in labels
                        else [])
    if not resources:
        check.skip("carries no GFD count labels")
    for resource in resources:
        try:
            count = int(labels[f"{resource}.count"])
            replicas = int(labels.get(f"{resource}.replicas", "1"))
        except ValueError as exc:
            check.record("count/replicas labels", "integers", str(exc), False, resource)
            continue
        advertised = cap.get(resource, 0) + cap.get(f"{resource}.shared", 0)
        if replicas <= 1:
            check.equal("capacity vs .count label", count, advertised, resource)
        else:  # per-GPU replica counts make .replicas the largest one: an upper bound
            check.true("capacity within .count x .replicas labels",
                       count <= advertised <= count * replicas,
                       f"{count}..{count * replicas}", advertised, resource)
    check.verify()
