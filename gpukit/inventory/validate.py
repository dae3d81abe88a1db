"""One host's declaration validated: merged variables (plain Python values) in, a NodeDecl or
every problem of the host out. `node_from_vars` is the one entry every caller uses (loading an
inventory, the preflight, the roles' filters)."""

from __future__ import annotations

import contextlib
import contextvars
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from gpukit.contracts import dra_dynamic_mig as dynamic_mig
from gpukit.contracts import mig_parted
from gpukit.contracts import runtime_hardening as toolkit_config
from gpukit.contracts.dra import MAX_SHARES, MIN_SHARES
from gpukit.contracts.mig_parted import MigConfigEntry
from gpukit.contracts.nvidia_driver import DriverSpec, DriverSpecError
from gpukit.contracts.plugin_config import Config, ConfigError, parse_config, require_content
from gpukit.mig import declared

from . import metrics, node_meta
from .model import (
    DEFAULT_GPU_ALLOCATION,
    GPU_ALLOCATIONS,
    KERNEL_MODULES,
    RUNTIMES,
    VARIABLES,
    GpuDecl,
    GpuMig,
    NodeDecl,
    Taint,
)
from .problems import MISSING, InventoryError, Problem

# More GPUs than any server holds (16 in the largest HGX boards) is a typo, never a node: refused
# before the roles or the suite would plan for it.
MAX_GPUS_PER_NODE = 64
_BRANCH = re.compile(r"^\d{3,4}$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


class _Vars:
    """Typed reads of one host's variables, collecting problems."""

    def __init__(self, host: str | None, raw: Mapping[str, Any]) -> None:
        self.host = host
        self.raw = raw
        self.problems: list[Problem] = []

    def fail(self, variable: str, value: object, message: str) -> None:
        self.problems.append(Problem(self.host, variable, value, message))

    def get(self, name: str) -> Any:
        return self.raw.get(name, MISSING)

    def string(self, name: str, value: Any, default: str | None = None,
               choices: Sequence[str] | None = None) -> str | None:
        if value is MISSING or value is None:
            return default
        if not isinstance(value, str) or not value:
            self.fail(name, value, "is not a non-empty string")
            return default
        if choices is not None and value not in choices:
            self.fail(name, value, f"is not one of {', '.join(choices)}")
            return default
        return value

    def integer(self, name: str, value: Any, minimum: int, maximum: int | None = None
                ) -> int | None:
        wanted = (f"is not an integer >= {minimum}" if maximum is None
                  else f"is not an integer from {minimum} to {maximum}")
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(name, value, wanted)
            return None
        if value < minimum or (maximum is not None and value > maximum):
            self.fail(name, value, wanted)
            return None
        return value

    def mapping(self, name: str, value: Any) -> Mapping[str, Any] | None:
        if value is MISSING or value is None:
            return None
        if not isinstance(value, Mapping):
            self.fail(name, value, f"is not a mapping (got {type(value).__name__})")
            return None
        return value


def _runtime_hardening(v: _Vars, configs: Mapping[str, Any]) -> None:
    """The runtime refuses NVIDIA_VISIBLE_DEVICES from unprivileged containers unless the
    declaration opts out: a plugin config that passes devices only that way cannot work."""
    accept = v.get(toolkit_config.OPT_OUT_VARIABLE)
    if accept is MISSING or accept is None:
        accept = False
    if not isinstance(accept, bool):
        v.fail(toolkit_config.OPT_OUT_VARIABLE, accept, "is not true or false")
        return
    if accept:
        return
    refused = {p.variable for p in v.problems}
    for name, strategies, why in toolkit_config.unhardened_configs(configs):
        variable = f"{toolkit_config.CONFIGS_VARIABLE}.{name}"
        if any(r == variable or r.startswith(variable + ".") for r in refused):
            continue  # refused already for what it is
        v.fail(variable, ",".join(strategies), why)


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
    if branch_raw is not MISSING and branch_raw is not None:
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
    _runtime_hardening(v, configs)
    mig_name, layout, mig_gpus = _mig_layout(v, gpu)
    labels = _labels(v)
    taints = _taints(v)
    kubeconfig = v.string("gpukit_kubeconfig", v.get("gpukit_kubeconfig"))
    allocation = v.string("gpukit_gpu_allocation", v.get("gpukit_gpu_allocation"),
                          default=DEFAULT_GPU_ALLOCATION, choices=GPU_ALLOCATIONS)
    dra_shares = _dra_shares(v, allocation)
    dynamic = _dra_dynamic_mig(v, allocation, gpu, mig_gpus)
    node_agent = v.get("gpukit_node_agent")
    if node_agent is MISSING or node_agent is None:
        node_agent = True
    elif not isinstance(node_agent, bool):
        v.fail("gpukit_node_agent", node_agent, "is not true or false")
    address = v.get("ansible_host")
    served, metric_problems = metrics.declared(host, raw)
    v.problems += metric_problems
    if v.problems:
        raise InventoryError(v.problems)
    assert gpu is not None
    return NodeDecl(
        host=host, node_name=node_name, gpu=gpu,
        address=str(address) if address not in (None, MISSING) else None,
        driver_branch=branch, driver_version=version, kernel_modules=modules,
        container_runtime=runtime,
        plugin_config_name=config_name, plugin_config=config, plugin_configs=configs,
        mig_config_name=mig_name,
        mig_layout=layout, mig_gpus=mig_gpus, labels=labels, taints=taints,
        kubeconfig=kubeconfig, metrics=served,
        gpu_allocation=allocation or DEFAULT_GPU_ALLOCATION, dra_shares=dra_shares,
        dra_dynamic_mig=dynamic,
        node_agent=bool(node_agent),
        declared={k: raw[k] for k in VARIABLES if raw.get(k, MISSING) is not MISSING},
    )


def _dra_shares(v: _Vars, allocation: str | None) -> int | None:
    """`gpukit_dra_shares`: how many claims may share each of a DRA node's devices (null or
    absent: not shared); a device plugin node shares through its plugin config instead."""
    name = "gpukit_dra_shares"
    raw = v.get(name)
    if raw is MISSING or raw is None:
        return None
    shares = v.integer(name, raw, MIN_SHARES, MAX_SHARES)
    if shares is not None and allocation != "dra":
        v.fail(name, raw, "shares DRA devices: it needs gpukit_gpu_allocation dra (this node "
                          f"is on {allocation or DEFAULT_GPU_ALLOCATION}; the device plugin "
                          "shares through gpukit_device_plugin_config)")
        return None
    return shares


def _dra_dynamic_mig(v: _Vars, allocation: str | None, gpu: GpuDecl | None,
                     mig_gpus: tuple[GpuMig, ...]) -> tuple[dynamic_mig.DynamicGpu, ...]:
    """`gpukit_dra_dynamic_mig`: a DRA node's GPUs carved into MIG devices on demand. Each GPU
    index must be the node's, each profile its product's; a GPU the selected static layout
    enables MIG on is refused (the MIG manager would skip it, and the node would not serve
    what the layout declares)."""
    name = dynamic_mig.VARIABLE
    raw = v.get(name)
    if raw is MISSING or raw is None or raw == {}:
        return ()
    if allocation != "dra":
        v.fail(name, raw, "carves MIG devices through DRA: it needs gpukit_gpu_allocation dra "
                          f"(this node is on {allocation or DEFAULT_GPU_ALLOCATION})")
        return ()
    if gpu is None:
        return ()
    try:
        gpus = dynamic_mig.parse(raw, gpu.product, gpu.count, name)
    except dynamic_mig.DynamicMigError as exc:
        field, _, message = str(exc).partition(": ")
        v.fail(field, MISSING, message)
        return ()
    static = {g.index for g in mig_gpus if g.mig_enabled}
    for g in gpus:
        if g.index in static:
            v.fail(f"{name}.{g.index}", MISSING, f"GPU {g.index} is carved on demand, but "
                   "gpukit_mig_config enables MIG on it: select the other GPUs by index in "
                   "that layout")
    return gpus


def sharing(
    plugin_configs: Any, plugin_config: str | None, mig_configs: Any, mig_config: str | None
) -> tuple[str | None, Config, tuple[MigConfigEntry, ...] | None, list[Problem]]:
    """A host's sharing declarations checked as `node_from_vars` checks them, without its GPUs
    (the gpu_sharing role is handed these four variables only): the selected device plugin
    config's name and parse, the selected MIG layout's entries, every problem."""
    v = _Vars(None, {"gpukit_device_plugin_configs": plugin_configs,
                     "gpukit_device_plugin_config": plugin_config,
                     "gpukit_mig_configs": mig_configs, "gpukit_mig_config": mig_config})
    name, config, _ = _plugin_config(v)
    _, layout, _ = _mig_layout(v, None)
    return name, config, layout, v.problems


def _driver_version(v: _Vars, branch: str | None, branch_raw: Any) -> str | None:
    """`nvidia_driver_version`, validated as the nvidia_driver role does (DriverSpec); empty or
    null is the role's default: the newest of the branch, nothing pinned."""
    name = "nvidia_driver_version"
    raw = v.get(name)
    if raw is MISSING or raw is None or raw == "":
        return None
    if isinstance(raw, float):  # YAML reads an unquoted 550.90 as 550.9
        v.fail(name, raw, 'is a number, not a driver version: quote it, e.g. "550.90.07"')
        return None
    if not isinstance(raw, str):
        v.fail(name, raw, 'is not a driver version such as "550.90.07"')
        return None
    if branch is None:
        if branch_raw is MISSING or branch_raw is None:  # a bad branch is reported already
            v.fail(name, raw, "pins a version without nvidia_driver_branch (the role pins it "
                   "within the branch; declare both)")
        return None
    try:
        DriverSpec(branch=branch, version=raw)
    except DriverSpecError as exc:
        # The role's message names the variable and quotes the value already.
        v.fail(name, MISSING, str(exc).partition(": ")[2])
        return None
    return raw


def _gpu(v: _Vars) -> GpuDecl | None:
    raw = v.get("gpukit_gpu")
    if raw is MISSING or raw is None:
        v.fail("gpukit_gpu", MISSING, "is not set: declare the node's GPUs as "
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
        v.fail("gpukit_gpu.product", product if "product" in doc else MISSING,
               "is not a product name such as 'NVIDIA A100-SXM4-40GB'")
        product = None
    count = v.integer("gpukit_gpu.count", doc.get("count", MISSING), 0, MAX_GPUS_PER_NODE)
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
            parsed[str(cname)] = _parsed_config(doc)
        except ConfigError as exc:
            for problem in exc.problems:
                path, _, message = problem.partition(": ")
                # The config parser's messages already quote the offending value.
                v.fail(var if path == "<root>" else f"{var}.{path}", MISSING, message)
    name = v.string("gpukit_device_plugin_config", v.get("gpukit_device_plugin_config"))
    selected = name is not None  # else the one config serves the node, unlabelled
    if name is None:
        if len(configs) != 1:
            return None, Config(), declared
        name = str(next(iter(configs)))
    if name not in configs:
        known = ", ".join(sorted(configs)) or "none declared in gpukit_device_plugin_configs"
        v.fail("gpukit_device_plugin_config", name, f"is not a named config (known: {known})")
        return name, Config(), declared
    if selected:
        _label_value(v, "gpukit_device_plugin_config", name)
    return name, parsed.get(name, Config()), declared


# Named configs come from group_vars, the same content for every host of a group: while an
# inventory is loaded (`configs_parsed_once`), each distinct content is parsed once, not once
# per host (500 hosts with 3 shared configs were 1500 parses). Keyed by the content's JSON
# (configs are plain YAML values); outside a load every call parses.
_PARSED: contextvars.ContextVar[dict[str, Config | tuple[str, ...]] | None] = (
    contextvars.ContextVar("gpukit_parsed_configs", default=None))


@contextlib.contextmanager
def configs_parsed_once() -> Iterator[None]:
    token = _PARSED.set({})
    try:
        yield
    finally:
        _PARSED.reset(token)


def _parsed_config(doc: Mapping[str, Any]) -> Config:
    cache = _PARSED.get()
    try:
        key = json.dumps(doc, sort_keys=True) if cache is not None else ""
    except (TypeError, ValueError):  # not plain JSON values: parse it as it is
        key = ""
    got = cache.get(key) if cache is not None and key else None
    if got is None:
        try:
            got = parse_config(require_content(dict(doc)))
        except ConfigError as exc:
            got = tuple(exc.problems)
        if cache is not None and key:
            cache[key] = got
    if isinstance(got, tuple):
        raise ConfigError(got)
    return got


def _label_value(v: _Vars, variable: str, name: str) -> None:
    """A selected config's name is the value of the node's selection label (node_labels)."""
    if p := node_meta.value_problem(variable, name, name):
        v.fail(p.variable, p.value, p.message)


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
    _label_value(v, "gpukit_mig_config", name)
    try:
        entries = mig_parted.parse({name: configs[name]}).select(name)
    except mig_parted.MigConfigError as exc:
        for problem in exc.problems:
            path, _, message = problem.partition(": ")
            # The schema's messages already quote the offending value.
            v.fail(_mig_var(path), MISSING, _mig_var(message))
        return name, None, no_mig
    if gpu is None:
        return name, entries, ()
    gpus, problems = declared.layout_gpus(entries, gpu.product, gpu.count)
    for p in problems:
        v.fail(_mig_var(p.path), p.value, _mig_var(p.message))
    return name, entries, gpus


def _labels(v: _Vars) -> dict[str, str]:
    labels, problems = node_meta.parse_labels(v.get("gpukit_node_labels"))
    v.problems += [Problem(v.host, p.variable, p.value, p.message) for p in problems]
    return labels


def _taints(v: _Vars) -> tuple[Taint, ...]:
    taints, problems = node_meta.parse_taints(v.get("gpukit_node_taints"))
    v.problems += [Problem(v.host, p.variable, p.value, p.message) for p in problems]
    return taints
