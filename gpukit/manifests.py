"""The node agent's Kubernetes objects for an inventory, as site.yml applies them.

`gpukit manifests --inventory INV` prints them for `kubectl apply -f -` or a GitOps repository:
the device plugin's, then the DRA plugin's (RBAC, own-slices policy, NVIDIA's DeviceClasses, its
DaemonSet on the nodes labelled gpukit.io/gpu.allocation=dra), which the role applies always
(`device_plugin_dra`, `--no-dra` leaves them out). The DeviceClass gpu.nvidia.com maps
nvidia.com/gpu where the cluster supports it: the role asks the cluster its version, offline the
current releases are assumed (`--kubernetes-version` names the cluster's).
They are the objects the device_plugin role applies (roles/device_plugin/tasks/daemonset.yml):
the role computes its variables from the inventory's (roles/device_plugin/defaults/main.yml:
an inventory may set the role's own variables too, which win over its defaults), merges every
play host's named configs into one ConfigMap, and renders with the first play host's variables
(the apply is `run_once`); `gpukit.provision.agent.render` draws the objects for both.

The play is site.yml's: the hosts of `gpu_nodes`, narrowed by `limit` as `--limit` narrows
ansible-playbook's; `extra_vars` are `-e` (`@file`, YAML/JSON, or key=value).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from gpukit.contracts import label_names
from gpukit.inventory import GPU_GROUP, InventoryError, check, plain
from gpukit.inventory import files as inventory_files
from gpukit.inventory.check import CheckResult
from gpukit.inventory.load import one_line
from gpukit.inventory.problems import short
from gpukit.provision import agent, telemetry


class ManifestsError(ValueError):
    """The inventory cannot give the device plugin's objects; the message names the host,
    the variable and the value."""


# The role's variables that an inventory variable feeds: role variable -> (inventory variable,
# value when neither is set). tests/unit/test_manifests.py holds this to the role's defaults.
FROM_INVENTORY: dict[str, tuple[str, Any]] = {
    "device_plugin_configs": ("gpukit_device_plugin_configs", {}),
    "device_plugin_image": ("gpukit_device_plugin_image", ""),
    "device_plugin_image_pull_policy": ("gpukit_device_plugin_image_pull_policy", "IfNotPresent"),
    "device_plugin_driver_root": ("gpukit_device_plugin_driver_root", "/"),
    "device_plugin_nvml_library": ("gpukit_device_plugin_nvml_library", ""),
    "device_plugin_env": ("gpukit_device_plugin_env", {}),
    "device_plugin_host_mounts": ("gpukit_device_plugin_host_mounts", []),
    "device_plugin_dra_mps": ("gpukit_dra_mps", False),
}
# The role's other variables that shape the objects, with their defaults.
ROLE_DEFAULTS: dict[str, Any] = {
    "device_plugin_mode": "daemonset",
    "device_plugin_namespace": "gpukit-system",
    "device_plugin_node_selector": {label_names.DEPLOY_DEVICE_PLUGIN: "true"},
    "device_plugin_dra": True,
    "device_plugin_dra_node_selector": dict(agent.DRA_NODE_SELECTOR),
    "device_plugin_dra_extended_resource": None,  # None: by the cluster's version
    "device_plugin_kubernetes_version": None,  # the role reads the cluster's
}
DEFAULT_CONFIG = "device_plugin_default_config"  # 'default' when the host's configs have one
METRICS_ADDRESS = "device_plugin_metrics_address"  # from gpukit_metrics_* (inventory.metrics)
METRICS_AUTH = "device_plugin_metrics_auth"  # from gpukit_metrics_auth (inventory.metrics)
# agent.render's arguments, as daemonset.yml passes them (configs: the merged ones).
RENDER_ARGS = {
    "image": "device_plugin_image",
    "namespace": "device_plugin_namespace",
    "default_config": DEFAULT_CONFIG,
    "driver_root": "device_plugin_driver_root",
    "nvml_library": "device_plugin_nvml_library",
    "node_selector": "device_plugin_node_selector",
    "env": "device_plugin_env",
    "host_mounts": "device_plugin_host_mounts",
    "metrics_address": METRICS_ADDRESS,
    "metrics_auth": METRICS_AUTH,
    "image_pull_policy": "device_plugin_image_pull_policy",
    "dra": "device_plugin_dra",
    "dra_node_selector": "device_plugin_dra_node_selector",
    "dra_extended_resource": "device_plugin_dra_extended_resource",
    "kubernetes_version": "device_plugin_kubernetes_version",
    "dra_mps": "device_plugin_dra_mps",
}


def role_vars(host: str, hostvars: Mapping[str, Any]) -> dict[str, Any]:
    """The device_plugin role's variables for one host, from its (templated) variables."""
    out: dict[str, Any] = {}
    for name, (inventory_name, default) in FROM_INVENTORY.items():
        out[name] = hostvars.get(name, hostvars.get(inventory_name, default))
    for name, default in ROLE_DEFAULTS.items():
        out[name] = hostvars.get(name, default)
    configs = out["device_plugin_configs"]
    if not isinstance(configs, Mapping):
        raise ManifestsError(f"host {host}: gpukit_device_plugin_configs: {configs!r} is not a "
                             "mapping of config names to device plugin configs")
    out[DEFAULT_CONFIG] = hostvars.get(DEFAULT_CONFIG,
                                       "default" if "default" in configs else None)
    try:
        out[METRICS_ADDRESS] = hostvars.get(METRICS_ADDRESS,
                                            telemetry.agent_address(host, hostvars))
        out[METRICS_AUTH] = hostvars.get(METRICS_AUTH, telemetry.agent_auth(host, hostvars))
    except InventoryError as e:
        raise ManifestsError(str(e)) from e
    return out


def render(play: Sequence[tuple[str, Mapping[str, Any]]],
           declarations: Mapping[str, Mapping[str, Any] | None] | None = None
           ) -> list[dict[str, Any]]:
    """The objects for a play's hosts, in play order, each with its role variables;
    `declarations`: host -> its agent's declaration entry (agent.node_declaration)."""
    if not play:
        raise ManifestsError("no hosts in the play")
    first, first_vars = play[0]
    mode = first_vars["device_plugin_mode"]
    if mode != "daemonset":
        raise ManifestsError(f"host {first}: device_plugin_mode: {mode!r} runs the device "
                             "plugin as a host service: the role applies no Kubernetes objects")
    per_host = {h: v["device_plugin_configs"] for h, v in play
                if v["device_plugin_mode"] == "daemonset"}  # fmt: skip
    try:
        merged = agent.merge_configs(per_host)
        decls = agent.merge_declarations({h: (declarations or {}).get(h) for h in per_host})
        return agent.render(configs=merged, declarations=decls,
                            **{arg: first_vars[var] for arg, var in RENDER_ARGS.items()})
    except agent.AgentSpecError as e:
        raise ManifestsError(f"host {first}: {e}") from e


def for_inventory(
    inventory: str | Path,
    limit: Sequence[str] = (),
    extra_vars: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """The objects site.yml's device_plugin role applies for the inventory (see the module's
    docstring); needs ansible-core, as reading any inventory does."""
    return printed(inventory, limit, extra_vars)[0]


def printed(
    inventory: str | Path,
    limit: Sequence[str] = (),
    extra_vars: Sequence[str] = (),
) -> tuple[list[dict[str, Any]], dict[str, dict[str, str]]]:
    """`gpukit manifests`' output: the objects (for_inventory) and the play nodes' labels
    (node_labels), from one read of the play and one declaration check."""
    play = play_vars(inventory, limit, extra_vars)
    result = check(str(inventory))
    return (render(play, _declarations(result)),
            _node_labels(result, {h for h, _ in play}))


def node_labels(inventory: str | Path, limit: Sequence[str] = ()
                ) -> dict[str, dict[str, str]]:
    """Node name -> the labels site.yml's node_labels role puts on it, among them those the
    printed DaemonSets select on (nvidia.com/gpu.deploy.device-plugin, gpukit.io/gpu.allocation)
    and the agents read (the config selections): what a GitOps apply without site.yml must
    label the nodes with. Empty when the inventory has problems (`gpukit inventory check`)."""
    hosts = {h for h, _ in play_vars(inventory, limit)} if limit else None
    return _node_labels(check(str(inventory)), hosts)


def _node_labels(result: CheckResult, hosts: set[str] | None) -> dict[str, dict[str, str]]:
    from gpukit.provision import nodes

    if result.inventory is None:
        return {}
    return {decl.node_name: nodes.with_allocation(
                nodes.declared_labels(decl.labels, decl.plugin_config_name,
                                      decl.mig_config_name), decl.gpu_allocation, decl.dra_shares)
            for decl in result.inventory.nodes if hosts is None or decl.host in hosts}  # fmt: skip


def labels_comment(labels: Mapping[str, Mapping[str, str]]) -> str:
    """`labels` as YAML comment lines to lead the printed stream."""
    lines = ["# Node labels these objects rely on (site.yml's node_labels role sets them;",
             "# applying these objects without site.yml, label the nodes so):"]
    lines += [f"#   {node}: " + " ".join(f"{k}={v}" for k, v in sorted(ls.items()))
              for node, ls in labels.items()]  # fmt: skip
    return "\n".join(lines) + "\n"


def _declarations(result: CheckResult) -> dict[str, dict[str, Any] | None]:
    """Host -> what its agent must serve, from the declaration check (as the preflight's
    gpukit_declaration hands it to the role); none when the inventory has problems (the
    preflight refuses such a play; `gpukit inventory check` names them)."""
    from gpukit.provision import declaration

    facts = declaration.facts(result)
    return {host: agent.declaration_entry(fact) for host, fact in facts.items()}


def play_vars(
    inventory: str | Path,
    limit: Sequence[str] = (),
    extra_vars: Sequence[str] = (),
) -> list[tuple[str, dict[str, Any]]]:
    """(host, role variables) of site.yml's play hosts, in play order."""
    from ansible.errors import AnsibleError  # type: ignore[import-untyped]
    from ansible.inventory.manager import InventoryManager  # type: ignore[import-untyped]
    from ansible.parsing.dataloader import DataLoader  # type: ignore[import-untyped]
    from ansible.template import Templar  # type: ignore[import-untyped]
    from ansible.vars.manager import VariableManager  # type: ignore[import-untyped]

    source = str(inventory)
    if not Path(source).exists():
        raise ManifestsError(f"inventory {source!r} does not exist")
    unreadable = inventory_files.problems([source])  # bounds before Ansible's parser
    if unreadable:
        raise InventoryError(unreadable, source)
    loader = DataLoader()
    try:
        inv = InventoryManager(loader=loader, sources=[source])
        variables = VariableManager(loader=loader, inventory=inv)
        extra = _extra_vars(loader, extra_vars)
    except (AnsibleError, RecursionError) as e:
        raise ManifestsError(f"{source}: cannot be read: {one_line(e)}") from e
    if GPU_GROUP not in inv.groups:
        raise ManifestsError(f"{source}: no {GPU_GROUP!r} group: site.yml plays its hosts")
    if limit:
        inv.subset(list(limit))
    hosts = inv.get_hosts(GPU_GROUP)
    if not hosts:
        raise ManifestsError(f"{source}: no host of {GPU_GROUP!r} matches the limit "
                             f"{', '.join(limit)!r}")
    wanted = (*FROM_INVENTORY, *(v for v, _ in FROM_INVENTORY.values()), *ROLE_DEFAULTS,
              DEFAULT_CONFIG, METRICS_ADDRESS, *telemetry.VARIABLES)  # fmt: skip
    play: list[tuple[str, dict[str, Any]]] = []
    for host in hosts:
        try:
            hv = {**variables.get_vars(host=host), **extra}
        except (AnsibleError, RecursionError) as e:
            raise ManifestsError(f"{source}: cannot be read: {one_line(e)}") from e
        templar = Templar(loader=loader, variables=hv)
        templated: dict[str, Any] = {}
        for name in wanted:
            if name in hv:
                try:
                    templated[name] = plain(templar.template(hv[name]))
                except AnsibleError as e:
                    raise ManifestsError(f"host {host.name}: {name}: {short(plain(hv[name]))} "
                                         f"cannot be templated: {one_line(e)}") from e
        play.append((host.name, role_vars(host.name, templated)))
    return play


def _extra_vars(loader: Any, given: Sequence[str]) -> dict[str, Any]:
    """`-e` values as ansible-playbook reads them, later ones winning."""
    from ansible.parsing.splitter import parse_kv  # type: ignore[import-untyped]

    out: dict[str, Any] = {}
    for text in given:
        if text.startswith("@"):
            data = loader.load_from_file(text[1:])
        elif text.lstrip().startswith(("{", "[")):
            data = loader.load(text)
        else:
            data = parse_kv(text)
        if not isinstance(data, Mapping):
            raise ManifestsError(f"--extra-vars {text[:80]!r}: not a mapping of variables")
        out.update(data)
    return out


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the ConfigMap's configs) as literal blocks, as a person writes them."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def to_yaml(objects: Sequence[Mapping[str, Any]]) -> str:
    """One YAML stream, each object its own `---` document, in apply order."""
    return yaml.dump_all([plain(o) for o in objects], Dumper=_Dumper, sort_keys=False,
                         explicit_start=True, default_flow_style=False)
