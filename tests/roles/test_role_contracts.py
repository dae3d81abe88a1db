"""The roles' YAML held to the library: choices in the argument specs equal the constants the
library validates the same variables with, every `nvidia.com/` and `gpukit.io/` name the role
YAML spells is one of gpukit.contracts.label_names, the upgrade states and the skip value are
gpukit.provision.upgrade's, and each role spells its Kubernetes API access (delegation, Python,
kubeconfig) once, in tasks/k8s_api.yml, through which every API task runs (roles/README.md)."""

from __future__ import annotations

import importlib
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
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
    ("device_plugin", "device_plugin_metrics_auth"): (
        "gpukit.contracts.metrics_auth:MODES",
    ),
    ("gpu_quotas", "gpu_quotas_priority_classes.preemption_policy"): (
        "gpukit.inventory.quotas:PREEMPTION_POLICIES",
    ),
    ("gpu_telemetry", "gpu_telemetry_prometheus"): ("gpukit.inventory.metrics:PROMETHEUS_MODES",),
    ("gpu_telemetry", "gpu_telemetry_operator_scrape"): ("gpukit.telemetry_manifests:MODES",),
    ("gpu_telemetry", "gpu_telemetry_auth"): (
        "gpukit.contracts.metrics_auth:MODES",
    ),
    ("node_labels", "node_labels_gpu_allocation"): (
        "gpukit.inventory.model:GPU_ALLOCATIONS", "gpukit.provision.nodes:GPU_ALLOCATIONS",
    ),
    ("node_labels", "node_labels_taints.effect"): (
        "gpukit.inventory:TAINT_EFFECTS", "gpukit.provision.nodes:EFFECTS",
    ),
    ("nvidia_driver", "nvidia_driver_activation"): ("gpukit.provision.driver_reload:POLICIES",),
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


# --- Kubernetes access: spelled once per role, in tasks/k8s_api.yml; every API task runs
# through it. The API steps are the role's tasks/api_*.yml files: k8s_api.yml imports the one
# an import of it names in <role>_api_tasks, and they include only each other.

API_WRAPPER = "k8s_api.yml"
IMPORTS = ("ansible.builtin.import_tasks", "ansible.builtin.include_tasks")
ROLE_INCLUDES = ("ansible.builtin.include_role", "ansible.builtin.import_role")


def k8s_action_group() -> set[str]:
    """The modules of kubernetes.core's action group k8s, from the installed collection."""
    roots = [REPO / "collections", *map(Path, sys.path)]
    for root in roots:
        runtime = root / "ansible_collections/kubernetes/core/meta/runtime.yml"
        if runtime.is_file():
            return set(yaml.safe_load(runtime.read_text())["action_groups"]["k8s"])
    raise AssertionError(f"kubernetes.core is not installed under any of {roots}")


def api_wrapper(role: str) -> list[dict[str, Any]]:
    """What tasks/k8s_api.yml holds, task names left out: the role's own variables."""
    return [{
        "module_defaults": {K8S_GROUP: {"kubeconfig": f"{{{{ {role}_kubeconfig | default(omit, true) }}}}"}},
        "delegate_to": f"{{{{ {role}_k8s_host }}}}",
        "vars": {"ansible_python_interpreter": f"{{{{ {role}_k8s_python }}}}"},
        "block": [{"ansible.builtin.import_tasks": f"{{{{ {role}_api_tasks }}}}"}],
    }]  # fmt: skip


def without_names(tasks: Any) -> Any:
    if isinstance(tasks, list):
        return [without_names(t) for t in tasks]
    if isinstance(tasks, dict):
        return {k: without_names(v) for k, v in tasks.items() if k != "name"}
    return tasks


def all_tasks(tasks: list[dict[str, Any]] | None) -> Iterator[dict[str, Any]]:
    """Every task and block, blocks' contents included."""
    for task in tasks or []:
        yield task
        for key in ("block", "rescue", "always"):
            yield from all_tasks(task.get(key))


def header_keys(task: dict[str, Any]) -> list[str]:
    """The parts of the API access header a task or block spells."""
    found = [k for k in ("module_defaults",) if K8S_GROUP in (task.get(k) or {})]
    found += [k for k in ("delegate_to",) if "_k8s_host" in str(task.get(k, ""))]
    python = str((task.get("vars") or {}).get("ansible_python_interpreter", ""))
    found += ["ansible_python_interpreter"] if "_k8s_python" in python else []
    return found


def imported(task: dict[str, Any]) -> tuple[str, str] | None:
    """(action, file) of a task that imports or includes a tasks file of its role."""
    for action in IMPORTS:
        if action in task:
            arg = task[action]
            return action, arg["file"] if isinstance(arg, dict) else arg
    return None


def api_access_problems(roles: Path) -> tuple[list[str], int]:
    """What breaks the rule above in the roles under `roles`, and how many kubernetes.core
    tasks were seen."""
    group = k8s_action_group()
    problems: list[str] = []
    api_tasks = 0
    for role_dir in sorted(p for p in roles.iterdir() if (p / "tasks").is_dir()):
        role = role_dir.name
        files = {p.name: yaml.safe_load(p.read_text()) or []
                 for p in sorted((role_dir / "tasks").glob("*.yml"))}  # fmt: skip
        handlers = {f"../handlers/{p.name}": yaml.safe_load(p.read_text()) or []
                    for p in sorted((role_dir / "handlers").glob("*.yml"))}  # fmt: skip
        steps: set[str] = set()  # the api_*.yml files k8s_api.yml is told to import
        edges: list[tuple[str, str]] = []  # (file, file it imports or includes)
        for name, tasks in {**files, **handlers}.items():
            where = f"{role}/tasks/{name}"
            for task in all_tasks(tasks):
                label = f"{where} '{task.get('name', '?')}'"
                if name != API_WRAPPER and (keys := header_keys(task)):
                    problems.append(f"{label}: sets {', '.join(keys)} itself; the role's API"
                                    f" access is spelled once, in tasks/{API_WRAPPER}")  # fmt: skip
                target = imported(task)
                if target is None or "{{" in target[1]:
                    continue
                edges.append((name, target[1]))
                if target[1] == API_WRAPPER:
                    step = (task.get("vars") or {}).get(f"{role}_api_tasks")
                    named = step in files and str(step).startswith("api_")
                    if target[0] != "ansible.builtin.import_tasks" or not named:
                        problems.append(f"{label}: imports {API_WRAPPER} with {role}_api_tasks"
                                        f" {step!r}: import_tasks naming a tasks/api_*.yml")  # fmt: skip
                    else:
                        steps.add(step)
        if API_WRAPPER in files and without_names(files[API_WRAPPER]) != api_wrapper(role):
            problems.append(f"{role}/tasks/{API_WRAPPER}: expected {api_wrapper(role)}")
        # The API files: the steps and what they include, never reached from anywhere else.
        api_files, grow = set(steps), True
        while grow:
            more = {b for a, b in edges if a in api_files} - api_files
            api_files |= more
            grow = bool(more)
        for a, b in edges:
            if b in api_files and a not in api_files:
                problems.append(f"{role}/tasks/{a}: reaches {b} without {API_WRAPPER}")
        for name in sorted(set(files) | api_files):
            if (name in api_files) != name.startswith("api_"):
                state = "runs through" if name in api_files else "is not reached through"
                problems.append(f"{role}/tasks/{name}: {state} {API_WRAPPER}: name it"
                                f" {'api_*.yml' if name in api_files else 'otherwise'}")  # fmt: skip
        if API_WRAPPER not in files and api_files:
            problems.append(f"{role}: imports {API_WRAPPER}, which it lacks")
        for name, tasks in {**files, **handlers}.items():
            for task in all_tasks(tasks):
                label = f"{role}/tasks/{name} '{task.get('name', '?')}'"
                if name in api_files and any(k in task for k in ROLE_INCLUDES):
                    problems.append(f"{label}: a role included in an API step would run on the"
                                    " API host")  # fmt: skip
                module = next((k for k in task if k.startswith("kubernetes.core.")), None)
                if module is None:
                    continue
                api_tasks += 1
                own = [k for k in ("delegate_to",) if k in task]
                own += [k for k in ("kubeconfig",) if k in (task[module] or {})]
                own += [k for k in ("ansible_python_interpreter",) if k in (task.get("vars") or {})]
                if own:
                    problems.append(f"{label}: sets {', '.join(own)} itself")
                if module.removeprefix("kubernetes.core.") not in group:
                    problems.append(f"{label}: {module} is not in kubernetes.core's action"
                                    f" group k8s {sorted(group)}: module_defaults miss it")  # fmt: skip
                if name not in api_files:
                    problems.append(f"{label}: outside the API steps ({API_WRAPPER} imports"
                                    " tasks/api_*.yml)")  # fmt: skip
    return problems, api_tasks


def test_kubernetes_api_access_is_spelled_once_per_role() -> None:
    problems, api_tasks = api_access_problems(ROLES)
    assert not problems, "\n".join(problems)
    assert api_tasks >= 20, f"only {api_tasks} kubernetes.core tasks found: the walk is broken"
    wrappers = sorted(p.parent.parent.name for p in ROLES.glob(f"*/tasks/{API_WRAPPER}"))
    assert wrappers == ["container_toolkit", "device_plugin", "gpu_quotas", "gpu_telemetry", "node_labels",
                        "rolling_upgrade"], wrappers  # fmt: skip


COPIED_HEADER = """
- name: Read the node again through the Kubernetes API
  module_defaults:
    group/kubernetes.core.k8s:
      kubeconfig: "{{ node_labels_kubeconfig | default(omit, true) }}"
  delegate_to: "{{ node_labels_k8s_host }}"
  vars:
    ansible_python_interpreter: "{{ node_labels_k8s_python }}"
  block:
    - name: Read the node again
      kubernetes.core.k8s_info:
        kind: Node
"""


@pytest.mark.parametrize(("file", "added", "needle"), [
    ("node_labels/tasks/main.yml", COPIED_HEADER,
     "node_labels/tasks/main.yml 'Read the node again through the Kubernetes API': sets"
     " module_defaults, delegate_to, ansible_python_interpreter itself"),
    ("node_labels/tasks/main.yml",
     "\n- name: Read the node\n  delegate_to: '{{ node_labels_k8s_host }}'\n"
     "  kubernetes.core.k8s_info:\n    kind: Node\n",
     "node_labels/tasks/main.yml 'Read the node': outside the API steps"),
    ("rolling_upgrade/tasks/main.yml",
     "\n- name: Mark the node done\n  ansible.builtin.include_tasks: api_state.yml\n",
     "rolling_upgrade/tasks/main.yml: reaches api_state.yml without k8s_api.yml"),
    ("device_plugin/tasks/main.yml",
     "\n- name: Watch\n  ansible.builtin.import_tasks: k8s_api.yml\n"
     "  vars:\n    device_plugin_api_tasks: host.yml\n",
     "device_plugin/tasks/main.yml 'Watch': imports k8s_api.yml with device_plugin_api_tasks"
     " 'host.yml'"),
])  # fmt: skip
def test_a_copied_or_bypassed_api_header_is_found(
    tmp_path: Path, file: str, added: str, needle: str
) -> None:
    roles = tmp_path / "roles"
    shutil.copytree(ROLES, roles)
    path = roles / file
    path.write_text(path.read_text() + added)
    problems, _ = api_access_problems(roles)
    assert any(p.startswith(needle) for p in problems), "\n".join(problems)


# Applied client-side on purpose: kubernetes.core reports a server-side apply of objects whose
# status moves (the DaemonSets) as a change (the task's comment says why).
CLIENT_SIDE = {"device_plugin/tasks/api_apply.yml"}


def test_every_apply_is_server_side_as_gpukit() -> None:
    """Each object a role puts in the cluster is applied server-side as the one field manager
    gpukit.k8s.objects.FIELD_MANAGER (what the Python side applies as too), but the agent's
    objects (CLIENT_SIDE; a GitOps tool co-owns them without conflict: test_site_lab)."""
    from gpukit.k8s.objects import FIELD_MANAGER

    applies, problems = 0, []
    for path in sorted(ROLES.glob("*/tasks/*.yml")):
        if str(path.relative_to(ROLES)) in CLIENT_SIDE:
            continue
        for task in all_tasks(yaml.safe_load(path.read_text()) or []):
            args = task.get("kubernetes.core.k8s")
            if not isinstance(args, dict) or args.get("state", "present") != "present":
                continue
            applies += 1
            ssa = args.get("server_side_apply") or {}
            if args.get("apply") is not True or ssa.get("field_manager") != FIELD_MANAGER:
                problems.append(f"{path.relative_to(ROLES)}: {task.get('name')!r}: "
                                f"apply {args.get('apply')!r}, server_side_apply {ssa!r}")
    assert applies >= 7 and not problems, "\n".join(problems)
