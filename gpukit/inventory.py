"""The inventory model: what an Ansible inventory declares about each GPU node.

One module reads the inventory (`inventories/README.md` is the variable schema) for the roles,
the node agent and the conformance suite. Ansible's own InventoryManager and VariableManager load
it, so group_vars/host_vars precedence and templating are exactly Ansible's; this module turns
the merged variables into typed, validated declarations and says what a node must then serve:

    from gpukit import inventory

    inv = inventory.load("inventories/lab")
    node = inv.node("gpu-t4")
    inventory.expected_resources(node)   # {"nvidia.com/gpu": 8}
    inventory.expected_labels(node)      # {"nvidia.com/gpu.product": "Tesla-T4-SHARED", ...}

The expectations are computed here from the declaration alone (the device plugin config is parsed
with `gpukit.contracts.plugin_config.parse_config`, the MIG geometry comes from
`gpukit.contracts.mig_profiles`); they
deliberately do not call the plugin's resource or label builders, because the conformance suite
checks what those produce.

Every error names the host, the variable (with the path inside it) and the value:
`inventories/lab: host gpu-t4: gpukit_gpu.count: 'two' is not an integer >= 0`.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpukit.contracts import label_syntax, mig_parted, mig_profiles
from gpukit.contracts.device_ids import mig_resource_name
from gpukit.contracts.mig_parted import MigConfigEntry
from gpukit.contracts.plugin_config import Config, ConfigError, parse_config, require_content
from gpukit.mig import declared
from gpukit.mig.declared import GpuMig
from gpukit.provision.driver import DriverSpec, DriverSpecError

GPU_GROUP = "gpu_nodes"
GPU_RESOURCE = "nvidia.com/gpu"
RUNTIMES = ("containerd", "crio")
KERNEL_MODULES = ("open", "proprietary")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
DEVICE_PLUGIN_CONFIG_LABEL = "nvidia.com/device-plugin.config"
MIG_CONFIG_LABEL = "nvidia.com/mig.config"

_BRANCH = re.compile(r"^\d{3,4}$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_INVALID_LABEL_CHARS = re.compile(r"[^A-Za-z0-9_.-]+")
_INVALID_PRODUCT_CHARS = re.compile(r"[^A-Za-z0-9_. -]+")
_UUID_REF = re.compile(r"^(GPU|MIG)-")


# --------------------------------------------------------------------------------------------
# Errors


@dataclass(frozen=True)
class Problem:
    """One invalid declaration: where, which variable (dotted path inside it), which value."""

    host: str | None
    variable: str
    value: object
    message: str

    def __str__(self) -> str:
        where = f"host {self.host}: " if self.host else ""
        shown = _short(self.value)
        return f"{where}{self.variable}: {shown} {self.message}" if shown else (
            f"{where}{self.variable}: {self.message}"
        )


def _short(value: object) -> str:
    if value is _MISSING:
        return ""
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


_MISSING: Any = _Missing()


class InventoryError(ValueError):
    """The inventory cannot be read or declares something invalid; lists every problem."""

    def __init__(self, problems: Sequence[Problem], source: str = "") -> None:
        self.problems = list(problems)
        self.source = source
        where = f"{source}: " if source else ""
        if len(self.problems) == 1:
            text = f"{where}{self.problems[0]}"
        else:
            text = f"{where}{len(self.problems)} problems:\n  " + "\n  ".join(
                str(p) for p in self.problems
            )
        super().__init__(text)


# --------------------------------------------------------------------------------------------
# Declarations


@dataclass(frozen=True)
class GpuDecl:
    """`gpukit_gpu`: the GPUs a node has."""

    product: str
    count: int
    memory_mib: int | None = None

    @property
    def mig_table(self) -> mig_profiles.MigGpu | None:
        return mig_profiles.for_product(self.product)


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True)
class NodeDecl:
    """Everything the inventory declares about one GPU node."""

    host: str
    node_name: str
    gpu: GpuDecl
    address: str | None = None
    driver_branch: str | None = None
    driver_version: str | None = None  # nvidia_driver_version: pinned within the branch
    kernel_modules: str | None = None
    container_runtime: str = "containerd"
    plugin_config_name: str | None = None
    plugin_config: Config = field(default_factory=Config)
    plugin_configs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # as declared
    mig_config_name: str | None = None
    mig_layout: tuple[MigConfigEntry, ...] | None = None  # the selected layout, parsed
    mig_gpus: tuple[GpuMig, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    kubeconfig: str | None = None

    @property
    def mig_strategy(self) -> str:
        return self.plugin_config.flags.mig_strategy

    @property
    def mig_declared(self) -> bool:
        """The inventory manages MIG on this node (`gpukit_mig_config` is not null)."""
        return self.mig_layout is not None

    def selection_labels(self) -> dict[str, str]:
        """Node labels the inventory implies besides `gpukit_node_labels` (the config
        selectors the node agent and the MIG manager read)."""
        out: dict[str, str] = {}
        if self.plugin_config_name:
            out[DEVICE_PLUGIN_CONFIG_LABEL] = self.plugin_config_name
        if self.mig_config_name:
            out[MIG_CONFIG_LABEL] = self.mig_config_name
        return out


@dataclass(frozen=True)
class GpuInventory:
    """The GPU nodes of one inventory, in inventory order."""

    source: str
    nodes: tuple[NodeDecl, ...]

    def node(self, name: str) -> NodeDecl:
        """By Kubernetes node name or inventory host name."""
        for n in self.nodes:
            if name in (n.node_name, n.host):
                return n
        known = ", ".join(n.node_name for n in self.nodes) or "none"
        raise KeyError(f"{self.source}: no GPU node {name!r} (nodes: {known})")

    def node_names(self) -> list[str]:
        return [n.node_name for n in self.nodes]

    @property
    def kubeconfig(self) -> str | None:
        found = {n.kubeconfig for n in self.nodes if n.kubeconfig}
        return found.pop() if len(found) == 1 else None


# --------------------------------------------------------------------------------------------
# Loading


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
    from ansible.inventory.manager import InventoryManager  # type: ignore[import-untyped]
    from ansible.parsing.dataloader import DataLoader  # type: ignore[import-untyped]
    from ansible.template import Templar  # type: ignore[import-untyped]
    from ansible.vars.manager import VariableManager  # type: ignore[import-untyped]

    paths = [str(p) for p in ([path] if isinstance(path, str | Path) else path)]
    source = ",".join(paths)
    missing = [p for p in paths if not Path(p).exists()]
    if missing or not paths:
        raise InventoryError([Problem(None, "inventory", missing or source, "does not exist")],
                             source)
    loader = DataLoader()
    try:
        inv = InventoryManager(loader=loader, sources=paths)
        variables = VariableManager(loader=loader, inventory=inv)
    except AnsibleError as exc:
        raise InventoryError([Problem(None, "inventory", source, f"cannot be read: {exc}")],
                             source) from exc
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
    for host in members:
        hv = variables.get_vars(host=host)
        templar = Templar(loader=loader, variables=hv)

        def value(name: str, default: Any = _MISSING, _hv: Any = hv, _t: Any = templar,
                  _host: str = host.name) -> Any:
            if name not in _hv:
                return default
            try:
                return plain(_t.template(_hv[name]))
            except AnsibleError as exc:
                problems.append(Problem(_host, name, plain(_hv[name]),
                                        f"cannot be templated: {exc}"))
                return default

        raw = {name: value(name) for name in _VARIABLES}
        given = (host_vars or {}).get(host.name, {})
        raw.update({k: plain(v) for k, v in given.items()})
        problems.extend(_group_conflicts(loader, inv, host, set(given), group_vars))
        raw["inventory_hostname"] = host.name
        raw["ansible_host"] = value("ansible_host", None)
        try:
            nodes.append(node_from_vars(host.name, raw))
        except InventoryError as exc:
            problems.extend(exc.problems)
    if problems:
        raise InventoryError(problems, source)
    seen: dict[str, str] = {}
    for n in nodes:
        if n.node_name in seen:
            problems.append(Problem(n.host, "gpukit_node_name", n.node_name,
                                    f"is also the node name of host {seen[n.node_name]}"))
        seen[n.node_name] = n.host
    if problems:
        raise InventoryError(problems, source)
    if hosts:
        wanted = set(hosts)
        unknown = wanted - {n.node_name for n in nodes} - {n.host for n in nodes}
        if unknown:
            raise InventoryError([Problem(None, "nodes", sorted(unknown), "are not GPU nodes "
                                          f"of this inventory (known: {sorted(seen)})")], source)
        nodes = [n for n in nodes if n.node_name in wanted or n.host in wanted]
    return GpuInventory(source=source, nodes=tuple(nodes))


@dataclass(frozen=True)
class CheckResult:
    """What `check` found: the inventory (None when it could not be loaded), what each node
    must serve, and every problem."""

    inventory: GpuInventory | None
    resources: Mapping[str, Mapping[str, int]]  # node name -> resource -> count
    problems: tuple[Problem, ...]


def check(
    path: str | Path | Sequence[str | Path],
    host_vars: Mapping[str, Mapping[str, Any]] | None = None,
) -> CheckResult:
    """Every GPU node's declaration and what it implies (resources, labels), validated on the
    controller without connecting anywhere: `gpukit inventory check` and the playbooks'
    preflight (the gpukit.gpu.inventory_check action). Every problem at once; problems of the
    implied resources and labels show once the declarations themselves are valid."""
    try:
        gpus = load(path, host_vars=host_vars)
    except InventoryError as exc:
        return CheckResult(None, {}, tuple(exc.problems))
    problems: list[Problem] = []
    resources: dict[str, Mapping[str, int]] = {}
    for decl in gpus.nodes:
        try:
            resources[decl.node_name] = expected_resources(decl)
            expected_labels(decl)
        except InventoryError as exc:
            problems += exc.problems
    return CheckResult(gpus, resources, tuple(problems))


# The variables a node's declaration is made of; DECLARED_VARIABLES: those but the kubeconfig.
_VARIABLES = (
    "gpukit_kubeconfig", "gpukit_node_name", "gpukit_gpu", "nvidia_driver_branch",
    "nvidia_driver_version", "nvidia_driver_kernel_modules", "gpukit_container_runtime",
    "gpukit_device_plugin_configs", "gpukit_device_plugin_config", "gpukit_mig_configs",
    "gpukit_mig_config", "gpukit_node_labels", "gpukit_node_taints",
)
DECLARED_VARIABLES = tuple(v for v in _VARIABLES if v != "gpukit_kubeconfig")


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
        return {k: plain(v) for k, v in found.items() if k in _VARIABLES}

    decided = set(own(host)) | given
    groups = sort_groups([g for g in host.get_groups() if g.name != "all"])
    for g in groups:
        if g.name not in cache:
            cache[g.name] = own(g)
    setting = [(g, cache[g.name]) for g in groups]
    problems: list[Problem] = []
    for name in _VARIABLES:
        if name in decided:
            continue
        by = [(g, gv[name]) for g, gv in setting if name in gv]
        for i, (a, va) in enumerate(by):
            for b, vb in by[i + 1 :]:  # b wins in Ansible's order
                related = a in b.get_ancestors() or b in a.get_ancestors()
                if va == vb or related or a.priority != b.priority:
                    continue
                problems.append(Problem(host.name, name, vb, f"comes from group {b.name}, "
                                        f"but group {a.name} sets {_short(va)} (neither group "
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


class _Vars:
    """Typed reads of one host's variables, collecting problems."""

    def __init__(self, host: str, raw: Mapping[str, Any]) -> None:
        self.host = host
        self.raw = raw
        self.problems: list[Problem] = []

    def fail(self, variable: str, value: object, message: str) -> None:
        self.problems.append(Problem(self.host, variable, value, message))

    def get(self, name: str) -> Any:
        return self.raw.get(name, _MISSING)

    def string(self, name: str, value: Any, default: str | None = None,
               choices: Sequence[str] | None = None) -> str | None:
        if value is _MISSING or value is None:
            return default
        if not isinstance(value, str) or not value:
            self.fail(name, value, "is not a non-empty string")
            return default
        if choices is not None and value not in choices:
            self.fail(name, value, f"is not one of {', '.join(choices)}")
            return default
        return value

    def integer(self, name: str, value: Any, minimum: int) -> int | None:
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(name, value, f"is not an integer >= {minimum}")
            return None
        if value < minimum:
            self.fail(name, value, f"is not an integer >= {minimum}")
            return None
        return value

    def mapping(self, name: str, value: Any) -> Mapping[str, Any] | None:
        if value is _MISSING or value is None:
            return None
        if not isinstance(value, Mapping):
            self.fail(name, value, f"is not a mapping (got {type(value).__name__})")
            return None
        return value


def node_from_vars(host: str, raw: Mapping[str, Any]) -> NodeDecl:
    """Validate one host's merged variables (plain Python values) into a NodeDecl.

    `raw` maps variable names to values; absent variables may be missing. Raises InventoryError
    listing every problem of this host."""
    v = _Vars(host, raw)
    node_name = v.string("gpukit_node_name", v.get("gpukit_node_name"), default=host) or host
    if not _DNS_SUBDOMAIN.match(node_name):
        v.fail("gpukit_node_name", node_name, "is not a valid Kubernetes node name")
    gpu = _gpu(v)
    branch_raw = v.get("nvidia_driver_branch")
    branch: str | None = None
    if branch_raw is not _MISSING and branch_raw is not None:
        if isinstance(branch_raw, int) and not isinstance(branch_raw, bool):
            branch_raw = str(branch_raw)
        if not isinstance(branch_raw, str) or not _BRANCH.match(branch_raw):
            v.fail("nvidia_driver_branch", branch_raw, 'is not a driver branch such as "550"')
        else:
            branch = branch_raw
    version = _driver_version(v, branch, branch_raw)
    modules = v.string("nvidia_driver_kernel_modules", v.get("nvidia_driver_kernel_modules"),
                       choices=KERNEL_MODULES)
    runtime = v.string("gpukit_container_runtime", v.get("gpukit_container_runtime"),
                       default="containerd", choices=RUNTIMES) or "containerd"
    config_name, config, configs = _plugin_config(v)
    mig_name, layout, mig_gpus = _mig_layout(v, gpu)
    labels = _labels(v)
    taints = _taints(v)
    kubeconfig = v.string("gpukit_kubeconfig", v.get("gpukit_kubeconfig"))
    address = v.get("ansible_host")
    if v.problems:
        raise InventoryError(v.problems)
    assert gpu is not None
    return NodeDecl(
        host=host, node_name=node_name, gpu=gpu,
        address=str(address) if address not in (None, _MISSING) else None,
        driver_branch=branch, driver_version=version, kernel_modules=modules,
        container_runtime=runtime,
        plugin_config_name=config_name, plugin_config=config, plugin_configs=configs,
        mig_config_name=mig_name,
        mig_layout=layout, mig_gpus=mig_gpus, labels=labels, taints=taints,
        kubeconfig=kubeconfig,
    )


def _driver_version(v: _Vars, branch: str | None, branch_raw: Any) -> str | None:
    """`nvidia_driver_version`, validated as the nvidia_driver role does (DriverSpec); empty or
    null is the role's default: the newest of the branch, nothing pinned."""
    name = "nvidia_driver_version"
    raw = v.get(name)
    if raw is _MISSING or raw is None or raw == "":
        return None
    if isinstance(raw, float):  # YAML reads an unquoted 550.90 as 550.9
        v.fail(name, raw, 'is a number, not a driver version: quote it, e.g. "550.90.07"')
        return None
    if not isinstance(raw, str):
        v.fail(name, raw, 'is not a driver version such as "550.90.07"')
        return None
    if branch is None:
        if branch_raw is _MISSING or branch_raw is None:  # a bad branch is reported already
            v.fail(name, raw, "pins a version without nvidia_driver_branch (the role pins it "
                   "within the branch; declare both)")
        return None
    try:
        DriverSpec(branch=branch, version=raw)
    except DriverSpecError as exc:
        # The role's message names the variable and quotes the value already.
        v.fail(name, _MISSING, str(exc).partition(": ")[2])
        return None
    return raw


def _gpu(v: _Vars) -> GpuDecl | None:
    raw = v.get("gpukit_gpu")
    if raw is _MISSING or raw is None:
        v.fail("gpukit_gpu", _MISSING, "is not set: declare the node's GPUs as "
               "{product: ..., count: ..., memory_mib: ...}")
        return None
    doc = v.mapping("gpukit_gpu", raw)
    if doc is None:
        return None
    for key in doc:
        if key not in ("product", "count", "memory_mib"):
            v.fail(f"gpukit_gpu.{key}", doc[key], "is not a known field "
                   "(product, count, memory_mib)")
    product = doc.get("product")
    if not isinstance(product, str) or not product.strip():
        v.fail("gpukit_gpu.product", product if "product" in doc else _MISSING,
               "is not a product name such as 'NVIDIA A100-SXM4-40GB'")
        product = None
    count = v.integer("gpukit_gpu.count", doc.get("count", _MISSING), 0)
    memory = doc.get("memory_mib")
    if memory is not None:
        memory = v.integer("gpukit_gpu.memory_mib", memory, 1)
    if product is None or count is None:
        return None
    return GpuDecl(product=product.strip(), count=count, memory_mib=memory)


def _plugin_config(v: _Vars) -> tuple[str | None, Config, dict[str, Mapping[str, Any]]]:
    """The selected config, parsed; every named config is validated (all are deployed)."""
    configs_raw = v.get("gpukit_device_plugin_configs")
    configs = v.mapping("gpukit_device_plugin_configs", configs_raw) or {}
    parsed: dict[str, Config] = {}
    declared: dict[str, Mapping[str, Any]] = {}
    for cname, doc in configs.items():
        var = f"gpukit_device_plugin_configs.{cname}"
        if not isinstance(doc, Mapping):
            v.fail(var, doc, "is not a device plugin config (a mapping with version: v1)")
            continue
        declared[str(cname)] = doc
        try:
            parsed[str(cname)] = parse_config(require_content(dict(doc)))
        except ConfigError as exc:
            for problem in exc.problems:
                path, _, message = problem.partition(": ")
                # The config parser's messages already quote the offending value.
                v.fail(var if path == "<root>" else f"{var}.{path}", _MISSING, message)
    name = v.string("gpukit_device_plugin_config", v.get("gpukit_device_plugin_config"))
    if name is None:
        if len(configs) != 1:
            return None, Config(), declared
        name = str(next(iter(configs)))
    if name not in configs:
        known = ", ".join(sorted(configs)) or "none declared in gpukit_device_plugin_configs"
        v.fail("gpukit_device_plugin_config", name, f"is not a named config (known: {known})")
        return name, Config(), declared
    return name, parsed.get(name, Config()), declared


def _mig_var(text: str) -> str:
    """The MIG schema's paths (`mig-configs.l[0].devices`) as the inventory variable's."""
    return text.replace(f"{mig_parted.ROOT}.", "gpukit_mig_configs.")


def _mig_layout(v: _Vars, gpu: GpuDecl | None
                ) -> tuple[str | None, tuple[MigConfigEntry, ...] | None, tuple[GpuMig, ...]]:
    """The selected layout, read by the MIG manager's own parser (gpukit.contracts.mig_parted)
    and laid on the declared GPUs by gpukit.mig (the planner's placement search)."""
    configs = v.mapping("gpukit_mig_configs", v.get("gpukit_mig_configs")) or {}
    name = v.string("gpukit_mig_config", v.get("gpukit_mig_config"))
    no_mig = tuple(GpuMig(i, False) for i in range(gpu.count)) if gpu else ()
    if name is None:
        return None, None, no_mig
    if name not in configs:
        known = ", ".join(sorted(configs)) or "none declared in gpukit_mig_configs"
        v.fail("gpukit_mig_config", name, f"is not a named MIG layout (known: {known})")
        return name, None, no_mig
    try:
        entries = mig_parted.parse({name: configs[name]}).select(name)
    except mig_parted.MigConfigError as exc:
        for problem in exc.problems:
            path, _, message = problem.partition(": ")
            # The schema's messages already quote the offending value.
            v.fail(_mig_var(path), _MISSING, _mig_var(message))
        return name, None, no_mig
    if gpu is None:
        return name, entries, ()
    gpus, problems = declared.layout_gpus(entries, gpu.product, gpu.count)
    for p in problems:
        v.fail(_mig_var(p.path), p.value, _mig_var(p.message))
    return name, entries, gpus


def _labels(v: _Vars) -> dict[str, str]:
    raw = v.mapping("gpukit_node_labels", v.get("gpukit_node_labels")) or {}
    out: dict[str, str] = {}
    for key, value in raw.items():
        var = f"gpukit_node_labels.{key}"
        if not isinstance(key, str) or not _label_key_ok(key):
            v.fail("gpukit_node_labels", key, "is not a valid label key ([prefix/]name)")
            continue
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, int | float | str):
            text = str(value)
        elif value is None:
            text = ""
        else:
            v.fail(var, value, "is not a label value (a string)")
            continue
        if not label_syntax.value_ok(text):
            v.fail(var, value, "is not a valid label value (<= 63 of [A-Za-z0-9_.-], "
                   "alphanumeric at both ends)")
            continue
        out[key] = text
    return out


def _label_key_ok(key: str) -> bool:
    return label_syntax.key_problem(key) is None


def _taints(v: _Vars) -> tuple[Taint, ...]:
    raw = v.get("gpukit_node_taints")
    if raw is _MISSING or raw is None:
        return ()
    if not isinstance(raw, list):
        v.fail("gpukit_node_taints", raw, "is not a list of {key, value, effect}")
        return ()
    out: list[Taint] = []
    for i, item in enumerate(raw):
        where = f"gpukit_node_taints[{i}]"
        if not isinstance(item, Mapping):
            v.fail(where, item, "is not a mapping {key, value, effect}")
            continue
        key = item.get("key")
        if not isinstance(key, str) or not _label_key_ok(key):
            v.fail(f"{where}.key", key if "key" in item else _MISSING, "is not a taint key")
            continue
        value = item.get("value", "")
        value = "" if value is None else str(value)
        effect = item.get("effect")
        if effect not in TAINT_EFFECTS:
            v.fail(f"{where}.effect", effect if "effect" in item else _MISSING,
                   f"is not one of {', '.join(TAINT_EFFECTS)}")
            continue
        out.append(Taint(key=key, value=value, effect=str(effect)))
    return tuple(out)


# --------------------------------------------------------------------------------------------
# Expectations


@dataclass(frozen=True)
class ExpectedUnit:
    """One physical device (a whole GPU or a MIG device) as the node must advertise it."""

    resource: str  # the advertised resource name (after time-slicing rename)
    base_resource: str  # before time-slicing
    gpu_index: int | None  # None: selected by UUID, not knowable from the inventory
    mig_profile: str | None = None
    replicas: int = 1  # > 1: time-sliced into this many device IDs


def _qualify(name: str) -> str:
    return name if "/" in name else f"nvidia.com/{name}"


def _declaration_error(decl: NodeDecl, variable: str, value: object, message: str
                       ) -> InventoryError:
    return InventoryError([Problem(decl.host, variable, value, message)])


def _base_units(decl: NodeDecl) -> list[ExpectedUnit]:
    strategy = decl.mig_strategy
    gpus = decl.mig_gpus or tuple(GpuMig(i, False) for i in range(decl.gpu.count))
    whole = [ExpectedUnit(GPU_RESOURCE, GPU_RESOURCE, g.index) for g in gpus]
    if strategy == "none" or not any(g.mig_enabled for g in gpus):
        return whole
    if strategy == "single":
        disabled = [g.index for g in gpus if not g.mig_enabled]
        empty = [g.index for g in gpus if g.mig_enabled and not g.profiles]
        kinds = sorted({p for g in gpus for p in g.profiles})
        problem = ""
        if disabled:
            problem = f"leaves MIG disabled on GPU(s) {disabled}"
        elif empty:
            problem = f"enables MIG without MIG devices on GPU(s) {empty}"
        elif len(kinds) != 1:
            problem = f"mixes MIG profiles {kinds}"
        if problem:
            raise _declaration_error(
                decl, "gpukit_mig_config", decl.mig_config_name,
                f"{problem}, but device plugin config {decl.plugin_config_name!r} uses "
                "migStrategy single (every GPU in MIG mode with one profile; use mixed)")
        return [ExpectedUnit(GPU_RESOURCE, GPU_RESOURCE, g.index, p)
                for g in gpus for p in g.profiles]
    out: list[ExpectedUnit] = []
    for g in gpus:  # mixed
        if not g.mig_enabled:
            out.append(ExpectedUnit(GPU_RESOURCE, GPU_RESOURCE, g.index))
            continue
        for p in g.profiles:
            out.append(ExpectedUnit(mig_resource_name(p), mig_resource_name(p), g.index, p))
    return out


def expected_units(decl: NodeDecl) -> list[ExpectedUnit]:
    """Every device the node must serve, with its resource and time-slicing replicas."""
    base = _base_units(decl)
    ts = decl.plugin_config.time_slicing
    taken: set[int] = set()  # positions in `base` already shared
    out = list(base)
    var = f"gpukit_device_plugin_configs.{decl.plugin_config_name}.sharing.timeSlicing"
    for i, entry in enumerate(ts.resources):
        name = _qualify(entry.name)
        positions = [j for j, u in enumerate(base) if u.base_resource == name]
        if not positions:
            continue  # like NVIDIA's plugin: sharing for a resource the node does not have
        where = f"{var}.resources[{i}].devices"
        if entry.devices.all:
            chosen = positions
        elif entry.devices.count:
            if entry.devices.count > len(positions):
                raise _declaration_error(decl, where, entry.devices.count,
                                         f"shares more {name} devices than the node has "
                                         f"({len(positions)})")
            chosen = positions[: entry.devices.count]
        else:
            chosen = []
            for ref in entry.devices.refs:
                pick = _pick(base, positions, chosen, ref)
                if pick is None:
                    raise _declaration_error(decl, where, ref,
                                             f"is not a {name} device of this node")
                chosen.append(pick)
        rename = entry.rename or (f"{name}.shared" if ts.rename_by_default else name)
        for j in chosen:
            if j in taken:
                raise _declaration_error(decl, where, list(entry.devices.refs),
                                         "shares a device that another entry already shares")
            taken.add(j)
            u = base[j]
            gpu_index = None if _UUID_REF.match(_ref_of(entry.devices.refs, j, chosen)) else (
                u.gpu_index)
            out[j] = ExpectedUnit(_qualify(rename), name, gpu_index, u.mig_profile,
                                  entry.replicas)
    return out


def _ref_of(refs: Sequence[str], j: int, chosen: list[int]) -> str:
    if not refs or j not in chosen:
        return ""
    pos = chosen.index(j)
    return refs[pos] if pos < len(refs) else ""


def _pick(base: list[ExpectedUnit], positions: list[int], chosen: list[int], ref: str
          ) -> int | None:
    free = [j for j in positions if j not in chosen]
    if ref.isdigit():
        return next((j for j in free if base[j].gpu_index == int(ref)
                     and base[j].mig_profile is None), None)
    if ":" in ref and not _UUID_REF.match(ref):
        gpu_index = int(ref.split(":", 1)[0])
        return next((j for j in free if base[j].gpu_index == gpu_index
                     and base[j].mig_profile is not None), None)
    return free[0] if free else None  # a UUID: which device is unknowable, the count is not


def expected_resources(decl: NodeDecl) -> dict[str, int]:
    """Resource name -> count the node's capacity and allocatable must show."""
    out: dict[str, int] = {}
    for u in expected_units(decl):
        out[u.resource] = out.get(u.resource, 0) + u.replicas
    return dict(sorted(out.items()))


def shared_resources(decl: NodeDecl) -> dict[str, tuple[int, ...]]:
    """Time-sliced resource -> replicas of each of its devices (for spread checks)."""
    out: dict[str, list[int]] = {}
    for u in expected_units(decl):
        if u.replicas > 1:
            out.setdefault(u.resource, []).append(u.replicas)
    return {k: tuple(v) for k, v in sorted(out.items())}


def replicas_per_gpu(decl: NodeDecl, resource: str) -> dict[int, int]:
    """GPU index -> device IDs of `resource` that live on it (replicas summed)."""
    out: dict[int, int] = {}
    for u in expected_units(decl):
        if u.resource == resource and u.gpu_index is not None:
            out[u.gpu_index] = out.get(u.gpu_index, 0) + u.replicas
    return dict(sorted(out.items()))


def label_value(value: object) -> str:
    """A label value as GFD writes it: invalid characters as '-', <= 63 chars."""
    return _INVALID_LABEL_CHARS.sub("-", str(value))[:63].strip("-_.")


def product_value(*parts: str, shared: bool = False) -> str:
    """A product label as GFD writes it (lm/resource.go): each part's invalid characters
    dropped, words joined by '-', then '-SHARED' when time-sliced without rename."""
    words = ["-".join(_INVALID_PRODUCT_CHARS.sub("", p).split()) for p in parts if p]
    return label_value("-".join(words + (["SHARED"] if shared else [])))


def _sharing_of(decl: NodeDecl, resource: str) -> tuple[int, bool]:
    entries = [e for e in decl.plugin_config.time_slicing.resources
               if _qualify(e.name) == resource]
    if not entries:
        return 1, False
    renamed = all(e.rename or decl.plugin_config.time_slicing.rename_by_default
                  for e in entries)
    return max(e.replicas for e in entries), renamed


def expected_labels(decl: NodeDecl) -> dict[str, str]:
    """GFD labels the node must carry (those the declaration determines), name -> value."""
    gpu = decl.gpu
    if gpu.count == 0:
        return {}
    strategy = decl.mig_strategy
    units = _base_units(decl)  # raises for inconsistent declarations
    table = gpu.mig_table
    labels: dict[str, str] = {
        "nvidia.com/mig.capable": "true" if table is not None else "false",
    }
    if decl.driver_branch:
        labels["nvidia.com/cuda.driver-version.major"] = decl.driver_branch
    if strategy != "none":
        labels["nvidia.com/mig.strategy"] = strategy
    mig_on = strategy != "none" and any(g.mig_enabled for g in decl.mig_gpus)
    # GFD labels MIG-enabled GPUs as whole GPUs without sharing (replicas 0, strategy none,
    # under every migStrategy); a GPU with MIG disabled overrides that with its own sharing.
    gpus = decl.mig_gpus or tuple(GpuMig(i, False) for i in range(gpu.count))
    replicas, renamed = (_sharing_of(decl, GPU_RESOURCE)
                         if any(not g.mig_enabled for g in gpus) else (0, False))
    if strategy == "single" and mig_on:
        profile = units[0].mig_profile
        assert profile is not None and table is not None
        labels.update(_mig_labels(decl, GPU_RESOURCE, profile, len(units)))
        return labels
    labels["nvidia.com/gpu.count"] = str(gpu.count)
    labels["nvidia.com/gpu.product"] = product_value(
        gpu.product, shared=replicas > 1 and not renamed)
    labels["nvidia.com/gpu.replicas"] = str(replicas)
    labels["nvidia.com/gpu.sharing-strategy"] = _sharing_strategy(replicas)
    if gpu.memory_mib:
        labels["nvidia.com/gpu.memory"] = str(gpu.memory_mib)
    if mig_on:
        counts = Counter(u.mig_profile for u in units if u.mig_profile)
        for profile, n in sorted(counts.items()):
            assert profile is not None
            labels.update(_mig_labels(decl, mig_resource_name(profile), profile, n))
    return labels


def _sharing_strategy(replicas: int) -> str:
    """Per resource, as GFD: time-slicing only where that resource has several replicas."""
    return "time-slicing" if replicas > 1 else "none"


def _mig_labels(decl: NodeDecl, resource: str, profile: str, count: int) -> dict[str, str]:
    table = decl.gpu.mig_table
    assert table is not None
    p = table.gpu_instance_profile(profile)
    replicas, renamed = _sharing_of(decl, resource)
    values = {
        # GFD names the profile with '+' as '.' (1g.5gb+me -> 1g.5gb.me).
        "product": product_value(decl.gpu.product, "MIG", p.name.replace("+", "."),
                                 shared=replicas > 1 and not renamed),
        "count": str(count),
        "replicas": str(replicas),
        "sharing-strategy": _sharing_strategy(replicas),
        "memory": str(p.memory_mb),
        "multiprocessors": str(p.multiprocessors),
        "slices.gi": str(p.compute_slices),
        "slices.ci": str(p.compute_slices),
    }
    return {f"{resource}.{k}": v for k, v in values.items()}
