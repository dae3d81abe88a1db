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

from gpukit.contracts import label_syntax

DEVICE_PLUGIN_CONFIG = "nvidia.com/device-plugin.config"
MIG_CONFIG = "nvidia.com/mig.config"
# The device plugin DaemonSet's default node selector (GPU Operator's name for it).
DEPLOY_DEVICE_PLUGIN = "nvidia.com/gpu.deploy.device-plugin"
MANAGED_LABELS = "gpukit/managed-labels"
MANAGED_TAINTS = "gpukit/managed-taints"
EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")



class NodeSpecError(ValueError):
    """A declared label or taint is invalid; the message names the variable and the entry."""


def check_key(key: str, where: str) -> None:
    problem = label_syntax.key_problem(key)
    if problem:
        raise NodeSpecError(f"{where}: {key!r}: {problem}")


def check_value(value: str, where: str) -> None:
    if not label_syntax.value_ok(value):
        raise NodeSpecError(
            f"{where}: {value!r} is not a label value (at most 63 characters of"
            " [A-Za-z0-9-_.], alphanumeric at both ends)"
        )


@dataclass(frozen=True)
class Taint:
    key: str
    effect: str
    value: str = ""

    @property
    def ident(self) -> str:
        return f"{self.key}:{self.effect}"

    def as_dict(self) -> dict[str, str]:
        d = {"key": self.key, "effect": self.effect}
        if self.value:
            d["value"] = self.value
        return d


def parse_taints(raw: Sequence[Mapping[str, Any]] | None, where: str) -> list[Taint]:
    out: list[Taint] = []
    for i, t in enumerate(raw or []):
        here = f"{where}[{i}]"
        if not isinstance(t, Mapping) or "key" not in t or "effect" not in t:
            raise NodeSpecError(f"{here}: a taint needs `key` and `effect` (and may have `value`)")
        extra = set(t) - {"key", "value", "effect"}
        if extra:
            raise NodeSpecError(f"{here}: unknown field(s) {', '.join(sorted(extra))}")
        key, effect, value = str(t["key"]), str(t["effect"]), str(t.get("value") or "")
        check_key(key, f"{here}.key")
        if effect not in EFFECTS:
            raise NodeSpecError(f"{here}.effect: {effect!r} is not one of {', '.join(EFFECTS)}")
        if value:
            check_value(value, f"{here}.value")
        taint = Taint(key, effect, value)
        if any(o.ident == taint.ident for o in out):
            raise NodeSpecError(f"{here}: {taint.ident} is declared twice")
        out.append(taint)
    return out


def declared_labels(
    extra: Mapping[str, Any] | None,
    device_plugin_config: str | None = None,
    mig_config: str | None = None,
    deploy_device_plugin: bool = True,
) -> dict[str, str]:
    """Every label the inventory declares for a node."""
    labels: dict[str, str] = {}
    for k, v in (extra or {}).items():
        check_key(str(k), "gpukit_node_labels")
        value = str(v).lower() if isinstance(v, bool) else str(v)
        check_value(value, f"gpukit_node_labels[{k!r}]")
        labels[str(k)] = value
    if device_plugin_config:
        check_value(device_plugin_config, "gpukit_device_plugin_config")
        labels[DEVICE_PLUGIN_CONFIG] = device_plugin_config
    if mig_config:
        check_value(mig_config, "gpukit_mig_config")
        labels[MIG_CONFIG] = mig_config
    if deploy_device_plugin:
        labels[DEPLOY_DEVICE_PLUGIN] = "true"
    return labels


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
