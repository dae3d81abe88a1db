"""Node labels and taints from the inventory, merged with what others put on the node.

gpukit sets the labels and taints a node's inventory declares, and removes the ones it set
earlier that the inventory no longer declares; it never touches labels or taints it did not
set (the node agent's `nvidia.com/gpu.*` labels, the kubelet's, a cordon's taint). What it
set is recorded on the node in two annotations.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpukit.contracts import label_names as ln
from gpukit.contracts.dra import MAX_SHARES, MIN_SHARES
from gpukit.inventory import node_meta
from gpukit.inventory.model import DEFAULT_GPU_ALLOCATION, GPU_ALLOCATIONS, TAINT_EFFECTS, Taint
from gpukit.inventory.problems import Problem

DEVICE_PLUGIN_CONFIG = ln.DEVICE_PLUGIN_CONFIG
MIG_CONFIG = ln.MIG_CONFIG
# The device plugin DaemonSet's default node selector (GPU Operator's name for it).
DEPLOY_DEVICE_PLUGIN = ln.DEPLOY_DEVICE_PLUGIN
# The declared GPU allocation (gpukit_gpu_allocation): the DRA plugin's DaemonSet selects
# `dra`; the rolling upgrade reads a change of it as disruptive (gpukit.provision.dra_switch:
# a node without the label is on the device plugin, so adding `device-plugin` changes nothing).
GPU_ALLOCATION = ln.GPU_ALLOCATION
# A DRA node's shared devices (gpukit_dra_shares): the DRA plugin reads the count from it.
DRA_SHARES = ln.DRA_SHARES
MANAGED_LABELS = "gpukit/managed-labels"
MANAGED_TAINTS = "gpukit/managed-taints"
EFFECTS = TAINT_EFFECTS  # the inventory model's choices (one constant)

__all__ = ["EFFECTS", "NodeSpecError", "Taint", "declared_labels", "parse_taints", "plan",
           "with_allocation"]


class NodeSpecError(ValueError):
    """A declared label or taint is invalid; the message names the variable and the entry."""


def _raise(problems: Sequence[Problem]) -> None:
    if problems:
        raise NodeSpecError("; ".join(str(p) for p in problems))


def parse_taints(raw: Sequence[Mapping[str, Any]] | None, where: str) -> list[Taint]:
    """The declared taints, by the inventory model's rules (gpukit.inventory.node_meta)."""
    taints, problems = node_meta.parse_taints(raw, where)
    _raise(problems)
    return list(taints)


def declared_labels(
    extra: Mapping[str, Any] | None,
    device_plugin_config: str | None = None,
    mig_config: str | None = None,
    deploy_device_plugin: bool = True,
) -> dict[str, str]:
    """Every label the inventory declares for a node."""
    labels, problems = node_meta.parse_labels(extra or {})
    for var, name, label in (("gpukit_device_plugin_config", device_plugin_config,
                              DEVICE_PLUGIN_CONFIG), ("gpukit_mig_config", mig_config, MIG_CONFIG)):
        if name:
            if p := node_meta.value_problem(var, name, name):
                problems.append(p)
            labels[label] = name
    _raise(problems)
    if deploy_device_plugin:
        labels[DEPLOY_DEVICE_PLUGIN] = "true"
    return labels


def with_allocation(labels: Mapping[str, str], allocation: str | None,
                    dra_shares: int | None = None) -> dict[str, str]:
    """`labels` with the node's GPU allocation: gpukit.io/gpu.allocation names it, and a DRA
    node gets nvidia.com/gpu.deploy.device-plugin=false whatever else was asked, so the node
    agent's DaemonSet leaves it: one node is never served by both APIs. A DRA node whose devices
    are shared (gpukit_dra_shares, validated by the inventory model) gets gpukit.io/dra.shares."""
    mode = allocation or DEFAULT_GPU_ALLOCATION
    if mode not in GPU_ALLOCATIONS:
        raise NodeSpecError(f"gpukit_gpu_allocation: {mode!r} is not one of "
                            f"{', '.join(GPU_ALLOCATIONS)}")
    if dra_shares is not None and (isinstance(dra_shares, bool) or not isinstance(dra_shares, int)
                                   or not MIN_SHARES <= dra_shares <= MAX_SHARES):
        raise NodeSpecError(f"gpukit_dra_shares: {dra_shares!r} is not an integer from "
                            f"{MIN_SHARES} to {MAX_SHARES}")
    if dra_shares is not None and mode != "dra":
        raise NodeSpecError(f"gpukit_dra_shares: {dra_shares!r} shares DRA devices: it needs "
                            f"gpukit_gpu_allocation dra (this node is on {mode})")
    out = {**labels, GPU_ALLOCATION: mode}
    if mode == "dra":
        out[DEPLOY_DEVICE_PLUGIN] = "false"
        if dra_shares:
            out[DRA_SHARES] = str(dra_shares)
    return out


@dataclass(frozen=True)
class NodePatch:
    """A strategic-merge patch for the node (for kubernetes.core.k8s, state: patched)."""

    patch: dict[str, Any]
    changes: tuple[str, ...]

    @property
    def changed(self) -> bool:
        return bool(self.changes)


def _split(text: str | None) -> list[str]:
    return [s for s in (text or "").split(",") if s]


def plan(node: Mapping[str, Any], labels: Mapping[str, str], taints: Sequence[Taint]) -> NodePatch:
    """The patch that makes `node` carry `labels` and `taints` as gpukit's own."""
    meta = node.get("metadata") or {}
    current_labels: dict[str, str] = dict(meta.get("labels") or {})
    annotations: dict[str, str] = dict(meta.get("annotations") or {})
    current_taints: list[dict[str, Any]] = list((node.get("spec") or {}).get("taints") or [])
    previous_labels = set(_split(annotations.get(MANAGED_LABELS)))
    previous_taints = set(_split(annotations.get(MANAGED_TAINTS)))
    changes: list[str] = []
    label_patch: dict[str, str | None] = {}
    for k, v in sorted(labels.items()):
        if current_labels.get(k) != v:
            label_patch[k] = v
            changes.append(f"label {k}: {current_labels.get(k)!r} -> {v!r}")
    for k in sorted(previous_labels - set(labels)):
        if k in current_labels:
            label_patch[k] = None
            changes.append(f"label {k}: removed (no longer declared)")
    wanted = {t.ident: t for t in taints}
    kept = [
        t for t in current_taints
        if f"{t.get('key')}:{t.get('effect')}" not in wanted
        and f"{t.get('key')}:{t.get('effect')}" not in previous_taints
    ]  # fmt: skip
    new_taints = kept + [t.as_dict() for t in taints]

    def norm(ts: Sequence[Mapping[str, Any]]) -> list[tuple[str, str, str]]:
        return sorted((str(t.get("key")), str(t.get("effect")), str(t.get("value") or ""))
                      for t in ts)  # fmt: skip

    patch: dict[str, Any] = {"metadata": {}}
    if norm(new_taints) != norm(current_taints):
        before = {f"{t.get('key')}:{t.get('effect')}" for t in current_taints}
        after = {f"{t.get('key')}:{t.get('effect')}" for t in new_taints}
        for ident in sorted(after - before):
            changes.append(f"taint {ident}: added")
        for ident in sorted(before - after):
            changes.append(f"taint {ident}: removed (no longer declared)")
        for ident in sorted(after & before):
            changes.append(f"taint {ident}: value changed")
        # Node taints have no merge key: the patch carries the whole list.
        patch["spec"] = {"taints": new_taints}
    managed_labels = ",".join(sorted(labels))
    managed_taints = ",".join(sorted(wanted))
    ann_patch: dict[str, str | None] = {}
    for key, value in ((MANAGED_LABELS, managed_labels), (MANAGED_TAINTS, managed_taints)):
        if (annotations.get(key) or "") != value:
            ann_patch[key] = value or None
    if ann_patch and not changes:
        changes.append("bookkeeping annotations updated")
    if label_patch:
        patch["metadata"]["labels"] = label_patch
    if ann_patch:
        patch["metadata"]["annotations"] = ann_patch
    return NodePatch(patch=patch, changes=tuple(changes))
