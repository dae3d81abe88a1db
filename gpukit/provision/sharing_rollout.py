"""Rolling a change of a device plugin config's content node by node.

Every node agent reads its config from one cluster-wide ConfigMap (`gpukit-node-agent-configs`),
picking a key by the node label `nvidia.com/device-plugin.config` (or the default config).
Changing a key's content there changes every node that selects it at once. A rollout
(playbooks/upgrade.yml) therefore:

1. plans: per node, compares the content the node serves now (the ConfigMap's key its label
   selects) with the inventory's content for the config it declares (`node_plan`);
2. publishes: the new content goes under a versioned key `<name>-<8 hex of sha256>` while
   `<name>` keeps the old content, so nodes not yet rolled keep their behaviour (`publish`);
3. rolls: in a node's batch, after the drain, its label moves to the versioned key and the
   agent reloads (the rollout role);
4. finishes, once no node failed: `<name>` gets the new content, the rolled nodes' labels go
   back to `<name>` (after their agents see the new content mounted, so the switch serves
   the same config) and versioned keys no node selects are dropped (`finish`). A rollout
   that stopped leaves both keys; a rerun resumes.

site.yml converges everything regardless: it writes `<name>` with the new content, drops the
keys it did not render and labels every node with its plain config name.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import yaml

from gpukit import agent_manifests as deploy
from gpukit.contracts.config_versions import (
    base_of,
    canonical,
    is_version_of,
    versioned_name,
)

CONFIG_MAP = f"{deploy.APP}-configs"
_MAX_DIFFS = 4
def normalise(content: Any) -> Any:
    """Content as the ConfigMap carries it (YAML round trip: plain types only)."""
    return yaml.safe_load(render(content))


def render(content: Any) -> str:
    """A config as a ConfigMap value, exactly as the device_plugin role renders it."""
    return deploy.config_text(content)


def same(a: Any, b: Any) -> bool:
    if a is None or b is None or isinstance(a, _Unreadable) or isinstance(b, _Unreadable):
        return False
    return canonical(normalise(a)) == canonical(normalise(b))


class _Unreadable:
    def __init__(self, text: str, error: str) -> None:
        self.text, self.error = text, error


def parse_data(config_map: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The ConfigMap's configs (name -> content); None when there is no ConfigMap. A value
    that is not YAML is kept as an unreadable marker (it never equals a declared config)."""
    if not config_map:
        return None
    out: dict[str, Any] = {}
    for key, text in ((config_map.get("data") or {}).items()):
        try:
            out[str(key)] = yaml.safe_load(str(text))
        except yaml.YAMLError as exc:
            out[str(key)] = _Unreadable(str(text), str(exc).splitlines()[0])
    return out


# --------------------------------------------------------------------------------------------
# Describing a change


def _flatten(value: Any, path: str = "") -> dict[str, Any]:
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{path}.{k}" if path else str(k)))
        return out or {path: {}}
    if isinstance(value, list):
        named = all(isinstance(e, Mapping) and "name" in e for e in value) and len(
            {str(e["name"]) for e in value}) == len(value)  # fmt: skip
        out = {}
        for i, e in enumerate(value):
            key = f"{path}[{e['name']}]" if named else f"{path}[{i}]"
            out.update(_flatten({k: v for k, v in e.items() if k != "name"} if named else e, key))
        return out or {path: []}
    return {path: value}


def _short(value: Any) -> str:
    if value is _ABSENT:
        return "(unset)"
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    return text if len(text) <= 40 else text[:37] + "..."


_ABSENT: Any = object()


def describe(name: str, old: Any, new: Any) -> list[str]:
    """Why a node serving `old` must roll to `new`: the differing settings, concisely."""
    if old is None:
        return [f"sharing config {name}: not in the cluster's ConfigMap {CONFIG_MAP} yet"]
    if isinstance(old, _Unreadable):
        return [f"sharing config {name}: the ConfigMap's content is not YAML ({old.error})"]
    a, b = _flatten(normalise(old)), _flatten(normalise(new))
    diffs = [
        f"{path} {_short(a.get(path, _ABSENT))} -> {_short(b.get(path, _ABSENT))}"
        for path in sorted(set(a) | set(b))
        if a.get(path, _ABSENT) != b.get(path, _ABSENT)
    ]
    if not diffs:  # only types or layout differ
        return [f"sharing config {name}: content changes"]
    shown = diffs[:_MAX_DIFFS]
    more = f" (and {len(diffs) - len(shown)} more)" if len(diffs) > len(shown) else ""
    return [f"sharing config {name}: {', '.join(shown)}{more}"]


# --------------------------------------------------------------------------------------------
# Planning one node


@dataclass(frozen=True)
class NodeSharing:
    """A node's sharing config in the rollout.

    changes: why the node must roll (empty: it serves the inventory's content already).
    label: the `nvidia.com/device-plugin.config` value the rollout gives the node (None: the
        inventory declares none, the agent's default config applies).
    plan_label: the value the label plan compares with (a node already on a versioned name
        of the declared content is not a label change: the finish step moves it back).
    """

    changes: list[str] = field(default_factory=list)
    label: str | None = None
    plan_label: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"changes": self.changes, "label": self.label, "plan_label": self.plan_label}


def rollout_label(live: Mapping[str, Any], name: str, content: Any) -> str:
    """The key a rolled node selects for config `name` with `content`: `name` while the
    ConfigMap's `name` has that content (or lacks the name: publishing adds it), else the
    versioned key."""
    if name not in live or same(live[name], content):
        return name
    return versioned_name(name, content)


def node_plan(
    live: Mapping[str, Any] | None,
    configs: Mapping[str, Any],
    declared: str | None,
    default: str | None,
    current_label: str | None,
) -> NodeSharing:
    """Compare what a node serves (the ConfigMap's key its label, or the default, selects)
    with the inventory's content for the config it declares. `live` None: no ConfigMap
    (the device plugin is not deployed yet; site.yml deploys it)."""
    name = declared or default
    if live is None or name is None or name not in configs:
        return NodeSharing([], declared, declared)
    content = configs[name]
    target = rollout_label(live, name, content)
    label = declared if target == name else target
    selected = current_label or default
    if selected != name and not is_version_of(selected, name):
        return NodeSharing([], label, declared)  # the label change is the reason
    assert selected is not None
    serving = live.get(selected)
    if same(serving, content):
        return NodeSharing([], label, current_label if selected != name else declared)
    return NodeSharing(describe(name, serving, content), label, declared)


# --------------------------------------------------------------------------------------------
# Publishing and finishing


def _data_equal(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return set(a) == set(b) and all(
        canonical(_plain(a[k])) == canonical(_plain(b[k])) for k in a
    )


def _plain(v: Any) -> Any:
    return {"unreadable": v.text} if isinstance(v, _Unreadable) else normalise(v)


def publish(live: Mapping[str, Any] | None, declared: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ConfigMap's configs before the rollout: each declared config whose content changed
    also under its versioned key (the plain key keeps the old content); a config the ConfigMap
    lacks is added. Nothing is removed. None: nothing to write."""
    if live is None:
        return None
    data = dict(live)
    for name, content in declared.items():
        if name not in live:
            data[name] = content
        elif not same(live[name], content):
            data[versioned_name(name, content)] = content
    return None if _data_equal(data, live) else data


@dataclass(frozen=True)
class NodeUse:
    """A cluster node's selection: its label now, and (for inventory nodes) the label the
    inventory declares and the inventory host."""

    node: str
    label: str | None
    host: str | None = None
    declared: str | None = None

    def selects(self, default: str | None) -> str | None:
        return self.label or default


@dataclass
class Finish:
    """What the finish step does, in order: write `stage` (promoted configs, versioned keys
    kept), wait until each host in `relabel` mounts the promoted content of the config named
    there, relabel those hosts as the inventory declares, write `final` (unreferenced
    versioned keys dropped). None: nothing to write."""

    stage: dict[str, Any] | None
    relabel: dict[str, str]
    final: dict[str, Any] | None
    lines: list[str]

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "needed": bool(self.stage or self.relabel or self.final)}


def finish(
    live: Mapping[str, Any] | None,
    declared: Mapping[str, Any],
    nodes: Sequence[NodeUse],
    default: str | None,
    complete: bool,
) -> Finish:
    """Decide the finish step (see `Finish`). Nothing happens while the rollout is incomplete
    (a failed or unreached node keeps both keys: a rerun resumes). A config is promoted only
    when no node still selects its plain name with the old content (e.g. a node labelled
    skip, or outside --limit): those would change at once."""
    if live is None:
        return Finish(None, {}, None, [])
    pending = {n: c for n, c in declared.items() if n in live and not same(live[n], c)}
    versions = {k: base for k in live if k not in declared
                and (base := base_of(k, list(declared))) is not None}  # fmt: skip
    if not complete:
        waiting = [f"sharing config {n}: the rollout did not complete; {n} keeps the old content"
                   f" and {versioned_name(n, c)} the new one until a rerun finishes it"
                   for n, c in sorted(pending.items())]  # fmt: skip
        return Finish(None, {}, None, waiting)
    lines: list[str] = []
    stage = dict(live)
    for name, content in sorted(pending.items()):
        old_users = sorted(u.node for u in nodes if u.selects(default) == name)
        if old_users:
            lines.append(f"sharing config {name}: not finished, {', '.join(old_users)} still"
                         f" serve(s) the old content (skipped or outside the rollout)")
            continue
        stage[name] = content
        lines.append(f"sharing config {name}: the new content is now {name}")
    relabel: dict[str, str] = {}
    after: dict[str, str | None] = {}
    for u in nodes:
        after[u.node] = u.label
        base = versions.get(u.label or "")
        if base is None or u.host is None or (u.declared or default) != base:
            continue
        # Only once `base` carries exactly the content the node serves under its version.
        if not (same(stage.get(base), declared[base]) and same(live.get(u.label or ""),
                                                               declared[base])):
            continue
        relabel[u.host] = base
        after[u.node] = u.declared
        lines.append(f"{u.host}: label {u.label} -> {u.declared or '(none: default config)'}")
    referenced = {v for v in after.values() if v}
    final = {k: v for k, v in stage.items() if k not in versions or k in referenced}
    for k in sorted(set(stage) - set(final)):
        lines.append(f"sharing config {versions[k]}: versioned key {k} dropped")
    return Finish(
        None if _data_equal(stage, live) else stage,
        relabel,
        None if _data_equal(final, stage) else final,
        lines,
    )


def config_map(data: Mapping[str, Any], namespace: str) -> dict[str, Any]:
    """The ConfigMap with `data` (name -> content), rendered as the device_plugin role does
    (so that a later site.yml applies the same values)."""
    obj = deploy.config_map(deploy.AgentDeployment(image="-", namespace=namespace))
    obj["data"] = {
        str(k): (v.text if isinstance(v, _Unreadable) else render(v))
        for k, v in sorted(data.items())
    }
    return obj


def mounted(text: str | None, content: Any) -> bool:
    """A node's mounted config file (its text) has `content`."""
    if text is None:
        return False
    try:
        return same(yaml.safe_load(text), content)
    except yaml.YAMLError:
        return False
