"""The device plugin DaemonSet's objects from the role's variables (gpukit.agent_manifests
holds the manifests; this checks the variables and the named configs first)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from gpukit.agent_manifests import AgentDeployment, HostMount, manifests
from gpukit.contracts import label_names
from gpukit.contracts import node_declaration as nd
from gpukit.contracts.plugin_config import ConfigError, parse_config, require_content
from gpukit.provision import image_version
from gpukit.provision.upgrade import declaration_served, node_serves

PULL_POLICIES = ("Always", "IfNotPresent", "Never")
# The DRA plugin's DaemonSet runs where the node declares DRA (role node_labels sets the label
# from gpukit_gpu_allocation): deployed always, it has no pod until a node is switched.
DRA_NODE_SELECTOR = {label_names.GPU_ALLOCATION: "dra"}
# DeviceClass.spec.extendedResourceName (KEP-5004, DRAExtendedResource): alpha and off by
# default in 1.34 and 1.35, whose apiservers drop the field silently; beta and on from 1.36,
# GA (locked on) in 1.37.
EXTENDED_RESOURCE_SINCE = (1, 36)


class AgentSpecError(ValueError):
    """A device plugin variable is wrong; the message names the variable."""


def check_configs(configs: Mapping[str, Any], where: str = "gpukit_device_plugin_configs") -> None:
    """Every named config must be a valid NVIDIA v1 config (gpukit's parser decides)."""
    if not isinstance(configs, Mapping) or not configs:
        raise AgentSpecError(f"{where}: must map config names to device plugin configs")
    problems: list[str] = []
    for name, cfg in configs.items():
        if not isinstance(cfg, Mapping):
            problems.append(f"{where}[{name!r}]: must be a mapping (an NVIDIA v1 config)")
            continue
        try:
            parse_config(require_content(dict(cfg)), source=f"{where}[{name!r}]")
        except ConfigError as e:
            problems += [f"{where}[{name!r}]{p.removeprefix('<root>')}"
                         if p.startswith("<root>:") else f"{where}[{name!r}].{p}"
                         for p in e.problems]
    if problems:
        raise AgentSpecError("; ".join(problems))


def merge_configs(
    per_host: Mapping[str, Mapping[str, Any]], where: str = "gpukit_device_plugin_configs"
) -> dict[str, Any]:
    """One ConfigMap for the cluster from every node's named configs: groups may declare
    configs of their own, but a name must mean the same config on every node (otherwise
    the ConfigMap would silently carry one host's version)."""
    merged: dict[str, Any] = {}
    owner: dict[str, str] = {}
    problems: list[str] = []
    for host, configs in per_host.items():
        for name, cfg in (configs or {}).items():
            if name not in merged:
                merged[name], owner[name] = cfg, host
            elif merged[name] != cfg:
                problems.append(
                    f"{where}[{name!r}]: differs between {owner[name]} and {host}; the configs"
                    " share one cluster-wide ConfigMap: give a group's own config its own name"
                )
    if problems:
        raise AgentSpecError("; ".join(dict.fromkeys(problems)))
    return merged


def check_selection(configs: Mapping[str, Any], selected: str | None, where: str) -> None:
    if selected is not None and selected not in configs:
        raise AgentSpecError(
            f"{where}: {selected!r} is not one of gpukit_device_plugin_configs"
            f" ({', '.join(sorted(configs))})"
        )


def _mounts(raw: Sequence[Mapping[str, Any]]) -> tuple[HostMount, ...]:
    out: list[HostMount] = []
    for i, m in enumerate(raw):
        try:
            out.append(HostMount(name=str(m["name"]), host_path=str(m["host_path"]),
                                 mount_path=str(m.get("mount_path") or m["host_path"]),
                                 read_only=bool(m.get("read_only", True))))  # fmt: skip
        except (KeyError, TypeError) as e:
            raise AgentSpecError(
                f"gpukit_device_plugin_host_mounts[{i}]: needs name and host_path ({e})"
            ) from e
    return tuple(out)


def extended_resource_supported(kubernetes_version: str | None) -> bool:
    """Whether a cluster of this version (`v1.35.4`, a server's gitVersion) maps an extended
    resource to a DeviceClass. Unknown (None, e.g. `gpukit manifests` offline): assumed, as
    on every supported release from 1.36."""
    if not kubernetes_version:
        return True
    m = re.match(r"v?(\d+)\.(\d+)", str(kubernetes_version).strip())
    if not m:
        raise AgentSpecError(f"kubernetes version {kubernetes_version!r}: expected e.g. v1.37.2")
    return (int(m.group(1)), int(m.group(2))) >= EXTENDED_RESOURCE_SINCE


def deployment(
    image: str,
    configs: Mapping[str, Any],
    namespace: str = "gpukit-system",
    default_config: str | None = None,
    driver_root: str = "/",
    nvml_library: str | None = None,
    metrics_address: str = "127.0.0.1:9402",
    metrics_auth: str = "kubernetes",
    node_labels: bool = True,
    node_selector: Mapping[str, str] | None = None,
    env: Mapping[str, Any] | None = None,
    host_mounts: Sequence[Mapping[str, Any]] = (),
    image_pull_policy: str = "IfNotPresent",
    dra: bool = False,
    dra_node_selector: Mapping[str, str] | None = None,
    dra_extended_resource: bool | None = None,
    kubernetes_version: str | None = None,
    declarations: Mapping[str, Mapping[str, Any]] | None = None,
    dra_mps: bool = False,
) -> AgentDeployment:
    """The deployment the role's variables describe. With `dra`, the DRA plugin's objects too,
    on `dra_node_selector` (default DRA_NODE_SELECTOR); `dra_extended_resource` None: the
    DeviceClass maps nvidia.com/gpu where `kubernetes_version` supports it."""
    check_configs(configs)
    checked = check_declarations(declarations or {})
    check_selection(configs, default_config, "gpukit_device_plugin_default_config")
    if not image:
        raise AgentSpecError("gpukit_device_plugin_image: an image reference is required")
    malformed = image_version.reference_problem(image)
    if malformed:  # the DaemonSet references exactly this: by tag, or by digest
        raise AgentSpecError(malformed)
    if image_pull_policy not in PULL_POLICIES:
        raise AgentSpecError(
            f"gpukit_device_plugin_image_pull_policy: {image_pull_policy!r} is not one of"
            f" {', '.join(PULL_POLICIES)}"
        )
    return AgentDeployment(
        image=image,
        namespace=namespace,
        configs={str(k): dict(v) for k, v in configs.items()},
        declarations=checked,
        default_config=default_config,
        driver_root=driver_root,
        nvml_library=nvml_library or None,
        metrics_address=metrics_address,
        metrics_auth=metrics_auth,
        node_labels=node_labels,
        node_selector={str(k): str(v) for k, v in (node_selector or {}).items()},
        env={str(k): str(v) for k, v in (env or {}).items()},
        host_mounts=_mounts(host_mounts),
        image_pull_policy=image_pull_policy,
        dra=bool(dra),
        dra_node_selector={str(k): str(v) for k, v in (
            DRA_NODE_SELECTOR if dra_node_selector is None else dra_node_selector).items()},
        dra_extended_resource=(extended_resource_supported(kubernetes_version)
                               if dra_extended_resource is None else bool(dra_extended_resource)),
        dra_mps=bool(dra_mps),
    )


def check_declarations(declarations: Mapping[str, Mapping[str, Any]],
                       where: str = "declarations") -> dict[str, dict[str, Any]]:
    """Node name -> its declaration entry (NodeDeclaration.as_dict()), each checked."""
    out: dict[str, dict[str, Any]] = {}
    for node, raw in declarations.items():
        try:
            decl = nd.from_dict(raw, f"{where}[{node!r}]")
        except nd.DeclarationError as exc:
            raise AgentSpecError(str(exc)) from exc
        if decl.node != node:
            raise AgentSpecError(f"{where}[{node!r}].node: {decl.node!r} is not {node!r}")
        out[str(node)] = decl.as_dict()
    return out


def node_declaration(known: Any, host_vars: Mapping[str, Any], host: str
                     ) -> dict[str, Any] | None:
    """What the node's agent (on a DRA node: its DRA plugin) must serve (a NodeDeclaration's
    entry) for its served-vs-declared watchdog: the declaration check's answer (the
    preflight's `known`, the host's gpukit_declaration, when it validated these very
    variables, else validated now). InventoryError: invalid."""
    from gpukit import inventory
    from gpukit.provision import declaration

    given = {k: host_vars[k] for k in inventory.DECLARED_VARIABLES if k in host_vars}
    fact = known if declaration.matches(
        known, **{k: given.get(k) for k in inventory.DECLARED_VARIABLES}
    ) else declaration.for_vars(host, host_vars)
    return declaration_entry(fact)


def declaration_entry(fact: Mapping[str, Any]) -> dict[str, Any] | None:
    """The node's declaration entry from a host's gpukit_declaration: on a DRA node the
    devices its ResourceSlices must publish, counted by kind (the oracle's
    expected_dra_devices), for the DRA plugin; else the agent's resources and config."""
    if fact.get("gpu_allocation") == "dra":
        dynamic = {int(i): tuple(str(p) for p in profiles)
                   for i, profiles in (fact.get("dra_dynamic_mig") or {}).items()}
        return nd.NodeDeclaration(str(fact["node_name"]), dra_devices=nd.dra_counts(
            fact.get("expected_dra_devices") or []), dra_dynamic_mig=dynamic).as_dict()
    return nd.NodeDeclaration(str(fact["node_name"]), dict(fact["expected_resources"]),
                              str(fact.get("device_plugin_config") or "")).as_dict()


def merge_declarations(per_host: Mapping[str, Mapping[str, Any] | None]
                       ) -> dict[str, dict[str, Any]]:
    """Node name -> declaration from each host's (None: none, left out). Two hosts declaring
    one node differently is an error naming both."""
    out: dict[str, dict[str, Any]] = {}
    owner: dict[str, str] = {}
    for host, decl in per_host.items():
        if not decl:
            continue
        node = str(decl["node"])
        if node in out and out[node] != dict(decl):
            raise AgentSpecError(f"hosts {owner[node]} and {host} both declare node {node} "
                                 "(gpukit_node_name), differently")
        out[node], owner[node] = dict(decl), host
    return out


def render(**kwargs: Any) -> list[dict[str, Any]]:
    """Every object of the DaemonSet deployment, in apply order."""
    return manifests(deployment(**kwargs))


def node_serves_declared(
    node: Mapping[str, Any], expected: Mapping[str, int], selector: Mapping[str, str]
) -> bool:
    """site.yml's last wait: the node advertises its declared GPU resources and its agent
    says it serves that declaration (its GpuDeclarationMismatch condition: the agent reads a
    changed declaration only when the kubelet refreshes its ConfigMap volume, up to about a
    minute after the devices already show), or the DaemonSet's `selector` does not pick it
    (no agent there to wait for)."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    if any(labels.get(k) != str(v) for k, v in selector.items()):
        return True
    return node_serves(node, expected) and declaration_served(node, expected)


def dra_declaration_served(node: Mapping[str, Any], expected: Sequence[Mapping[str, Any]]
                           ) -> bool:
    """site.yml's last wait on a DRA node, after its slices: its DRA plugin says it serves its
    declaration (the condition GpuDeclarationMismatch False, naming the devices of `expected`,
    the oracle's expected_dra_devices, by kind), so it has read the declaration the play
    rendered (a changed ConfigMap reaches a running plugin with the kubelet's next refresh)."""
    return declaration_served(node, nd.dra_counts(expected))


def expected_dra_devices(known: Any, host_vars: Mapping[str, Any], host: str
                         ) -> list[dict[str, Any]]:
    """The ResourceSlice devices a DRA node must publish (the oracle's expected_dra_devices,
    empty on a device plugin node): the preflight's (`known`, the host's gpukit_declaration)
    when it validated these very variables, else validated now. InventoryError: the
    declaration is invalid."""
    from gpukit import inventory
    from gpukit.provision import declaration

    given = {k: host_vars[k] for k in inventory.DECLARED_VARIABLES if k in host_vars}
    if declaration.matches(known, **{k: given.get(k) for k in inventory.DECLARED_VARIABLES}):
        return list(known["expected_dra_devices"])
    return list(declaration.for_vars(host, host_vars)["expected_dra_devices"])


def _dra_key(device: Mapping[str, Any]) -> tuple[str, int, str]:
    """(type, GPU index or MIG parent index, profile) of a ResourceSlice device."""
    attrs = device.get("attributes") or {}
    kind = str((attrs.get("type") or {}).get("string", ""))
    where = attrs.get("parentIndex" if kind == "mig" else "index") or {}
    return kind, int(where.get("int", -1)), str((attrs.get("profile") or {}).get("string", ""))


def dra_slice_differences(slices: Sequence[Mapping[str, Any]],
                          expected: Sequence[Mapping[str, Any]]) -> list[str]:
    """What differs between a DRA node's ResourceSlices (driver gpu.nvidia.com, newest pool
    generation) and the devices it must serve (the preflight fact's `expected_dra_devices`):
    missing or extra devices, a wrong name, attribute or capacity. Empty: the node serves its
    declaration (site.yml's wait, the rolling upgrade's validation)."""
    newest = max((int(s["spec"]["pool"]["generation"]) for s in slices), default=0)
    got: dict[tuple[str, int, str], list[Mapping[str, Any]]] = {}
    for s in slices:
        if int(s["spec"]["pool"]["generation"]) == newest:
            for d in s["spec"].get("devices") or []:
                got.setdefault(_dra_key(d), []).append(d)
    out: list[str] = []
    for want in expected:
        key = (str(want["type"]), int(want["gpu_index"]), str(want.get("profile") or ""))
        what = f"GPU {key[1]}" if key[0] == "gpu" else f"MIG {key[2]} on GPU {key[1]}"
        if not got.get(key):
            out.append(f"{what}: expected a device, observed none")
            continue
        device = got[key].pop(0)
        name = str(device.get("name", ""))
        if not re.fullmatch(str(want["name_pattern"]), name):
            out.append(f"{what}: name expected {want['name_pattern']}, observed {name}")
        attrs = device.get("attributes") or {}
        capacity = {k: (v or {}).get("value") for k, v in (device.get("capacity") or {}).items()}
        for field, wanted, seen in (("attribute", want.get("attributes") or {}, attrs),
                                    ("capacity", want.get("capacity") or {}, capacity)):
            for k, v in sorted(wanted.items()):
                if seen.get(k) != v:
                    out.append(f"{what} ({name}): {field} {k} expected {v}, observed "
                               f"{seen.get(k)}")
    out += [f"{d.get('name')}: not declared" for left in got.values() for d in left]
    return out
