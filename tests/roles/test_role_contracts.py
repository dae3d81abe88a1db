"""The roles' YAML held to the library: choices in the argument specs equal the constants the
library validates the same variables with, every `nvidia.com/` and `gpukit.io/` name the role
YAML spells is one of gpukit.contracts.label_names, the upgrade states and the skip value are
gpukit.provision.upgrade's, and every Kubernetes API task gets its delegation, Python and
kubeconfig from an enclosing block that sets them once (roles/README.md)."""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from gpukit.contracts import label_names
from gpukit.provision import upgrade

REPO = Path(__file__).resolve().parents[2]
COLLECTION = REPO / "collections/ansible_collections/gpukit/gpu"
ROLES = COLLECTION / "roles"
ROLE_YAML = sorted(
    [*ROLES.glob("*/**/*.yml"), *ROLES.glob("*/**/*.j2"), *(COLLECTION / "playbooks").glob("*.yml"),
     *(REPO / "playbooks").glob("*.yml"), REPO / "site.yml"]
)  # fmt: skip

# (role, option path) -> where the library keeps the same choices: "module:ATTRIBUTE", every
# module that validates the variable (the argument spec must agree with each of them).
LIBRARY_CHOICES: dict[tuple[str, str], tuple[str, ...]] = {
    ("container_toolkit", "container_toolkit_runtime"): ("gpukit.inventory:RUNTIMES",),
    ("container_toolkit", "container_toolkit_containerd_mode"): (
        "gpukit.provision.runtime_plan:CONTAINERD_MODES",
    ),
    ("device_plugin", "device_plugin_image_pull_policy"): ("gpukit.provision.agent:PULL_POLICIES",),
    ("device_plugin", "device_plugin_gpu_allocation"): ("gpukit.inventory.model:GPU_ALLOCATIONS",),
    ("gpu_quotas", "gpu_quotas_priority_classes.preemption_policy"): (
        "gpukit.inventory.quotas:PREEMPTION_POLICIES",
    ),
    ("gpu_telemetry", "gpu_telemetry_prometheus"): ("gpukit.inventory.metrics:PROMETHEUS_MODES",),
    ("gpu_telemetry", "gpu_telemetry_operator_scrape"): ("gpukit.telemetry_manifests:MODES",),
    ("node_labels", "node_labels_gpu_allocation"): (
        "gpukit.inventory.model:GPU_ALLOCATIONS", "gpukit.provision.nodes:GPU_ALLOCATIONS",
    ),
    ("node_labels", "node_labels_taints.effect"): (
        "gpukit.inventory:TAINT_EFFECTS", "gpukit.provision.nodes:EFFECTS",
    ),
    ("nvidia_driver", "nvidia_driver_kernel_modules"): (
        "gpukit.inventory:KERNEL_MODULES", "gpukit.provision.driver:FLAVOURS",
    ),
    ("nvidia_driver", "nvidia_driver_channel"): ("gpukit.provision.driver:CHANNELS",),
    ("rolling_upgrade", "rolling_upgrade_gpu_allocation"): ("gpukit.inventory.model:GPU_ALLOCATIONS",),
}
# Choices only the role acts on (its tasks branch on them; no library code reads them).
ROLE_ONLY_CHOICES = {
    ("device_plugin", "device_plugin_mode"),  # which task file: daemonset.yml or host.yml
    ("nvidia_driver", "nvidia_driver_initramfs"),  # whether the role runs update-initramfs
    ("nvidia_driver", "nvidia_driver_reboot"),  # whether the role may reboot the node
}

K8S_GROUP = "group/kubernetes.core.k8s"


def library_values(where: str) -> set[str]:
    module_name, attribute = where.split(":")
    module = importlib.import_module(module_name)
    assert hasattr(module, attribute), (
        f"{where} is gone: update LIBRARY_CHOICES in {Path(__file__).name} to where the library"
        " now validates the variable"
    )
    value = getattr(module, attribute)
    if attribute == "CHANNELS":  # the channel table: (family, channel) -> Channel
        return {channel.name for channel in value.values()}
    return set(value)


def spec_choices() -> Iterator[tuple[str, str, str, list[Any]]]:
    """(role, entry point, option path, choices) for every option with choices, suboptions
    included."""

    def walk(options: dict[str, Any], prefix: str) -> Iterator[tuple[str, list[Any]]]:
        for name, spec in (options or {}).items():
            if "choices" in spec:
                yield prefix + name, spec["choices"]
            yield from walk(spec.get("options") or {}, f"{prefix}{name}.")

    for path in sorted(ROLES.glob("*/meta/argument_specs.yml")):
        role = path.parent.parent.name
        for entry, spec in yaml.safe_load(path.read_text())["argument_specs"].items():
            for option, choices in walk(spec.get("options") or {}, ""):
                yield role, entry, option, choices


def test_argument_spec_choices_equal_the_librarys() -> None:
    found = {(role, option) for role, _, option, _ in spec_choices()}
    assert found, "no choices found in the argument specs: the walk is broken"
    unclassified = found - LIBRARY_CHOICES.keys() - ROLE_ONLY_CHOICES
    assert not unclassified, (
        f"choices with no library counterpart named in {Path(__file__).name}:"
        f" {sorted(unclassified)} (name the library constant that validates them, or list them"
        " as role-only)"
    )
    stale = (LIBRARY_CHOICES.keys() | ROLE_ONLY_CHOICES) - found
    assert not stale, f"no argument spec has choices for {sorted(stale)} any more"
    problems = [
        f"roles/{role}/meta/argument_specs.yml {entry}.{option}: choices {choices}, but {where}"
        f" has {sorted(library_values(where))}"
        for role, entry, option, choices in spec_choices()
        for where in LIBRARY_CHOICES.get((role, option), ())
        if set(choices) != library_values(where) or len(set(choices)) != len(choices)
    ]  # fmt: skip
    assert not problems, "\n".join(problems)


# A label-like name, not a host name: `download.nvidia.com/compute` is no label.
LABEL_LITERAL = re.compile(r"(?<![\w.-])(?:nvidia\.com|gpukit\.io)/[A-Za-z0-9._-]*")


def known_names() -> set[str]:
    names = {v for k, v in vars(label_names).items() if k.isupper() and isinstance(v, str)}
    names = {v for v in names if v.startswith(("nvidia.com/", "gpukit.io/"))}
    # A bare prefix (`nvidia.com/`, e.g. "resources named nvidia.com/*") names no label.
    return names | {f"{label_names.PREFIX}/", f"{label_names.GPUKIT_PREFIX}/"}


def test_label_names_in_role_yaml_are_the_librarys() -> None:
    known = known_names()
    seen: set[str] = set()
    problems = []
    for path in ROLE_YAML:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for name in LABEL_LITERAL.findall(line):
                seen.add(name)
                if name not in known:
                    problems.append(f"{path.relative_to(REPO)}:{number}: {name} is not a name in"
                                    " gpukit/contracts/label_names.py")  # fmt: skip
    assert not problems, "\n".join(problems)
    # The scan itself works: the roles do write these.
    assert {label_names.DEVICE_PLUGIN_CONFIG, label_names.UPGRADE_STATE} <= seen


def test_upgrade_states_and_skip_value_are_the_librarys() -> None:
    files = sorted((ROLES / "rolling_upgrade/tasks").glob("*.yml"))
    tasks = "\n".join(p.read_text() for p in files)
    states = set(re.findall(r"^\s*rolling_upgrade_state: (\S+)$", tasks, re.MULTILINE))
    assert states == set(upgrade.STATES), f"states the role writes: {sorted(states)}"
    skip = re.compile(re.escape(f".get('{label_names.UPGRADE}')") + r"\s*==\s*'([^']*)'")
    values = skip.findall(tasks.replace("\n", " "))
    assert values and set(values) == {upgrade.SKIP_VALUE}, f"skip values compared: {values}"


# --- Kubernetes access: one block per run of API tasks sets delegation, Python, kubeconfig.


def k8s_action_group() -> set[str]:
    """The modules of kubernetes.core's action group k8s, from the installed collection."""
    roots = [REPO / "collections", *map(Path, sys.path)]
    for root in roots:
        runtime = root / "ansible_collections/kubernetes/core/meta/runtime.yml"
        if runtime.is_file():
            return set(yaml.safe_load(runtime.read_text())["action_groups"]["k8s"])
    raise AssertionError(f"kubernetes.core is not installed under any of {roots}")


def api_block(role: str) -> dict[str, Any]:
    """What the block around a role's API tasks sets: its own role variables."""
    kubeconfig = f"{{{{ {role}_kubeconfig | default(omit, true) }}}}"
    return {
        "module_defaults": {K8S_GROUP: {"kubeconfig": kubeconfig}},
        "delegate_to": f"{{{{ {role}_k8s_host }}}}",
        "interpreter": f"{{{{ {role}_k8s_python }}}}",
    }


def tasks_with_context(
    tasks: list[dict[str, Any]], inside: dict[str, Any] | None = None
) -> Iterator[tuple[dict[str, Any], dict[str, Any] | None]]:
    """Every task, with the innermost enclosing block that sets up API access (or None)."""
    for task in tasks or []:
        if any(k in task for k in ("block", "rescue", "always")):
            here = inside
            if K8S_GROUP in (task.get("module_defaults") or {}):
                here = {
                    "module_defaults": task["module_defaults"],
                    "delegate_to": task.get("delegate_to"),
                    "interpreter": (task.get("vars") or {}).get("ansible_python_interpreter"),
                }
            for key in ("block", "rescue", "always"):
                yield from tasks_with_context(task.get(key) or [], here)
        else:
            yield task, inside


def role_task_files() -> Iterator[tuple[str, Path]]:
    for path in sorted(ROLES.glob("*/tasks/*.yml")) + sorted(ROLES.glob("*/handlers/*.yml")):
        yield path.parent.parent.name, path


def test_kubernetes_api_tasks_get_their_access_from_their_block() -> None:
    group = k8s_action_group()
    problems, api_tasks = [], 0
    for role, path in role_task_files():
        where = path.relative_to(ROLES)
        for task, block in tasks_with_context(yaml.safe_load(path.read_text()) or []):
            module = next((k for k in task if k.startswith("kubernetes.core.")), None)
            name = task.get("name", "?")
            if module is None:
                if block is not None and any(k in task for k in (
                        "ansible.builtin.include_role", "ansible.builtin.import_role")):
                    problems.append(f"{where} '{name}': a role included inside an API block would"
                                    " run on the API host")  # fmt: skip
                continue
            api_tasks += 1
            own = [k for k in ("delegate_to",) if k in task]
            own += [k for k in ("kubeconfig",) if k in (task[module] or {})]
            own += [k for k in ("ansible_python_interpreter",) if k in (task.get("vars") or {})]
            if own:
                problems.append(f"{where} '{name}': sets {', '.join(own)} itself")
            if module.removeprefix("kubernetes.core.") not in group:
                problems.append(f"{where} '{name}': {module} is not in kubernetes.core's"
                                f" action group k8s {sorted(group)}: module_defaults miss it")
            if block is None:
                problems.append(f"{where} '{name}': outside a block that sets up API access")
            elif block != api_block(role):
                problems.append(
                    f"{where} '{name}': its block sets {block}, expected {api_block(role)}"
                )
    assert not problems, "\n".join(problems)
    assert api_tasks >= 20, f"only {api_tasks} kubernetes.core tasks found: the walk is broken"
