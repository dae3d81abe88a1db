"""What a node must serve, as the roles hand it to the node's agent (or, on a DRA node, to the
DRA plugin), and the node condition they report when it does not.

The device_plugin role renders one entry per node (key: the node's name) into the ConfigMap
`gpukit-node-agent-declarations`, from the declaration check's answer for that node
(gpukit.inventory.check, the suite's oracle); the agent, or the DRA plugin, reads its own
entry and compares it with what it serves (gpukit/plugin/served.py). Format, YAML or JSON:

    version: v1
    node: gpu-t4
    devicePluginConfig: ts         # the named config the node is declared to serve ('' none)
    resources: {nvidia.com/gpu: 8} # resource -> devices the node must advertise

A DRA node's entry (gpukit_gpu_allocation: dra) has no resources and no config; it names the
healthy devices its ResourceSlices must publish instead, counted by kind (`dra_kind`: whole
GPUs, MIG devices per profile), from the oracle's `expected_dra_devices`:

    version: v1
    node: gpu-a100
    draDevices: {gpu.nvidia.com/gpu: 1, gpu.nvidia.com/mig-1g.5gb: 2}

`draDevices` is optional (an entry without it is a device plugin node's, as before it existed):
its presence makes the entry a DRA node's, which only the DRA plugin compares; the agent leaves
it alone, and the DRA plugin leaves a device plugin node's entry alone, so the two never report
on one node. Unknown fields are refused.

The condition follows node-problem-detector's shape: type `GpuDeclarationMismatch`, status
"True" with a reason and a message naming declared and served per resource while the node
does not serve its declaration, "False" with reason `ServesDeclaration` once it does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .dra import DRIVER, TYPE_GPU, TYPE_MIG
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

_FIELDS = ("version", "node", "devicePluginConfig", "resources", "draDevices",
           "draDynamicMig")
# A DRA node's device kinds: `gpu.nvidia.com/gpu`, `gpu.nvidia.com/mig-<profile>`.
DRA_KIND_PREFIX = f"{DRIVER}/"


def dra_kind(device_type: str, profile: str | None = None) -> str:
    """The kind a DRA node's device is counted as (its `type` and MIG `profile` attributes)."""
    if device_type == TYPE_MIG:
        return f"{DRA_KIND_PREFIX}{TYPE_MIG}-{profile}"
    return f"{DRA_KIND_PREFIX}{device_type or TYPE_GPU}"


def dra_counts(devices: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Kind -> count of devices given as the oracle's expected_dra_devices (dicts with `type`
    and `profile`)."""
    out: dict[str, int] = {}
    for d in devices:
        kind = dra_kind(str(d["type"]), str(d.get("profile") or "") or None)
        out[kind] = out.get(kind, 0) + 1
    return dict(sorted(out.items()))


class DeclarationError(ValueError):
    """A declaration entry that cannot be used; one line naming the field and value."""


@dataclass(frozen=True)
class NodeDeclaration:
    node: str
    resources: Mapping[str, int] = field(default_factory=dict)
    device_plugin_config: str = ""
    # A DRA node's: kind (dra_kind) -> healthy devices it must publish; None: not a DRA node.
    dra_devices: Mapping[str, int] | None = None
    # A DRA node's GPUs carved on demand (gpukit_dra_dynamic_mig, gpukit.contracts.
    # dra_dynamic_mig): GPU index -> allowed profiles; the DRA plugin reads it at each rescan.
    dra_dynamic_mig: Mapping[int, tuple[str, ...]] = field(default_factory=dict)

    @property
    def dra(self) -> bool:
        return self.dra_devices is not None

    def counts(self) -> Mapping[str, int]:
        """What is compared with what the node serves: DRA device kinds or resources."""
        return self.resources if self.dra_devices is None else self.dra_devices

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"version": VERSION, "node": self.node,
                               "devicePluginConfig": self.device_plugin_config,
                               "resources": dict(sorted(self.resources.items()))}
        if self.dra_devices is not None:
            out["draDevices"] = dict(sorted(self.dra_devices.items()))
        if self.dra_dynamic_mig:
            out["draDynamicMig"] = {str(i): list(p) for i, p in
                                    sorted(self.dra_dynamic_mig.items())}
        return out


def render(decl: NodeDeclaration) -> str:
    """The ConfigMap entry for `decl`."""
    import yaml  # imported on use: the node agent imports this module on its way to registering

    return yaml.safe_dump(decl.as_dict(), sort_keys=False)


def parse(text: str, source: str = "declaration") -> NodeDeclaration:
    """A declaration entry; DeclarationError names `source`, the field and the value."""
    import yaml

    from . import bounded_yaml

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
    resources = _counts(raw, f"{source}.resources", RESOURCE_PREFIX, "an nvidia.com/ resource")
    dra: dict[str, int] | None = None
    if "draDevices" in doc:
        dra = _counts(doc["draDevices"] if doc["draDevices"] is not None else {},
                      f"{source}.draDevices", DRA_KIND_PREFIX,
                      f"a {DRA_KIND_PREFIX} device kind (e.g. {dra_kind(TYPE_GPU)})")
        if resources or config:
            what = "resources" if resources else "devicePluginConfig"
            raise DeclarationError(f"{source}.{what}: {_short(resources or config)} on a DRA "
                                   "node (draDevices): it serves no device plugin resources")
    dynamic: dict[int, tuple[str, ...]] = {}
    if doc.get("draDynamicMig"):
        if dra is None:
            raise DeclarationError(f"{source}.draDynamicMig: on a node without draDevices: "
                                   "only a DRA node carves MIG devices on demand")
        # Here, not at import: it reads the MIG tables (PyYAML), which the node agent's start
        # must not pay before it registers (tests/plugin/test_quiet_agent.py).
        from . import dra_dynamic_mig

        try:
            gpus = dra_dynamic_mig.parse(doc["draDynamicMig"], field=f"{source}.draDynamicMig")
        except dra_dynamic_mig.DynamicMigError as exc:
            raise DeclarationError(str(exc)) from exc
        dynamic = {g.index: tuple(str(p) for p in g.profiles) for g in gpus}
    # Plain str and int: values may come tagged from an Ansible inventory (str subclasses),
    # which the YAML renderer refuses.
    return NodeDeclaration(str(node), resources, str(config), dra, dynamic)


def _counts(raw: object, where: str, prefix: str, what: str) -> dict[str, int]:
    """Name -> count; every name starts with `prefix` (`what` names such a name)."""
    if not isinstance(raw, Mapping):
        raise DeclarationError(f"{where}: {_short(raw)} is not a mapping of names to counts")
    out: dict[str, int] = {}
    for name, count in raw.items():
        if not isinstance(name, str) or not name.startswith(prefix) or name == prefix:
            raise DeclarationError(f"{where}: {_short(name)} is not {what}")
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise DeclarationError(f"{where}.{name}: {_short(count)} is not a count >= 0")
        out[str(name)] = int(count)
    return out


def _served_prefix(node: str) -> str:
    return f"node {node} serves its declaration: "


def served_message(node: str, resources: Mapping[str, int]) -> str:
    """The condition's message while `node` serves its declaration (`resources`: the counts
    compared, declared = served); `serves` reads it back."""
    summary = ", ".join(f"{n} {c}" for n, c in sorted(resources.items())) or "no GPU resources"
    return _served_prefix(node) + summary


def serves(condition: Mapping[str, Any] | None, node: str, resources: Mapping[str, int]) -> bool:
    """Whether a node's GpuDeclarationMismatch `condition` (the API's dict) says `node` serves
    exactly `resources` (resources or, on a DRA node, DRA device kinds; zero counts ignored):
    False, and its message names these counts. A False condition alone is not enough: it may
    still speak of the declaration before."""
    if not condition or condition.get("status") != "False":
        return False
    prefix = _served_prefix(node)
    message = str(condition.get("message") or "")
    if not message.startswith(prefix):
        return False
    said: dict[str, int] = {}
    for part in message[len(prefix):].split(", "):
        name, _, count = part.rpartition(" ")
        if name.startswith((RESOURCE_PREFIX, DRA_KIND_PREFIX)) and count.isdigit() and \
                int(count):
            said[name] = int(count)
    return said == {n: int(c) for n, c in resources.items() if int(c)}


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
