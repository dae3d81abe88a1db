"""Reading an Ansible inventory: Ansible's own InventoryManager and VariableManager load it, so
group_vars/host_vars precedence and templating are exactly Ansible's; every host of `gpu_nodes`
is then validated by `validate.node_from_vars`, the one check of a host's declaration.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from . import files, known_variables, metrics, quotas
from .model import GPU_GROUP, VARIABLES, GpuInventory, NodeDecl
from .problems import MISSING, InventoryError, Problem, short
from .validate import configs_parsed_once, node_from_vars


@configs_parsed_once()  # the configs hosts share (group_vars) parsed once, not per host
def load(
    path: str | Path | Sequence[str | Path],
    hosts: Sequence[str] | None = None,
    host_vars: Mapping[str, Mapping[str, Any]] | None = None,
) -> GpuInventory:
    """Load an inventory (a directory, a hosts file, or anything Ansible accepts; several
    sources as a list, like repeated `-i`) and return the declarations of the hosts in
    `gpu_nodes` (or only `hosts`, by host or node name).

    `host_vars` (host -> {variable: value}) win over the inventory's files, as a play's extra
    variables do: a rolling upgrade validates a node against what its play applied, `-e`
    included (`declared_vars` reads those from a play's hostvars)."""
    from ansible.errors import AnsibleError  # type: ignore[import-untyped]

    paths = [str(p) for p in ([path] if isinstance(path, str | Path) else path)]
    source = ",".join(paths)
    missing = [p for p in paths if not Path(p).exists()]
    if missing or not paths:
        raise InventoryError([Problem(None, "inventory", missing or source, "does not exist")],
                             source)
    unreadable = files.problems(paths)  # bounds before Ansible's parser has none
    if unreadable:
        raise InventoryError(unreadable, source)
    try:
        return _load(paths, source, hosts, host_vars)
    except (AnsibleError, RecursionError) as exc:  # anything the bounds let through
        raise InventoryError([Problem(None, "inventory", MISSING,
                                      f"cannot be read: {one_line(exc)}")], source) from exc


def one_line(exc: BaseException) -> str:
    """An error (Ansible's span lines, quote the source) as one line of bounded length."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def _load(paths: list[str], source: str, hosts: Sequence[str] | None,
          host_vars: Mapping[str, Mapping[str, Any]] | None) -> GpuInventory:
    from ansible.errors import AnsibleError
    from ansible.inventory.manager import InventoryManager  # type: ignore[import-untyped]
    from ansible.parsing.dataloader import DataLoader  # type: ignore[import-untyped]
    from ansible.template import Templar  # type: ignore[import-untyped]
    from ansible.vars.manager import VariableManager  # type: ignore[import-untyped]

    loader = DataLoader()
    inv = InventoryManager(loader=loader, sources=paths)
    variables = VariableManager(loader=loader, inventory=inv)
    if GPU_GROUP not in inv.groups:
        raise InventoryError(
            [Problem(None, "groups", sorted(inv.groups), f"has no {GPU_GROUP!r} group "
                     "(every GPU node must be in it, see inventories/README.md)")], source)
    members = inv.get_hosts(GPU_GROUP)
    group_vars: dict[str, dict[str, Any]] = {}  # group -> the declaration variables it sets
    problems = _host_vars_problems(host_vars or {}, [h.name for h in members])
    if problems:
        raise InventoryError(problems, source)
    nodes: list[NodeDecl] = []
    tenancy_vars: dict[str, dict[str, Any]] = {}  # cluster-wide, seen by every GPU host
    strays: dict[tuple[str, str], Problem] = {}  # unknown variables, each (name, where) once
    for host in members:
        hv = variables.get_vars(host=host)
        for odd in (k for k in hv if not isinstance(k, str)):  # `? ` or `1: x` in a vars file
            problems.append(Problem(host.name, "variables", odd,
                                    "is not a variable name (a vars file's keys are names)"))
        names = {k for k in hv if isinstance(k, str)}
        for name, hint in known_variables.unknown(names, _MODEL_VARIABLES).items():
            where = _origin(hv[name])
            strays.setdefault((name, where or host.name), Problem(
                None if where else host.name, name, MISSING,
                f"is not a variable gpukit knows{f' (set in {where})' if where else ''}"
                + (f": {hint}" if hint else "")))
        templar = Templar(loader=loader, variables=hv)

        def value(name: str, default: Any = MISSING, _hv: Any = hv, _t: Any = templar,
                  _host: str = host.name) -> Any:
            if name not in _hv:
                return default
            if _plain_data(_hv[name]):  # nothing to template: Ansible would return it as is
                return plain(_hv[name])
            try:
                return plain(_t.template(_hv[name]))
            except AnsibleError as exc:
                problems.append(Problem(_host, name, plain(_hv[name]),
                                        f"cannot be templated: {one_line(exc)}"))
                return default

        raw = {name: value(name) for name in VARIABLES}
        tenancy_vars[host.name] = {
            n: v for n in quotas.VARIABLES if (v := value(n)) is not MISSING}
        given = (host_vars or {}).get(host.name, {})
        raw.update({k: plain(v) for k, v in given.items()})
        problems.extend(_group_conflicts(loader, inv, host, set(given), group_vars))
        raw["inventory_hostname"] = host.name
        raw["ansible_host"] = value("ansible_host", None)
        try:
            nodes.append(node_from_vars(host.name, raw))
        except InventoryError as exc:
            problems.extend(exc.problems)
    tenancy, tenancy_problems = quotas.from_hosts(tenancy_vars)
    problems.extend(tenancy_problems)
    problems.extend(strays.values())
    if problems:
        raise InventoryError(problems, source)
    seen: dict[str, str] = {}
    for n in nodes:
        if n.node_name in seen:
            problems.append(Problem(n.host, "gpukit_node_name", n.node_name,
                                    f"is also the node name of host {seen[n.node_name]}"))
        seen[n.node_name] = n.host
    problems += metrics.cluster_problems([(n.host, n.metrics) for n in nodes])
    if problems:
        raise InventoryError(problems, source)
    if hosts:
        wanted = set(hosts)
        unknown = wanted - {n.node_name for n in nodes} - {n.host for n in nodes}
        if unknown:
            raise InventoryError([Problem(None, "nodes", sorted(unknown), "are not GPU nodes "
                                          f"of this inventory (known: {sorted(seen)})")], source)
        nodes = [n for n in nodes if n.node_name in wanted or n.host in wanted]
    return GpuInventory(source=source, nodes=tuple(nodes), tenancy=tenancy)


# What the model reads beside the collection (the reference of known_variables).
_MODEL_VARIABLES = frozenset((*VARIABLES, *quotas.VARIABLES))


def _origin(value: Any) -> str:
    """`file:line` an inventory value came from (Ansible 2.19 tags what it loads); "" when
    the value carries none."""
    try:
        from ansible._internal._datatag._tags import Origin  # type: ignore[import-untyped]
    except ImportError:  # another ansible-core: the host names it instead
        return ""
    tag = Origin.get_tag(value)
    if tag is None or not tag.path:
        return ""
    return f"{tag.path}:{tag.line_num}" if tag.line_num else str(tag.path)


# The declaration variables but the kubeconfig (model.VARIABLES): what a host may declare.
DECLARED_VARIABLES = tuple(v for v in VARIABLES if v != "gpukit_kubeconfig")


def declared_vars(hostvars: Mapping[str, Any]) -> dict[str, Any]:
    """The declaration variables a host has (from a play's hostvars: -e included), plain."""
    return {name: plain(hostvars[name]) for name in DECLARED_VARIABLES if name in hostvars}


def _group_conflicts(loader: Any, inv: Any, host: Any, given: set[str],
                     cache: dict[str, dict[str, Any]]) -> list[Problem]:
    """Declaration variables that two groups of `host`, neither inside the other, set to
    different values (e.g. a host in two hardware groups): Ansible would pick one by group
    depth and name, silently. A value the host itself sets (host_vars, `-e`) decides."""
    from ansible.inventory.helpers import sort_groups  # type: ignore[import-untyped]
    from ansible.vars.plugins import (  # type: ignore[import-untyped]
        get_vars_from_inventory_sources,
    )

    def own(entity: Any) -> dict[str, Any]:
        """The declaration variables the entity itself sets (inventory source, *_vars dirs)."""
        found = {**entity.get_vars(),
                 **get_vars_from_inventory_sources(loader, inv._sources, [entity], "task")}
        return {k: plain(v) for k, v in found.items() if k in VARIABLES}

    decided = set(own(host)) | given
    groups = sort_groups([g for g in host.get_groups() if g.name != "all"])
    for g in groups:
        if g.name not in cache:
            cache[g.name] = own(g)
    setting = [(g, cache[g.name]) for g in groups]
    problems: list[Problem] = []
    for name in VARIABLES:
        if name in decided:
            continue
        by = [(g, gv[name]) for g, gv in setting if name in gv]
        for i, (a, va) in enumerate(by):
            for b, vb in by[i + 1 :]:  # b wins in Ansible's order
                related = a in b.get_ancestors() or b in a.get_ancestors()
                if va == vb or related or a.priority != b.priority:
                    continue
                problems.append(Problem(host.name, name, vb, f"comes from group {b.name}, "
                                        f"but group {a.name} sets {short(va)} (neither group "
                                        "is inside the other: Ansible picks one by group "
                                        "depth and name; declare it once, or for the host "
                                        "in host_vars)"))
    return problems


def _host_vars_problems(host_vars: Mapping[str, Any], members: Sequence[str]) -> list[Problem]:
    problems: list[Problem] = []
    for host, given in host_vars.items():
        if host not in members:
            problems.append(Problem(None, "host_vars", host, "is not a GPU node of this "
                                    f"inventory (known: {sorted(members)})"))
        elif not isinstance(given, Mapping):
            problems.append(Problem(host, "host_vars", given, "is not a mapping of variables"))
        elif unknown := sorted(set(given) - set(DECLARED_VARIABLES)):
            problems.append(Problem(host, "host_vars", unknown, "are not declaration "
                                    f"variables (known: {', '.join(DECLARED_VARIABLES)})"))
    return problems


_TEMPLATE_MARKS = ("{{", "{%", "{#")


def _plain_data(value: Any, depth: int = 0) -> bool:
    """Whether a value holds nothing Ansible's templating would change: strings without
    Jinja marks, numbers, booleans, None, in mappings and lists (a vaulted value, or anything
    else, is templated). Templating every host's values took most of a 1000-host load."""
    if value is None or isinstance(value, bool | int | float):
        return True
    if isinstance(value, str):
        return not any(mark in value for mark in _TEMPLATE_MARKS)
    if depth > 64:
        return False
    if isinstance(value, Mapping):
        return all(_plain_data(k, depth + 1) and _plain_data(v, depth + 1)
                   for k, v in value.items())  # fmt: skip
    if isinstance(value, list | tuple):
        return all(_plain_data(v, depth + 1) for v in value)
    return False


def plain(value: Any) -> Any:
    """Ansible's tagged values (2.19 data tagging) as plain Python types."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, Mapping):
        return {plain(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value

