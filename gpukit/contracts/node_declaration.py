"""What a node must serve, as the roles hand it to the node's agent, and the node condition the
agent reports when it does not.

The device_plugin role renders one entry per node (key: the node's name) into the ConfigMap
`gpukit-node-agent-declarations`, from the declaration check's answer for that node
(gpukit.inventory.check, the suite's oracle); the agent reads its own entry and compares it
with what it serves (gpukit/plugin/served.py). Format, YAML or JSON:

    version: v1
    node: gpu-t4
    devicePluginConfig: ts         # the named config the node is declared to serve ('' none)
    resources: {nvidia.com/gpu: 8} # resource -> devices the node must advertise

The condition follows node-problem-detector's shape: type `GpuDeclarationMismatch`, status
"True" with a reason and a message naming declared and served per resource while the node
does not serve its declaration, "False" with reason `ServesDeclaration` once it does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from . import bounded_yaml
from .label_names import RESOURCE_PREFIX

VERSION = "v1"
CONDITION_TYPE = "GpuDeclarationMismatch"
# Reasons, CamelCase as Kubernetes condition reasons are.
REASON_OK = "ServesDeclaration"
REASON_DEVICES = "DevicesDifferFromDeclaration"  # GPUs lost, fewer devices, a MIG layout drift
REASON_CONFIG = "ConfigFallback"  # the declared config is refused; an older one is served
# Events on the node, as the agent's other Events (node_api.NodeClient.event).
EVENT_MISMATCH = "GpuDeclarationMismatch"
EVENT_CLEARED = "GpuDeclarationServed"

_FIELDS = ("version", "node", "devicePluginConfig", "resources")


class DeclarationError(ValueError):
    """A declaration entry that cannot be used; one line naming the field and value."""


@dataclass(frozen=True)
class NodeDeclaration:
    node: str
    resources: Mapping[str, int] = field(default_factory=dict)
    device_plugin_config: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"version": VERSION, "node": self.node,
                "devicePluginConfig": self.device_plugin_config,
                "resources": dict(sorted(self.resources.items()))}


def render(decl: NodeDeclaration) -> str:
    """The ConfigMap entry for `decl`."""
    return yaml.safe_dump(decl.as_dict(), sort_keys=False)


def parse(text: str, source: str = "declaration") -> NodeDeclaration:
    """A declaration entry; DeclarationError names `source`, the field and the value."""
    try:
        doc = bounded_yaml.load(text)
    except yaml.YAMLError as exc:
        raise DeclarationError(f"{source}: not YAML: {str(exc).splitlines()[0][:200]}") from exc
    return from_dict(doc, source)


def from_dict(doc: object, source: str = "declaration") -> NodeDeclaration:
    if not isinstance(doc, Mapping):
        raise DeclarationError(f"{source}: {_short(doc)} is not a mapping")
    unknown = sorted(str(k) for k in doc if k not in _FIELDS)
    if unknown:
        raise DeclarationError(f"{source}.{unknown[0]}: unknown field (known: "
                               f"{', '.join(_FIELDS)})")
    if doc.get("version") != VERSION:
        raise DeclarationError(f"{source}.version: {_short(doc.get('version'))} is not "
                               f"{VERSION!r}")
    node = doc.get("node")
    if not isinstance(node, str) or not node:
        raise DeclarationError(f"{source}.node: {_short(node)} is not a node name")
    config = doc.get("devicePluginConfig") or ""
    if not isinstance(config, str):
        raise DeclarationError(f"{source}.devicePluginConfig: {_short(config)} is not a "
                               "config name")
    raw = doc.get("resources")
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise DeclarationError(f"{source}.resources: {_short(raw)} is not a mapping of "
                               "resource names to counts")
    resources: dict[str, int] = {}
    for name, count in raw.items():
        if not isinstance(name, str) or not name.startswith(RESOURCE_PREFIX):
            raise DeclarationError(f"{source}.resources: {_short(name)} is not an "
                                   f"{RESOURCE_PREFIX} resource")
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise DeclarationError(f"{source}.resources.{name}: {_short(count)} is not a "
                                   "count >= 0")
        resources[str(name)] = int(count)
    # Plain str and int: values may come tagged from an Ansible inventory (str subclasses),
    # which the YAML renderer refuses.
    return NodeDeclaration(str(node), resources, str(config))


def _served_prefix(node: str) -> str:
    return f"node {node} serves its declaration: "


def served_message(node: str, resources: Mapping[str, int]) -> str:
    """The condition's message while `node` serves its declaration (`resources`: the counts
    compared, declared = served); `serves` reads it back."""
    summary = ", ".join(f"{n} {c}" for n, c in sorted(resources.items())) or "no GPU resources"
    return _served_prefix(node) + summary


def serves(condition: Mapping[str, Any] | None, node: str, resources: Mapping[str, int]) -> bool:
    """Whether a node's GpuDeclarationMismatch `condition` (the API's dict) says `node` serves
    exactly `resources` (zero counts ignored): False, and its message names these counts. A
    False condition alone is not enough: it may still speak of the declaration before."""
    if not condition or condition.get("status") != "False":
        return False
    prefix = _served_prefix(node)
    message = str(condition.get("message") or "")
    if not message.startswith(prefix):
        return False
    said: dict[str, int] = {}
    for part in message[len(prefix):].split(", "):
        name, _, count = part.rpartition(" ")
        if name.startswith(RESOURCE_PREFIX) and count.isdigit() and int(count):
            said[name] = int(count)
    return said == {n: int(c) for n, c in resources.items() if int(c)}


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
