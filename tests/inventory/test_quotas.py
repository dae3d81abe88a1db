"""GPU tenancy declarations (gpukit.inventory.quotas): quotas, LimitRanges and PriorityClasses,
validated once by the inventory model; problems name the variable, namespace/key and value."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpukit import inventory as inv
from gpukit.inventory import quotas

T4 = {"product": "Tesla T4", "count": 2}
A100 = {"product": "NVIDIA A100-SXM4-40GB", "count": 8}
A100_MIG = {"l": [{"devices": [0], "mig-enabled": True, "mig-devices": {"1g.5gb": 7}},
                  {"devices": [1, 2, 3, 4, 5, 6, 7], "mig-enabled": False}]}
MIXED = {"mixed": {"version": "v1", "flags": {"migStrategy": "mixed"}}}


def _problems(**raw: Any) -> list[str]:
    _, problems = quotas.parse(raw)
    return [str(p) for p in problems]


def _inventory(root: Path, all_vars: dict[str, Any], hosts: dict[str, Any] | None = None) -> Path:
    hosts = hosts or {
        "gpu-t4": {"gpukit_gpu": T4},
        "gpu-a100": {"gpukit_gpu": A100, "gpukit_mig_configs": A100_MIG,
                     "gpukit_mig_config": "l", "gpukit_device_plugin_configs": MIXED},
    }
    root.mkdir(parents=True, exist_ok=True)
    (root / "hosts.yml").write_text(yaml.safe_dump(
        {"all": {"vars": {"gpukit_runtime_accept_envvar_unprivileged": True, **all_vars},
                 "children": {"gpu_nodes": {"hosts": hosts}}}}))
    return root


def test_a_full_declaration() -> None:
    t, problems = quotas.parse({
        quotas.QUOTAS: {"team-a": {"requests.nvidia.com/gpu": 2,
                                   "requests.nvidia.com/mig-1g.5gb": 3}},
        quotas.LIMIT_RANGES: {"team-a": {"nvidia.com/gpu": {"default": 1, "max": 2}}},
        quotas.PRIORITY_CLASSES: [{"name": "gpu-high", "value": 1000,
                                   "preemption_policy": "Never", "description": "training"}],
        quotas.CREATE_NAMESPACES: True,
    })
    assert problems == []
    assert t.quota("team-a") == quotas.NamespaceQuota(
        "team-a", {"nvidia.com/gpu": 2, "nvidia.com/mig-1g.5gb": 3})
    assert t.quota("team-a").quota_hard() == {  # type: ignore[union-attr]
        "requests.nvidia.com/gpu": "2", "requests.nvidia.com/mig-1g.5gb": "3"}
    assert t.limit_range("team-a") == quotas.LimitRangeDecl(
        "team-a", {"nvidia.com/gpu": {"default": 1, "max": 2}})
    assert t.priority_classes == (quotas.PriorityClassDecl("gpu-high", 1000, "Never", "training"),)
    assert t.create_namespaces and t.namespaces == ("team-a",)


def test_nothing_declared_is_no_tenancy() -> None:
    t, problems = quotas.parse({})
    assert problems == [] and t == quotas.Tenancy()


@pytest.mark.parametrize(("raw", "needle"), [
    ({quotas.QUOTAS: {"team-a": {"nvidia.com/gpu": 2}}},
     "gpukit_gpu_quotas.team-a.nvidia.com/gpu: 2 is a resource name, not a quota key: write "
     "requests.nvidia.com/gpu"),
    ({quotas.QUOTAS: {"team-a": {"limits.nvidia.com/gpu": 2}}},
     "requests only; write requests.nvidia.com/gpu"),
    ({quotas.QUOTAS: {"Team_A": {"requests.nvidia.com/gpu": 2}}},
     "gpukit_gpu_quotas.Team_A: is not a namespace name"),
    ({quotas.QUOTAS: {"team-a": {"requests.nvidia.com/gpu": -1}}},
     "gpukit_gpu_quotas.team-a.requests.nvidia.com/gpu: -1 is not an integer >= 0"),
    ({quotas.QUOTAS: {"team-a": {"requests.nvidia.com/gpu": "two"}}}, "'two' is not an integer"),
    ({quotas.QUOTAS: {"team-a": {"requests.cpu": 2}}},
     "gpukit_gpu_quotas.team-a.requests.cpu: is not a GPU resource"),
    ({quotas.QUOTAS: {"team-a": {}}}, "gpukit_gpu_quotas.team-a: {} is not a non-empty mapping"),
    ({quotas.QUOTAS: ["team-a"]}, "gpukit_gpu_quotas: ['team-a'] is not a mapping"),
    ({quotas.LIMIT_RANGES: {"team-a": {"requests.nvidia.com/gpu": {"max": 1}}}},
     "a LimitRange names the resource, write nvidia.com/gpu"),
    ({quotas.LIMIT_RANGES: {"team-a": {"nvidia.com/gpu": {"min": 1}}}},
     "gpukit_gpu_limit_ranges.team-a.nvidia.com/gpu.min: 1 is not a known field"),
    ({quotas.LIMIT_RANGES: {"team-a": {"nvidia.com/gpu": {"default": 3, "max": 2}}}},
     "gpukit_gpu_limit_ranges.team-a.nvidia.com/gpu.default: 3 is above max 2"),
    ({quotas.PRIORITY_CLASSES: [{"name": "gpu", "value": 2000000000}]},
     "gpukit_gpu_priority_classes[0].value: 2000000000 is not an integer from"),
    ({quotas.PRIORITY_CLASSES: [{"name": "system-gpu", "value": 1}]}, "reserves"),
    ({quotas.PRIORITY_CLASSES: [{"name": "a", "value": 1}, {"name": "a", "value": 2}]},
     "gpukit_gpu_priority_classes[1].name: 'a' is declared twice"),
    ({quotas.PRIORITY_CLASSES: [{"name": "a", "value": 1, "preemption_policy": "Sometimes"}]},
     "preemption_policy: 'Sometimes' is not one of PreemptLowerPriority, Never"),
    ({quotas.PRIORITY_CLASSES: [{"name": "a", "value": 1, "global_default": True}]},
     "global_default: True must be false"),
    ({quotas.PRIORITY_CLASSES: [{"name": "a", "value": 1, "colour": "red"}]},
     "colour: 'red' is not a known field"),
    ({quotas.CREATE_NAMESPACES: "yes"}, "gpukit_gpu_quota_create_namespaces: 'yes' is not true"),
])
def test_bad_declarations_name_variable_key_and_value(raw: dict[str, Any], needle: str) -> None:
    problems = _problems(**raw)
    assert any(needle in p for p in problems), problems


def test_every_problem_at_once() -> None:
    problems = _problems(**{
        quotas.QUOTAS: {"team-a": {"nvidia.com/gpu": 1, "requests.nvidia.com/gpu": -2}},
        quotas.PRIORITY_CLASSES: [{"name": "x", "value": "high"}],
    })
    assert len(problems) == 3, problems


def test_the_inventory_check_holds_quotas_to_served_resources(tmp_path: Path) -> None:
    root = _inventory(tmp_path / "inv", {
        quotas.QUOTAS: {"team-a": {"requests.nvidia.com/gpu": 2,
                                   "requests.nvidia.com/mig-1g.5gb": 7,
                                   "requests.nvidia.com/mig-3g.20gb": 1}},
        quotas.LIMIT_RANGES: {"team-b": {"nvidia.com/gpu.shared": {"max": 1}}},
    })
    result = inv.check(root)
    text = [str(p) for p in result.problems]
    assert len(text) == 2, text
    assert "gpukit_gpu_quotas.team-a.requests.nvidia.com/mig-3g.20gb: 1 names a resource no GPU " \
        "node of the inventory serves (served: nvidia.com/gpu, nvidia.com/mig-1g.5gb)" in text[0]
    assert "gpukit_gpu_limit_ranges.team-b.nvidia.com/gpu.shared: names a resource" in text[1]


def test_the_loaded_inventory_carries_its_tenancy(tmp_path: Path) -> None:
    root = _inventory(tmp_path / "inv", {
        quotas.QUOTAS: {"team-a": {"requests.nvidia.com/mig-1g.5gb": 7}}})
    result = inv.check(root)
    assert result.problems == ()
    assert result.inventory is not None
    assert result.inventory.tenancy.quotas == (
        quotas.NamespaceQuota("team-a", {"nvidia.com/mig-1g.5gb": 7}),)


def test_bad_quotas_are_listed_by_the_inventory_load(tmp_path: Path) -> None:
    root = _inventory(tmp_path / "inv", {quotas.QUOTAS: {"team-a": {"nvidia.com/gpu": 1}}})
    with pytest.raises(inv.InventoryError, match=re.escape("write requests.nvidia.com/gpu")):
        inv.load(root)


def test_hosts_disagreeing_on_a_cluster_wide_variable(tmp_path: Path) -> None:
    root = _inventory(tmp_path / "inv", {}, hosts={
        "a": {"gpukit_gpu": T4, quotas.QUOTAS: {"team-a": {"requests.nvidia.com/gpu": 1}}},
        "b": {"gpukit_gpu": T4, quotas.QUOTAS: {"team-a": {"requests.nvidia.com/gpu": 2}}},
    })
    with pytest.raises(inv.InventoryError) as exc:
        inv.load(root)
    assert "host b: gpukit_gpu_quotas: {'team-a': {'requests.nvidia.com/gpu': 2}} differs from " \
        "host a's: it is cluster-wide" in str(exc.value)
