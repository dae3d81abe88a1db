"""Rolling upgrades: which nodes to touch, in which batches, and when to stop.

playbooks/upgrade.yml asks every node what differs from the inventory (driver packages or
the running driver, the MIG layout, the selection labels) and hands the answers here. The
plan is pure data: an ordered list of batches whose sizes become the rollout play's
`serial`, the failure budget, and one line per node saying why it is touched or not.

Batching: nodes belong to an upgrade group (inventory `gpukit_upgrade_group`, by default
the node's first inventory group other than `gpu_nodes`); groups roll one after another
(`gpukit_upgrade_order`, then the order of the inventory), and within a group at most
`gpukit_upgrade_serial` nodes (a count, or a percent of the group's nodes, as with
Kubernetes' maxUnavailable; never less than one) are out of service at once. The rollout
stops when more than `gpukit_upgrade_max_failed` nodes (a count or a percent of the
targets) have failed; nodes in later batches are then left untouched.

The budget bounds the damage, so no batch may take the rollout past it: the nodes of a batch
roll at once and may all fail together, so a batch starts only when all of its nodes failing
would leave at most budget + 1 failed nodes (the one failure that stops the rollout is
unavoidable). The plan caps every batch at budget + 1 nodes (said in its lines), so a rollout
without failures never stops for it; after failures, the rollout stops before a batch that
could take it past (`batch_may_start`, checked by upgrade.yml before each batch). Batches
are fixed when the rollout play starts (Ansible's `serial`), so they cannot shrink as
failures come: a budget that should keep a rollout going through failures wants batches
smaller than it.

A node whose upgrade-state label says a previous rollout did not finish on it (it failed,
or the run was interrupted) is a target even when nothing else differs: it is still
cordoned and must be validated before it serves again.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from gpukit.contracts import label_names

# Written by the node agent from NVML: the driver the node runs.
DRIVER_LABEL = label_names.CUDA_DRIVER_FULL
STATE_LABEL = label_names.UPGRADE_STATE
MESSAGE_ANNOTATION = label_names.UPGRADE_MESSAGE
SKIP_LABEL = label_names.UPGRADE
SKIP_VALUE = "skip"
# Per node, in this order; a rollout that stops leaves the node at the state it reached.
STATES = ("cordoned", "draining", "upgrading", "validating", "done", "failed")
UNFINISHED = frozenset({"cordoned", "draining", "upgrading", "validating", "failed"})
_PERCENT = re.compile(r"^(\d{1,3})%$")


class UpgradeSpecError(ValueError):
    """An upgrade setting is wrong; the message names the variable and the value."""


def _amount(value: Any, where: str, *, minimum: int) -> tuple[int, bool]:
    """(number, is_percent) from `3` or `"25%"`."""
    if isinstance(value, bool):
        raise UpgradeSpecError(f"{where}: {value!r} is not a count or a percent like '25%'")
    if isinstance(value, int):
        n, percent = value, False
    else:
        text = str(value).strip()
        m = _PERCENT.match(text)
        if m:
            n, percent = int(m.group(1)), True
        elif text.isascii() and text.isdigit():
            n, percent = int(text), False
        else:
            raise UpgradeSpecError(f"{where}: {value!r} is not a count or a percent like '25%'")
    if n < minimum or (percent and n > 100):
        limit = f"{minimum}%..100%" if percent else f">= {minimum}"
        raise UpgradeSpecError(f"{where}: {value!r} is out of range ({limit})")
    return n, percent


def serial_size(value: Any, group_size: int, where: str = "gpukit_upgrade_serial") -> int:
    """Nodes of a group that may be out of service at once (at least one)."""
    n, percent = _amount(value, where, minimum=1)
    if percent:
        return max(1, math.floor(group_size * n / 100))
    return n


def failure_budget(value: Any, targets: int, where: str = "gpukit_upgrade_max_failed") -> int:
    """Failed nodes the rollout tolerates; one more stops it."""
    n, percent = _amount(value, where, minimum=0)
    if percent:
        return math.floor(targets * n / 100)
    return n


def batch_cap(budget: int) -> int:
    """The most nodes a batch may hold under a failure budget: all of them failing at once
    takes the rollout to its stop point (budget + 1 failed), not past it."""
    return budget + 1


def batch_may_start(failed: int, batch: int, budget: int) -> bool:
    """Whether a batch of `batch` nodes may start with `failed` nodes failed so far: only if
    all of them failing keeps the rollout at or below its stop point."""
    return failed + batch <= batch_cap(budget)


@dataclass(frozen=True)
class NodeState:
    """What the planning play found on one node."""

    host: str
    node: str
    group: str
    serial: Any
    order: int = 100
    max_failed: Any = 0
    changes: tuple[str, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    unschedulable: bool = False

    @property
    def state(self) -> str:
        return self.labels.get(STATE_LABEL, "")

    @property
    def skipped(self) -> bool:
        return self.labels.get(SKIP_LABEL) == SKIP_VALUE

    @property
    def cordoned_by_others(self) -> bool:
        """Cordoned, and not by an unfinished rollout: someone's maintenance, left alone
        (a rollout would uncordon it)."""
        return self.unschedulable and self.state not in UNFINISHED

    def reasons(self) -> list[str]:
        out = list(self.changes)
        if self.state in UNFINISHED:
            out.append(f"a previous rollout left it {self.state}")
        return out


@dataclass
class Plan:
    batches: list[list[str]]
    max_failed: int
    lines: list[str]
    touched: dict[str, list[str]]  # host -> reasons
    skipped: list[str]
    unchanged: list[str]

    @property
    def sizes(self) -> list[int]:
        return [len(b) for b in self.batches]

    @property
    def order(self) -> list[str]:
        return [h for b in self.batches for h in b]

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "sizes": self.sizes, "order": self.order}


def _one(nodes: Sequence[NodeState], attr: str, variable: str, scope: str) -> Any:
    values = {str(getattr(n, attr)) for n in nodes}
    if len(values) > 1:
        raise UpgradeSpecError(
            f"{variable}: the nodes of {scope} disagree ({', '.join(sorted(values))});"
            f" set it once for {scope}"
        )
    return getattr(nodes[0], attr)


def plan(nodes: Sequence[NodeState], max_failed: Any = None) -> Plan:
    """Batches of the nodes that differ from the inventory, groups in order.
    `max_failed` None: the nodes' own setting, which must agree."""
    groups: dict[str, list[NodeState]] = {}
    for n in nodes:
        groups.setdefault(n.group, []).append(n)
    first_seen = {g: i for i, g in enumerate(groups)}
    for g, members in groups.items():
        _one(members, "order", "gpukit_upgrade_order", f"upgrade group {g!r}")
    ordered = sorted(groups, key=lambda g: (groups[g][0].order, first_seen[g]))
    lines: list[str] = []
    touched: dict[str, list[str]] = {}
    skipped: list[str] = []
    unchanged: list[str] = []
    # First every group's targets (the budget is a share of all of them), then the batches.
    per_group: list[tuple[str, int, list[str], list[str]]] = []
    for g in ordered:
        members = groups[g]
        _one(members, "serial", "gpukit_upgrade_serial", f"upgrade group {g!r}")
        size = serial_size(members[0].serial, len(members), f"gpukit_upgrade_serial ({g})")
        targets: list[str] = []
        notes: list[str] = []
        for n in members:
            reasons = n.reasons()
            if n.skipped:
                skipped.append(n.host)
                why = "; would change: " + "; ".join(reasons) if reasons else ""
                notes.append(f"{n.host}: skipped ({SKIP_LABEL}={SKIP_VALUE}){why}")
            elif n.cordoned_by_others and reasons:
                skipped.append(n.host)
                notes.append(f"{n.host}: cordoned by someone else, left alone; would change: "
                             + "; ".join(reasons))
            elif reasons:
                targets.append(n.host)
                touched[n.host] = reasons
            else:
                unchanged.append(n.host)
                notes.append(f"{n.host}: matches the inventory, not touched")
        per_group.append((g, size, targets, notes))
    total = len(touched)
    if max_failed is None:
        max_failed = _one(nodes, "max_failed", "gpukit_upgrade_max_failed", "the fleet") if (
            nodes) else 0
    budget = failure_budget(max_failed, total)
    cap = batch_cap(budget)
    batches: list[list[str]] = []
    capped: list[str] = []
    for g, size, targets, notes in per_group:
        lines.extend(notes)
        step = min(size, cap)
        serial = f"serial {step}"
        if step < size and len(targets) > step:
            serial += f", {size} capped by the failure budget"
            capped.append(g)
        for i in range(0, len(targets), step):
            batch = targets[i : i + step]
            batches.append(batch)
            lines.append(f"batch {len(batches)} (group {g}, {serial}): {', '.join(batch)}")
            for h in batch:
                lines.extend(f"  {h}: {r}" for r in touched[h])
    if capped:
        lines.append(
            f"batches of {', '.join(capped)} hold at most {cap} node(s): a batch never holds"
            f" more nodes than may fail (gpukit_upgrade_max_failed {max_failed} -> {budget})"
        )
    lines.append(
        f"{total} node(s) in {len(batches)} batch(es); the rollout stops after"
        f" {budget + 1} failed node(s)"
        + ("" if budget == 0 or not batches else
           ", and before a batch that could take it past that")
    )
    return Plan(batches, budget, lines, touched, skipped, unchanged)


def node_state(raw: Mapping[str, Any]) -> NodeState:
    """NodeState from the planning play's per-host facts (a plain mapping)."""
    node = raw.get("node") or {}
    metadata = node.get("metadata") or {}
    spec = node.get("spec") or {}
    return NodeState(
        host=str(raw["host"]),
        node=str(metadata.get("name") or raw.get("node_name") or raw["host"]),
        group=str(raw.get("group") or "gpu_nodes"),
        serial=raw.get("serial", 1),
        order=int(raw.get("order", 100)),
        max_failed=raw.get("max_failed", 0),
        changes=tuple(str(c) for c in raw.get("changes") or ()),
        labels=dict(metadata.get("labels") or {}),
        unschedulable=bool(spec.get("unschedulable")),
    )


def driver_changes(
    plan_summary: Sequence[str], target_version: str | None, running_version: str | None
) -> list[str]:
    """Why the driver needs work: packages to change, or a driver that is not running."""
    out = [f"driver: {s}" for s in plan_summary]
    if target_version and running_version != target_version:
        running = running_version or "none"
        out.append(f"driver: {target_version} is not the running driver ({running})")
    return out


def label_changes(changes: Sequence[str], watched: Sequence[str]) -> list[str]:
    """The node-label plan's changes to the labels that select sharing configs."""
    return [f"labels: {c}" for c in changes if any(w in c for w in watched)]


def pods_to_wait_for(
    pods: Sequence[Mapping[str, Any]],
    resource_prefixes: Sequence[str] = (label_names.RESOURCE_PREFIX,),
    owner_kinds: Sequence[str] = ("Job",),
) -> list[str]:
    """Names of running GPU jobs on a node: pods that request a GPU resource and belong to
    one of `owner_kinds` (a Job's pod finishes on its own; a Deployment's never does). With
    `owner_kinds` empty, every GPU pod counts (the caller selected them by label)."""
    out: list[str] = []
    for pod in pods:
        status = pod.get("status") or {}
        if status.get("phase") not in ("Pending", "Running"):
            continue
        metadata = pod.get("metadata") or {}
        if metadata.get("deletionTimestamp"):
            continue
        owners = {o.get("kind") for o in metadata.get("ownerReferences") or []}
        if owner_kinds and not owners & set(owner_kinds):
            continue
        if _requests_gpu(pod, resource_prefixes):
            out.append(str(metadata.get("name")))
    return sorted(out)


def pods_left(pods: Sequence[Mapping[str, Any]]) -> list[str]:
    """Pods still running on a drained node that the drain should have removed (not
    DaemonSet pods, not static/mirror pods, not finished)."""
    out: list[str] = []
    for pod in pods:
        metadata = pod.get("metadata") or {}
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        if "kubernetes.io/config.mirror" in (metadata.get("annotations") or {}):
            continue
        if any(o.get("kind") == "DaemonSet" for o in metadata.get("ownerReferences") or []):
            continue
        out.append(f"{metadata.get('namespace')}/{metadata.get('name')}")
    return sorted(out)


def _requests_gpu(pod: Mapping[str, Any], prefixes: Sequence[str]) -> bool:
    spec = pod.get("spec") or {}
    for c in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        res = c.get("resources") or {}
        for k in [*(res.get("limits") or {}), *(res.get("requests") or {})]:
            if any(k.startswith(p) for p in prefixes):
                return True
    return False


def failed_so_far(results: Mapping[str, Any]) -> list[str]:
    """Hosts whose rollout began and did not end `done` (or `skipped`): failed, or
    interrupted (unreachable, or a failure the rollout could not handle). Untouched hosts
    have no result."""
    return sorted(h for h, r in results.items() if r not in (None, "done", "skipped"))


def agent_started_since(pods: Sequence[Mapping[str, Any]], since: str) -> bool:
    """A node agent pod on the node is running, every container ready and started at or
    after `since` (RFC 3339, UTC): after a reboot the node's status before it says nothing
    about the node after it."""
    for pod in pods:
        status = pod.get("status") or {}
        if status.get("phase") != "Running":
            continue
        containers = status.get("containerStatuses") or []
        started = [((c.get("state") or {}).get("running") or {}).get("startedAt") or ""
                   for c in containers]  # fmt: skip
        if containers and all(c.get("ready") for c in containers) and all(
            _utc(t) >= _utc(since) for t in started if t
        ) and all(started):
            return True
    return False


def _utc(stamp: str) -> str:
    """RFC 3339 UTC stamps compare as strings once normalised to `YYYY-MM-DDTHH:MM:SS`."""
    return str(stamp).replace("Z", "").replace("+00:00", "")[:19]


def node_serves(
    node: Mapping[str, Any], expected: Mapping[str, int], driver: str | None = None
) -> bool:
    """The node is Ready and advertises exactly the declared GPU resources (and, given
    `driver`, its node agent reports that driver)."""
    status = node.get("status") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    allocatable = {
        k: int(str(v))
        for k, v in (status.get("allocatable") or {}).items()
        if k.startswith(label_names.RESOURCE_PREFIX) and str(v).isdigit() and int(str(v)) > 0
    }
    labels = (node.get("metadata") or {}).get("labels") or {}
    if driver and labels.get(DRIVER_LABEL) != driver:
        return False
    return ready and allocatable == {k: int(v) for k, v in expected.items() if int(v) > 0}


def declaration_served(node: Mapping[str, Any], expected: Mapping[str, int]) -> bool:
    """The node's agent says it serves `expected` (its condition GpuDeclarationMismatch, as the
    conformance suite checks it): it has read the declaration the rollout handed it."""
    from gpukit.contracts import node_declaration as nd

    meta = node.get("metadata") or {}
    cond = next((c for c in (node.get("status") or {}).get("conditions") or []
                 if c.get("type") == nd.CONDITION_TYPE), None)  # fmt: skip
    return nd.serves(cond, str(meta.get("name") or ""), expected)


@dataclass
class Report:
    lines: list[str]
    done: list[str]
    failed: list[str]
    not_reached: list[str]
    complete: bool
    summary: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def report(
    planned: Mapping[str, Any],
    results: Mapping[str, Any],
    failures: Mapping[str, Any] | None = None,
    check_mode: bool = False,
) -> Report:
    """Each planned node's outcome: done, failed (why), or not reached (the rollout stopped)."""
    failures = failures or {}
    lines: list[str] = []
    done: list[str] = []
    failed: list[str] = []
    not_reached: list[str] = []
    for host in planned.get("order") or []:
        result = results.get(host)
        if check_mode:
            lines.append(f"{host}: would be upgraded")
        elif result == "done":
            done.append(host)
            lines.append(f"{host}: upgraded and validated")
        elif result == "failed":
            failed.append(host)
            lines.append(f"{host}: FAILED, left cordoned: {failures.get(host) or '?'}")
        elif result == "skipped":
            lines.append(f"{host}: skipped (labelled {SKIP_LABEL}={SKIP_VALUE} after the plan)")
        elif result is not None:
            failed.append(host)
            lines.append(f"{host}: FAILED, interrupted (unreachable, or an error the rollout"
                         " could not handle): check its gpukit.io/upgrade-state")
        else:
            not_reached.append(host)
            lines.append(f"{host}: not touched (the rollout stopped before its batch)")
    if not_reached and not check_mode:
        lines.append(_stop_reason(planned, set(failed), set(not_reached)))
    lines.extend(f"{h}: left alone (labelled {SKIP_LABEL}={SKIP_VALUE}, or cordoned by someone"
                 " else)" for h in planned.get("skipped") or [])  # fmt: skip
    lines.extend(f"{h}: matches the inventory" for h in planned.get("unchanged") or [])
    if check_mode:
        summary = (f"check mode: {len(planned.get('order') or [])} node(s) would be upgraded,"
                   " nothing changed")
        return Report(lines, [], [], [], True, summary)
    complete = not failed and not not_reached
    summary = (
        f"rollout {'complete' if complete else 'STOPPED' if not_reached else 'incomplete'}:"
        f" {len(done)} upgraded, {len(failed)} failed, {len(not_reached)} not reached"
    )
    return Report(lines, done, failed, not_reached, complete, summary)


def _stop_reason(planned: Mapping[str, Any], failed: set[str], not_reached: set[str]) -> str:
    """Why the rollout stopped before its first batch that was not reached."""
    batches = [list(b) for b in planned.get("batches") or []]
    budget = int(planned.get("max_failed") or 0)
    k = next((i for i, b in enumerate(batches) if set(b) <= not_reached), None)
    if k is None:
        return "the rollout stopped within a batch (interrupted)"
    before = sum(1 for b in batches[:k] for h in b if h in failed)
    if before > budget:
        why = f"more than gpukit_upgrade_max_failed allows ({budget})"
    else:
        why = (f"its {len(batches[k])} node(s) could take the rollout past its stop point"
               f" ({budget + 1} failed)")
    return f"the rollout stopped before batch {k + 1}: {before} node(s) failed, {why}"
