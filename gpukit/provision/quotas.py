"""The Kubernetes objects of the declared GPU tenancy (gpukit.inventory.quotas): one
ResourceQuota and one LimitRange per declared namespace, one PriorityClass per declared class,
and the namespaces themselves when the inventory asks for them. The gpu_quotas role applies
them (server-side apply) and deletes the ones it made before that are no longer declared:
every object carries MANAGED_BY, and `stale` picks them out of what the API lists.

Namespaces are created, never deleted: a namespace holds a team's workloads.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpukit.inventory import InventoryError
from gpukit.inventory import quotas as decl
from gpukit.inventory.quotas import LimitRangeDecl, NamespaceQuota, PriorityClassDecl, Tenancy

QUOTA_NAME = "gpukit-gpu-quota"
LIMIT_RANGE_NAME = "gpukit-gpu-limits"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "gpukit"
COMPONENT_LABEL = "app.kubernetes.io/component"
COMPONENT = "gpu-quotas"
LABELS = {MANAGED_BY_LABEL: MANAGED_BY, COMPONENT_LABEL: COMPONENT}
# What the role lists to find the objects gpukit applied before.
SELECTOR = f"{MANAGED_BY_LABEL}={MANAGED_BY},{COMPONENT_LABEL}={COMPONENT}"
# The kinds the role owns, with their API versions (the role lists these).
KINDS = (("v1", "ResourceQuota"), ("v1", "LimitRange"),
         ("scheduling.k8s.io/v1", "PriorityClass"))


def tenancy(raw: Mapping[str, Any]) -> Tenancy:
    """The tenancy variables validated as the inventory model does (InventoryError naming the
    variable and value), for a role handed them without the preflight."""
    found, problems = decl.parse(raw)
    if problems:
        raise InventoryError(problems)
    return found


def _meta(name: str, namespace: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": dict(LABELS)}
    if namespace is not None:
        meta["namespace"] = namespace
    return meta


def resource_quota(q: NamespaceQuota) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ResourceQuota",
            "metadata": _meta(QUOTA_NAME, q.namespace), "spec": {"hard": q.quota_hard()}}


def limit_range(lr: LimitRangeDecl) -> dict[str, Any]:
    """One Container item: `default` is the limit a container gets when it names none (for an
    extended resource the request follows the limit), `max` caps what it may ask. A `max`
    alone gets `default` 0: the apiserver would default it to `max`, handing every container
    of the namespace that names no GPU (a sidecar, a CPU job) `max` GPUs."""
    item: dict[str, Any] = {"type": "Container"}
    limits = {r: {"default": 0, **v} if "max" in v else dict(v) for r, v in lr.limits.items()}
    for field in decl.LIMIT_FIELDS:
        values = {r: str(v[field]) for r, v in sorted(limits.items()) if field in v}
        if values:
            item[field] = values
    return {"apiVersion": "v1", "kind": "LimitRange",
            "metadata": _meta(LIMIT_RANGE_NAME, lr.namespace), "spec": {"limits": [item]}}


def priority_class(pc: PriorityClassDecl) -> dict[str, Any]:
    return {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": _meta(pc.name), "value": pc.value, "globalDefault": False,
            "preemptionPolicy": pc.preemption_policy, "description": pc.description}


def namespace(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": _meta(name)}


def objects(t: Tenancy) -> list[dict[str, Any]]:
    """Every object of the declaration, namespaces first (the rest lives in them)."""
    out = [namespace(ns) for ns in t.namespaces] if t.create_namespaces else []
    out += [resource_quota(q) for q in t.quotas]
    out += [limit_range(lr) for lr in t.limit_ranges]
    out += [priority_class(pc) for pc in t.priority_classes]
    return out


def _key(obj: Mapping[str, Any]) -> tuple[str, str, str]:
    meta = obj.get("metadata") or {}
    return (str(obj.get("kind")), str(meta.get("namespace") or ""), str(meta.get("name")))


def stale(listed: Iterable[tuple[str, str, Iterable[Mapping[str, Any]]]],
          wanted: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Of the objects the API lists, (apiVersion, kind, objects) per kind of KINDS (list items
    need not carry their kind), the ones gpukit applied (its labels) that `wanted` no longer
    holds, as {apiVersion, kind, name[, namespace]} for deletion. Namespaces are never in it."""
    keep = {_key(o) for o in wanted}
    out: list[dict[str, Any]] = []
    for api_version, kind, objs in listed:
        if kind == "Namespace":
            continue
        for obj in objs:
            meta = obj.get("metadata") or {}
            labels = meta.get("labels") or {}
            if any(labels.get(k) != v for k, v in LABELS.items()):
                continue  # not gpukit's: left alone
            if _key({"kind": kind, "metadata": meta}) in keep:
                continue
            gone: dict[str, Any] = {"apiVersion": api_version, "kind": kind,
                                    "name": meta.get("name")}
            if meta.get("namespace"):
                gone["namespace"] = meta["namespace"]
            out.append(gone)
    return sorted(out, key=lambda o: (o["kind"], o.get("namespace", ""), o["name"]))
