"""The collection's filters: every filter its plugins export is documented as ansible-doc reads
it (plugins/filter/<name>.yml), the documentation matches the filter's arguments, and every
filter the roles and playbooks use exists. The filters are thin adapters: the shared guard
reports a controller without gpukit and turns the library's errors into filter errors."""

from __future__ import annotations

import importlib
import inspect
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
COLLECTIONS = REPO / "collections"
COLLECTION = COLLECTIONS / "ansible_collections/gpukit/gpu"
FILTERS = COLLECTION / "plugins/filter"
BIN = Path(sys.executable).parent
# Where filters are used: the collection's roles and playbooks, the project's playbooks.
USERS = [COLLECTION / "roles", COLLECTION / "playbooks", REPO / "playbooks", REPO / "site.yml"]
FILTER_USE = re.compile(r"\|\s*gpukit\.gpu\.(\w+)")


def _import(plugin: str) -> Any:
    """A filter plugin file, imported as Ansible imports it (ansible_collections is a
    namespace package: the checkout's collections/ joins it)."""
    if str(COLLECTIONS) not in sys.path:
        sys.path.append(str(COLLECTIONS))
    return importlib.import_module(f"ansible_collections.gpukit.gpu.plugins.filter.{plugin}")


@cache
def exported() -> dict[str, tuple[str, Callable[..., Any]]]:
    """Filter name -> (plugin file, function), over every filter plugin file."""
    out: dict[str, tuple[str, Callable[..., Any]]] = {}
    for path in sorted(FILTERS.glob("*.py")):
        for name, func in _import(path.stem).FilterModule().filters().items():
            assert name not in out, f"{name} is exported by {out[name][0]}.py and {path.name}"
            out[name] = (path.stem, func)
    return out


def ansible_doc(*args: str) -> tuple[Any, str]:
    """ansible-doc's JSON answer, and what it said on stderr."""
    env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(COLLECTIONS), "ANSIBLE_NOCOLOR": "1"}
    r = subprocess.run([str(BIN / "ansible-doc"), "-t", "filter", "--json", *args], cwd=REPO,
                       env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    return json.loads(r.stdout or "{}"), r.stderr


@cache
def docs() -> tuple[dict[str, Any], str]:
    """Every exported filter's documentation, read by one ansible-doc run (ansible-doc answers
    nothing when one filter fails: then each filter on its own, to name those at fault)."""
    found, said = ansible_doc(*(f"gpukit.gpu.{n}" for n in exported()))
    if not found:
        for name in exported():
            one, why = ansible_doc(f"gpukit.gpu.{name}")
            found, said = {**found, **one}, said if one else f"{said}{why}"
    return dict(found), said


def doc_of(name: str) -> Any:
    found, said = docs()
    assert f"gpukit.gpu.{name}" in found, said
    return found[f"gpukit.gpu.{name}"]


def used_filters() -> dict[str, list[str]]:
    """Filter name -> files that use it."""
    out: dict[str, list[str]] = {}
    for root in USERS:
        for path in [root] if root.is_file() else sorted(root.rglob("*")):
            if path.suffix in (".yml", ".yaml", ".j2"):
                for name in FILTER_USE.findall(path.read_text()):
                    out.setdefault(name, []).append(str(path.relative_to(REPO)))
    return out


def test_the_plugins_export_the_filters_ansible_lists() -> None:
    assert len(exported()) >= 27
    listed, said = ansible_doc("-l", "gpukit.gpu")
    assert sorted(listed) == sorted(f"gpukit.gpu.{n}" for n in exported()), said
    assert "UNDOCUMENTED" not in json.dumps(listed)


def test_ansible_doc_reads_every_filters_documentation_without_a_complaint() -> None:
    found, said = docs()
    assert "WARNING" not in said and "ERROR" not in said, said
    assert sorted(found) == sorted(f"gpukit.gpu.{n}" for n in exported())


@pytest.mark.parametrize("name", sorted(exported()))
def test_every_filter_is_documented_beside_its_plugin(name: str) -> None:
    entry = doc_of(name)
    doc = entry["doc"]
    assert doc["name"] == name and doc["filename"] == str(FILTERS / f"{name}.yml")
    assert doc["short_description"] and doc["description"] and doc["author"]
    assert f"gpukit.gpu.{name}" in entry["examples"]
    assert entry["return"]["_value"]["description"] and entry["return"]["_value"]["type"]


@pytest.mark.parametrize("name", sorted(exported()))
def test_every_filters_documented_options_are_its_arguments(name: str) -> None:
    """Options: `_input` (the value before the `|`) and the function's other parameters;
    positional: those a call may pass by position; required: those without a default."""
    params = list(inspect.signature(exported()[name][1]).parameters.values())
    doc = doc_of(name)["doc"]
    names = ["_input", *(p.name for p in params[1:])]
    assert sorted(doc["options"]) == sorted(names)
    positional = ["_input", *(p.name for p in params[1:] if p.kind == p.POSITIONAL_OR_KEYWORD)]
    assert [p.strip() for p in doc["positional"].split(",")] == positional
    for param, option in zip(params, names, strict=True):
        required = param.default is inspect.Parameter.empty
        assert bool(doc["options"][option].get("required")) == required, option
        assert doc["options"][option]["description"] and doc["options"][option]["type"], option


def test_every_filter_the_roles_and_playbooks_use_exists() -> None:
    used = used_filters()
    assert {"upgrade_plan", "node_patch", "sharing_finish"} <= set(used)  # the scan reads uses
    missing = {n: files for n, files in used.items() if n not in exported()}
    assert missing == {}


def test_a_declaration_error_is_a_filter_error_naming_the_variable() -> None:
    from ansible.errors import AnsibleFilterError  # type: ignore[import-untyped]

    apt_pin = exported()["apt_pin"][1]
    assert "Pin: version 550.*" in apt_pin("550")
    with pytest.raises(AnsibleFilterError, match="nvidia_driver_kernel_modules: 'bogus'"):
        apt_pin("550", kernel_modules="bogus")


def test_a_controller_without_gpukit_gets_a_filter_error_saying_what_to_do() -> None:
    # A separate interpreter in which gpukit cannot be imported (None in sys.modules).
    probe = (
        "import sys; sys.modules['gpukit'] = None; sys.path.append(sys.argv[1]);"
        "from ansible_collections.gpukit.gpu.plugins.filter import driver;"
        "from ansible.errors import AnsibleFilterError\n"
        "try:\n    driver.apt_pin('550')\nexcept AnsibleFilterError as e:\n    print(e)"
    )
    r = subprocess.run([sys.executable, "-c", probe, str(COLLECTIONS)], capture_output=True,
                       text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "gpukit is not importable on the controller" in r.stdout
    assert "run ansible-playbook from gpukit's environment" in r.stdout
