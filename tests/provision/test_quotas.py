"""The GPU tenancy's Kubernetes objects (gpukit.provision.quotas) and which of gpukit's old
objects the role deletes."""

from __future__ import annotations

import re
from typing import Any

import pytest

from gpukit.inventory import InventoryError
from gpukit.inventory import quotas as decl
from gpukit.provision import quotas

DECLARED = {
    decl.QUOTAS: {"team-a": {"requests.nvidia.com/gpu": 2, "requests.nvidia.com/mig-1g.5gb": 1}},
    decl.LIMIT_RANGES: {"team-b": {"nvidia.com/gpu": {"default": 1, "max": 1}}},
    decl.PRIORITY_CLASSES: [{"name": "gpu-high", "value": 1000, "description": "training"}],
}


def test_objects_of_a_declaration() -> None:
    objs = quotas.objects(quotas.tenancy({**DECLARED, decl.CREATE_NAMESPACES: True}))
    kinds = [(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objs]
    assert kinds == [
        ("Namespace", None, "team-a"), ("Namespace", None, "team-b"),
        ("ResourceQuota", "team-a", quotas.QUOTA_NAME),
        ("LimitRange", "team-b", quotas.LIMIT_RANGE_NAME),
        ("PriorityClass", None, "gpu-high"),
    ]
    assert all(o["metadata"]["labels"] == quotas.LABELS for o in objs)
    assert objs[2]["spec"] == {"hard": {"requests.nvidia.com/gpu": "2",
                                        "requests.nvidia.com/mig-1g.5gb": "1"}}
    assert objs[3]["spec"] == {"limits": [{"type": "Container", "default": {"nvidia.com/gpu": "1"},
                                           "max": {"nvidia.com/gpu": "1"}}]}
    assert objs[4] | {"metadata": None} == {
        "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": None,
        "value": 1000, "globalDefault": False, "preemptionPolicy": "PreemptLowerPriority",
        "description": "training"}


def test_a_max_alone_gets_default_zero_not_the_apiservers_max() -> None:
    t = quotas.tenancy({decl.LIMIT_RANGES: {"team-a": {"nvidia.com/gpu": {"max": 2}}}})
    assert quotas.objects(t)[0]["spec"]["limits"] == [
        {"type": "Container", "default": {"nvidia.com/gpu": "0"}, "max": {"nvidia.com/gpu": "2"}}]


def test_namespaces_only_when_asked() -> None:
    assert all(o["kind"] != "Namespace" for o in quotas.objects(quotas.tenancy(DECLARED)))


def test_bad_input_is_refused_by_name_before_any_object() -> None:
    with pytest.raises(InventoryError, match=re.escape(
            "gpukit_gpu_quotas.team-a.nvidia.com/gpu: 2 is a resource name, not a quota key: "
            "write requests.nvidia.com/gpu")):
        quotas.tenancy({decl.QUOTAS: {"team-a": {"nvidia.com/gpu": 2}}})


def _listed(name: str, namespace: str | None = None, mine: bool = True) -> dict[str, Any]:
    meta = {"name": name, "labels": dict(quotas.LABELS) if mine else {"x": "y"}}
    if namespace:
        meta["namespace"] = namespace
    return {"metadata": meta}


def test_stale_objects_are_gpukits_that_are_no_longer_declared() -> None:
    wanted = quotas.objects(quotas.tenancy(DECLARED))
    listed = [
        ("v1", "ResourceQuota", [_listed(quotas.QUOTA_NAME, "team-a"),
                                 _listed(quotas.QUOTA_NAME, "team-old"),
                                 _listed("theirs", "team-a", mine=False)]),
        ("v1", "LimitRange", [_listed(quotas.LIMIT_RANGE_NAME, "team-b")]),
        ("scheduling.k8s.io/v1", "PriorityClass", [_listed("gpu-high"),
                                                   _listed("gpu-old")]),
    ]
    assert quotas.stale(listed, wanted) == [
        {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "name": "gpu-old"},
        {"apiVersion": "v1", "kind": "ResourceQuota", "name": quotas.QUOTA_NAME,
         "namespace": "team-old"},
    ]


def test_nothing_declared_deletes_every_gpukit_object() -> None:
    listed = [("v1", "LimitRange", [_listed(quotas.LIMIT_RANGE_NAME, "team-b")])]
    assert quotas.stale(listed, quotas.objects(quotas.tenancy({}))) == [
        {"apiVersion": "v1", "kind": "LimitRange", "name": quotas.LIMIT_RANGE_NAME,
         "namespace": "team-b"}]
