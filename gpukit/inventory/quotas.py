"""GPU tenancy declared for the whole cluster: per-namespace GPU quotas, LimitRanges for GPU
containers and PriorityClasses for GPU workloads (inventories/README.md, "Quotas and
priorities").

The variables are cluster-wide (group `all` or `gpu_nodes`): every GPU host must see the same
values. `from_hosts` reads them from the hosts' variables and validates them once; `served_problems`
then holds every quota and limit to a resource some node of the fleet serves (the oracle's
expected resources, computed by inventory.check). Problems name the variable, the namespace or
class and the key, and the value.

Quota keys are written as in a ResourceQuota: Kubernetes quotas extended resources by their
requests only, so `requests.nvidia.com/gpu` is the one spelling accepted; a bare resource name
or a `limits.` key is refused with what to write instead. LimitRanges name the resource itself
(`nvidia.com/gpu`), as a LimitRange does.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpukit.contracts import label_names as ln

from .problems import MISSING, Problem

QUOTAS = "gpukit_gpu_quotas"
LIMIT_RANGES = "gpukit_gpu_limit_ranges"
PRIORITY_CLASSES = "gpukit_gpu_priority_classes"
CREATE_NAMESPACES = "gpukit_gpu_quota_create_namespaces"
VARIABLES = (QUOTAS, LIMIT_RANGES, PRIORITY_CLASSES, CREATE_NAMESPACES)

REQUESTS_PREFIX = "requests."
LIMIT_FIELDS = ("default", "max")
PREEMPTION_POLICIES = ("PreemptLowerPriority", "Never")
PRIORITY_CLASS_FIELDS = ("name", "value", "preemption_policy", "description", "global_default")
# User-defined PriorityClasses: the apiserver refuses values above one billion (higher ones
# are reserved for system-node-critical and system-cluster-critical) and names "system-*".
PRIORITY_MIN = -2147483648
PRIORITY_MAX = 1000000000

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
# The GPU resources a quota can name: whole GPUs, MIG devices, renamed shared resources.
_GPU_RESOURCE = re.compile(r"^nvidia\.com/(gpu|mig-[0-9a-z.+]+|[a-z0-9][-a-z0-9.]*\.shared)$")


@dataclass(frozen=True)
class NamespaceQuota:
    """One namespace's GPU quota: resource name (nvidia.com/gpu) -> hard count."""

    namespace: str
    hard: Mapping[str, int]

    def quota_hard(self) -> dict[str, str]:
        """`spec.hard` of the ResourceQuota: requests.<resource> -> count, as Kubernetes
        writes quantities."""
        return {REQUESTS_PREFIX + r: str(n) for r, n in sorted(self.hard.items())}


@dataclass(frozen=True)
class LimitRangeDecl:
    """One namespace's limits per GPU container: resource -> {default, max}."""

    namespace: str
    limits: Mapping[str, Mapping[str, int]]


@dataclass(frozen=True)
class PriorityClassDecl:
    name: str
    value: int
    preemption_policy: str = "PreemptLowerPriority"
    description: str = ""


@dataclass(frozen=True)
class Tenancy:
    """What the inventory declares for GPU tenancy (empty: nothing)."""

    quotas: tuple[NamespaceQuota, ...] = ()
    limit_ranges: tuple[LimitRangeDecl, ...] = ()
    priority_classes: tuple[PriorityClassDecl, ...] = ()
    create_namespaces: bool = False
    declared: Mapping[str, Any] = field(default_factory=dict)  # the variables as validated

    @property
    def namespaces(self) -> tuple[str, ...]:
        """Every namespace the declaration names, sorted."""
        return tuple(sorted({q.namespace for q in self.quotas}
                            | {lr.namespace for lr in self.limit_ranges}))

    def quota(self, namespace: str) -> NamespaceQuota | None:
        return next((q for q in self.quotas if q.namespace == namespace), None)

    def limit_range(self, namespace: str) -> LimitRangeDecl | None:
        return next((lr for lr in self.limit_ranges if lr.namespace == namespace), None)


def from_hosts(per_host: Mapping[str, Mapping[str, Any]]) -> tuple[Tenancy, list[Problem]]:
    """The tenancy variables of every GPU host (host -> {variable: value}, absent ones left
    out): they must agree (cluster-wide variables), then `parse`."""
    problems: list[Problem] = []
    first: tuple[str, Mapping[str, Any]] | None = None
    for host, values in per_host.items():
        mine = {k: values[k] for k in VARIABLES if k in values}
        if first is None:
            first = (host, mine)
            continue
        for name in VARIABLES:
            if mine.get(name, MISSING) != first[1].get(name, MISSING):
                problems.append(Problem(host, name, mine.get(name, MISSING), "differs from host "
                                        f"{first[0]}'s: it is cluster-wide, declare it once "
                                        "in group_vars/all or gpu_nodes"))
    if problems or first is None:
        return Tenancy(), problems
    return parse(first[1])


def parse(raw: Mapping[str, Any]) -> tuple[Tenancy, list[Problem]]:
    """The tenancy variables (plain values; absent or null: none declared) validated."""
    sink = _Sink()
    fail = sink.fail
    quotas = _quotas(raw.get(QUOTAS), fail)
    limits = _limit_ranges(raw.get(LIMIT_RANGES), fail)
    classes = _priority_classes(raw.get(PRIORITY_CLASSES), sink)
    create = raw.get(CREATE_NAMESPACES)
    if create is None:
        create = False
    if not isinstance(create, bool):
        fail(CREATE_NAMESPACES, create, "is not true or false")
        create = False
    declared = {k: raw[k] for k in VARIABLES if raw.get(k) is not None}
    return Tenancy(quotas, limits, classes, create, declared), sink.problems


def served_problems(tenancy: Tenancy, served: Iterable[str]) -> list[Problem]:
    """Quota and LimitRange resources no GPU node of the fleet serves (`served`: the resource
    names of every node's expected resources)."""
    known = set(served)
    shown = ", ".join(sorted(known)) or "none"
    out: list[Problem] = []
    for q in tenancy.quotas:
        for resource in q.hard:
            if resource not in known:
                out.append(Problem(None, f"{QUOTAS}.{q.namespace}.{REQUESTS_PREFIX}{resource}",
                                   q.hard[resource], "names a resource no GPU node of the "
                                   f"inventory serves (served: {shown})"))
    for lr in tenancy.limit_ranges:
        for resource in lr.limits:
            if resource not in known:
                out.append(Problem(None, f"{LIMIT_RANGES}.{lr.namespace}.{resource}", MISSING,
                                   "names a resource no GPU node of the inventory serves "
                                   f"(served: {shown})"))
    return out


class _Sink:
    """Collects problems (the variable's path, the value, the message)."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def fail(self, variable: str, value: object, message: str) -> None:
        self.problems.append(Problem(None, variable, value, message))


Fail = Callable[[str, object, str], None]


def _namespaces(variable: str, raw: Any, fail: Fail) -> list[tuple[str, Mapping[str, Any]]]:
    """A mapping namespace -> mapping, its names checked (DNS labels)."""
    if raw is None:
        return []
    if not isinstance(raw, Mapping):
        fail(variable, raw, "is not a mapping of namespace -> resources")
        return []
    out = []
    for ns, body in raw.items():
        if not isinstance(ns, str) or not _DNS_LABEL.match(ns):
            fail(f"{variable}.{ns}", MISSING, "is not a namespace name (a DNS label: lower-case "
                 "alphanumerics and '-', at most 63)")
            continue
        if not isinstance(body, Mapping) or not body:
            fail(f"{variable}.{ns}", body, "is not a non-empty mapping of GPU resources")
            continue
        out.append((ns, body))
    return out


def _count(variable: str, value: Any, fail: Fail) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        fail(variable, value, "is not an integer >= 0")
        return None
    return value


def _resource(variable: str, name: str, fail: Fail) -> bool:
    if _GPU_RESOURCE.match(name):
        return True
    fail(variable, MISSING, f"is not a GPU resource ({ln.GPU_RESOURCE}, nvidia.com/mig-<profile> "
         "or a renamed shared resource nvidia.com/<name>.shared)")
    return False


def _quotas(raw: Any, fail: Fail) -> tuple[NamespaceQuota, ...]:
    out: list[NamespaceQuota] = []
    for ns, body in _namespaces(QUOTAS, raw, fail):
        hard: dict[str, int] = {}
        for key, value in body.items():
            var = f"{QUOTAS}.{ns}.{key}"
            key = str(key)
            if key.startswith("limits."):
                fail(var, value, "is a limits quota: Kubernetes quotas extended resources by "
                     f"requests only; write {REQUESTS_PREFIX}{key.removeprefix('limits.')}")
                continue
            if not key.startswith(REQUESTS_PREFIX):
                fail(var, value, "is a resource name, not a quota key: write "
                     f"{REQUESTS_PREFIX}{key} (as in a ResourceQuota's spec.hard)")
                continue
            resource = key.removeprefix(REQUESTS_PREFIX)
            count = _count(var, value, fail)
            if _resource(var, resource, fail) and count is not None:
                hard[resource] = count
        if hard:
            out.append(NamespaceQuota(ns, hard))
    return tuple(out)


def _limit_ranges(raw: Any, fail: Fail) -> tuple[LimitRangeDecl, ...]:
    out: list[LimitRangeDecl] = []
    for ns, body in _namespaces(LIMIT_RANGES, raw, fail):
        limits: dict[str, dict[str, int]] = {}
        for resource, fields in body.items():
            var = f"{LIMIT_RANGES}.{ns}.{resource}"
            resource = str(resource)
            if resource.startswith(REQUESTS_PREFIX):
                fail(var, MISSING, "is a quota key: a LimitRange names the resource, write "
                     f"{resource.removeprefix(REQUESTS_PREFIX)}")
                continue
            if not _resource(var, resource, fail):
                continue
            if not isinstance(fields, Mapping) or not fields:
                fail(var, fields, f"is not a mapping with {' and/or '.join(LIMIT_FIELDS)}")
                continue
            got: dict[str, int] = {}
            for f, value in fields.items():
                if f not in LIMIT_FIELDS:
                    fail(f"{var}.{f}", value, f"is not a known field ({', '.join(LIMIT_FIELDS)})")
                elif (n := _count(f"{var}.{f}", value, fail)) is not None:
                    got[str(f)] = n
            if "default" in got and "max" in got and got["default"] > got["max"]:
                fail(f"{var}.default", got["default"], f"is above max {got['max']} (the "
                     "apiserver refuses such a LimitRange)")
                continue
            if got:
                limits[resource] = got
        if limits:
            out.append(LimitRangeDecl(ns, limits))
    return tuple(out)


def _priority_classes(raw: Any, sink: _Sink) -> tuple[PriorityClassDecl, ...]:
    fail = sink.fail
    if raw is None:
        return ()
    if not isinstance(raw, list):
        fail(PRIORITY_CLASSES, raw, "is not a list of {name, value, preemption_policy, "
             "description}")
        return ()
    out: list[PriorityClassDecl] = []
    for i, item in enumerate(raw):
        where = f"{PRIORITY_CLASSES}[{i}]"
        if not isinstance(item, Mapping):
            fail(where, item, "is not a mapping {name, value, preemption_policy, description}")
            continue
        before = len(sink.problems)
        for k in item:
            if k not in PRIORITY_CLASS_FIELDS:
                fail(f"{where}.{k}", item[k], "is not a known field "
                     f"({', '.join(PRIORITY_CLASS_FIELDS)})")
        name = item.get("name", MISSING)
        if not isinstance(name, str) or not _DNS_SUBDOMAIN.match(name):
            fail(f"{where}.name", name, "is not a PriorityClass name (a DNS subdomain)")
        elif name.startswith("system-"):
            fail(f"{where}.name", name, "starts with 'system-', which Kubernetes reserves")
        elif any(c.name == name for c in out):
            fail(f"{where}.name", name, "is declared twice")
        value = item.get("value", MISSING)
        if isinstance(value, bool) or not isinstance(value, int) or not (
                PRIORITY_MIN <= value <= PRIORITY_MAX):
            fail(f"{where}.value", value, f"is not an integer from {PRIORITY_MIN} to "
                 f"{PRIORITY_MAX} (higher values are reserved for system classes)")
        policy = item.get("preemption_policy", "PreemptLowerPriority")
        if policy not in PREEMPTION_POLICIES:
            fail(f"{where}.preemption_policy", policy,
                 f"is not one of {', '.join(PREEMPTION_POLICIES)}")
        description = item.get("description", "")
        if not isinstance(description, str):
            fail(f"{where}.description", description, "is not a string")
        if item.get("global_default", False) is not False:
            fail(f"{where}.global_default", item.get("global_default"), "must be false: a "
                 "GPU class as the cluster's default would give every pod its priority")
        if len(sink.problems) == before:
            out.append(PriorityClassDecl(str(name), int(value), str(policy), str(description)))
    return tuple(out)

