"""The dependency picture of ARCHITECTURE.md, held by the code: imports only go down.

    contracts  <-  k8s (API access)  <-  plugin (node agent)
    plugin  <-  agent_manifests, provision, inventory  <-  cli
    contracts  <-  mig (MIG planning, no NVML)  <-  plugin, provision, inventory
    contracts, inventory (the model's types)  <-  conformance.expect (the oracle)
    inventory, conformance.expect  <-  inventory.check (the declaration check)  <-  provision, cli
    oracle  <-  conformance (the suite; restates the agent's rules itself)
    lab: may use everything; nothing in the product imports it

Every import of every module is read, those inside functions too, so a lazy import cannot
slip past. The few crossings the design allows are listed below with their reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOTS = {"gpukit": REPO / "gpukit"}

# Which parts of gpukit each part may import (its own part always).
ALLOWED: dict[str, set[str]] = {
    "gpukit.contracts": set(),
    # MIG planning without NVML (placement, planner, state, a declared layout).
    "gpukit.mig": {"gpukit.contracts"},
    # Kubernetes access (API client, apply, waits) for every program that talks to the API.
    "gpukit.k8s": {"gpukit.contracts"},
    # `gpukit` alone: the package root's __version__.
    "gpukit.plugin": {"gpukit.contracts", "gpukit.k8s", "gpukit.mig", "gpukit"},
    # The suite reads the declaration model and speaks the kubelet's published PodResources
    # API (stubs generated from gpukit/plugin/api); never the agent's builders.
    "gpukit.conformance": {"gpukit.contracts", "gpukit.k8s", "gpukit.inventory",
                           "gpukit.plugin.api"},
    # The suite's oracle: what a node must serve, from the declaration's types alone. It sits
    # between the model and the declaration check, which hands its answers to the preflight,
    # `gpukit inventory check` and the roles' waits (ORACLE_USERS: who may import it).
    "gpukit.conformance.expect": {"gpukit.contracts", "gpukit.inventory.model",
                                  "gpukit.inventory.problems"},
    "gpukit.agent_manifests": {"gpukit.contracts", "gpukit.plugin"},
    # Alert rules and the dashboard (package data) over the agent's metrics; the Prometheus
    # operator's objects for them (PodMonitor, ServiceMonitor, PrometheusRule).
    "gpukit.monitoring": set(),
    "gpukit.telemetry_manifests": {"gpukit.agent_manifests", "gpukit.contracts",
                                   "gpukit.monitoring"},
    # The model refuses what the roles would through the rules both share below them
    # (contracts.nvidia_driver, contracts.runtime_hardening), never through provisioning.
    "gpukit.inventory": {"gpukit.contracts", "gpukit.mig"},
    # The declaration check: the model's validation and the oracle's answers for every host.
    "gpukit.inventory.check": {"gpukit.contracts", "gpukit.inventory", "gpukit.conformance.expect"},
    "gpukit.provision": {"gpukit.contracts", "gpukit.mig", "gpukit.plugin",
                         "gpukit.agent_manifests", "gpukit.inventory", "gpukit"},
    # The telemetry role's Prometheus config carries the shipped alert rules (and the scraper's
    # token where the agents review it: contracts.metrics_auth).
    "gpukit.provision.telemetry": {"gpukit.contracts", "gpukit.agent_manifests",
                                   "gpukit.inventory", "gpukit",
                                   "gpukit.provision", "gpukit.monitoring",
                                   "gpukit.telemetry_manifests"},
    "gpukit.manifests": {"gpukit.contracts", "gpukit.inventory", "gpukit.provision"},
    "gpukit.summary": {"gpukit"},
}
# Crossings allowed by name: (importing module, imported module) -> why.
EXCEPTIONS = {
    ("gpukit.conformance.suite", "gpukit.lab.config"):
        "`--lab N` finds the lab's inventory (imported only when the option is given)",
    ("gpukit.conformance.suite", "gpukit.lab.inventory"): "as above",
    ("gpukit.conformance.suite", "gpukit.lab.pytest_provider"):
        "`--lab N` brings the lab up (imported only when the option is given)",
}
# Who may import the DRA kubelet plugin from outside the agent: the command line's `gpukit dra`
# starts it. Everyone else reads NVIDIA's DRA contract from gpukit.contracts.dra.
DRA_PLUGIN = "gpukit.plugin.dra"
DRA_PLUGIN_USERS = {"gpukit.cli"}
# Who may import the oracle besides the suite (and the unrestricted lab and CLI): the one
# module where the model meets it.
ORACLE = "gpukit.conformance.expect"
ORACLE_USERS = {"gpukit.inventory.check"}
# Parts whose imports are not restricted: the command line and the lab sit on top.
UNRESTRICTED = {"gpukit.cli", "gpukit.__main__", "gpukit.lab", "gpukit"}


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package, root in ROOTS.items():
        for path in root.rglob("*.py"):
            rel = path.relative_to(root)
            if any(p.startswith(".") or p in {"build", "gen"} for p in rel.parts):
                continue
            parts = [*package.split("."), *rel.with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _imports(module: str, path: Path, known: set[str] | None = None) -> set[str]:
    """The gpukit modules `module` imports (with `known`: `from mod import name` as mod)."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")[: len(module.split(".")) - node.level + is_package]
                base = ".".join([*anchor, base] if base else anchor)
            # `from pkg import mod` imports pkg.mod where mod is a module; `from mod import
            # name` is judged as mod (crossings() strips what is not a module).
            out.update(f"{base}.{a.name}" for a in node.names)
    found = {i for i in out if i == "gpukit" or i.startswith("gpukit.")}
    if known is None:
        return found
    return {i if i in known or i.rpartition(".")[0] not in known else i.rpartition(".")[0]
            for i in found}


def _part(module: str) -> str:
    """The entry of ALLOWED/UNRESTRICTED a module belongs to (the longest prefix)."""
    keys = sorted({*ALLOWED, *UNRESTRICTED} - {"gpukit"}, key=len, reverse=True)
    for k in keys:
        if module == k or module.startswith(k + "."):
            return k
    return "gpukit"


def _within(target: str, parts: set[str]) -> bool:
    if target == "gpukit":
        return "gpukit" in parts
    return any(target == p or target.startswith(p + ".") for p in parts - {"gpukit"}) or (
        # `from gpukit import __version__`: an attribute of the root, not a part.
        "gpukit" in parts and target.count(".") == 1 and target.split(".")[1].startswith("_"))


def crossings() -> list[str]:
    modules = _modules()
    known = set(modules)
    bad = []
    for module, path in sorted(modules.items()):
        part = _part(module)
        if part in UNRESTRICTED:
            continue
        for target in sorted(_imports(module, path, known)):
            if _within(target, {part}) or _within(target, ALLOWED[part]):
                continue
            if (module, target) in EXCEPTIONS:
                continue
            bad.append(f"{module} imports {target} ({part} may import only "
                       f"{sorted(ALLOWED[part]) or 'nothing else of gpukit'})")
    return bad


def test_imports_go_down_only() -> None:
    assert crossings() == []


def part_edges(modules: dict[str, Path]) -> set[tuple[str, str]]:
    """(part, part) for every import between two parts (ALLOWED's keys); a package importing
    its own submodules (a face re-exporting what lies inside it) is no edge."""
    known = set(modules)
    edges = set()
    for module, path in modules.items():
        for target in _imports(module, path, known):
            if target.startswith(module + "."):
                continue
            a, b = _part(module), _part(target)
            if a != b:
                edges.add((a, b))
    return edges


def mutual(edges: set[tuple[str, str]]) -> list[tuple[str, str]]:
    return sorted((a, b) for a, b in edges if a < b and (b, a) in edges)


def dra_plugin_importers(modules: dict[str, Path]) -> list[str]:
    known = set(modules)
    return sorted(f"{m} imports {t}" for m, p in modules.items()
                  for t in _imports(m, p, known)
                  if (t == DRA_PLUGIN or t.startswith(DRA_PLUGIN + "."))
                  and not m.startswith("gpukit.plugin.") and m not in DRA_PLUGIN_USERS)


def test_no_two_parts_import_each_other() -> None:
    # The table could allow both directions and every import still pass it: read the graph.
    assert mutual(part_edges(_modules())) == []
    allowed_both = sorted((a, b) for a in ALLOWED for b in ALLOWED[a]
                          if a < b and b in ALLOWED and a in ALLOWED[b])
    assert allowed_both == []


def test_the_dra_plugin_is_imported_only_inside_the_agent() -> None:
    assert dra_plugin_importers(_modules()) == []


def test_the_loop_and_dra_checks_see_a_planted_import(tmp_path: Path) -> None:
    # Each rule would pass on a scan that finds nothing: plant a violation into a copy of
    # the real module set and see it named.
    modules = dict(_modules())
    back = tmp_path / "back.py"
    back.write_text("from gpukit.provision import driver\n")
    modules["gpukit.inventory.back"] = back
    assert ("gpukit.inventory", "gpukit.provision") in mutual(part_edges(modules))
    core = tmp_path / "core.py"
    core.write_text("def f():\n    from gpukit.plugin.dra import slices\n")
    modules["gpukit.provision.core"] = core
    assert dra_plugin_importers(modules) == [
        "gpukit.provision.core imports gpukit.plugin.dra.slices"]


def test_every_module_belongs_to_a_part() -> None:
    # A new top-level module must be placed in the picture, not default to "anything goes".
    stray = [m for m in _modules() if _part(m) == "gpukit" and m != "gpukit"]
    assert stray == []


def test_the_check_sees_a_crossing(tmp_path: Path) -> None:
    # The test would pass on an empty scan; prove it reads imports and judges them.
    path = tmp_path / "bad.py"
    path.write_text("def f():\n    from gpukit.plugin import nvml\n")
    assert "gpukit.plugin.nvml" in _imports("gpukit.contracts.bad", path)
    assert not _within("gpukit.plugin.nvml", ALLOWED["gpukit.contracts"])
    assert _within("gpukit.contracts.label_names", ALLOWED["gpukit.plugin"])
    assert not _within("gpukit.lab.agent", ALLOWED["gpukit.conformance"])


def test_the_oracle_reads_only_declarations() -> None:
    # conformance may speak the kubelet's API and Kubernetes; its oracle may not even do that.
    modules = _modules()
    path = modules["gpukit.conformance.expect"]
    reads = _imports("gpukit.conformance.expect", path, set(modules))
    assert reads and not [m for m in reads
                          if not _within(m, {"gpukit.inventory", "gpukit.contracts"})]


def test_exceptions_are_still_needed() -> None:
    # An allowed crossing that no longer happens is removed from the list, not kept "just in case".
    modules = _modules()
    used = {(m, t) for m, p in modules.items() for t in _imports(m, p, set(modules))}
    assert sorted(k for k in EXCEPTIONS if k not in used) == []


def test_only_the_suite_and_the_declaration_check_ask_the_oracle() -> None:
    # The model itself never does: the oracle is a layer above it, not a crossing.
    modules = _modules()
    askers = {m for m, p in modules.items() if ORACLE in _imports(m, p, set(modules))}
    assert askers, "the oracle is asked by no one: the scan is wrong"
    assert sorted(m for m in askers if _part(m) not in {"gpukit.conformance", *UNRESTRICTED}
                  and m not in ORACLE_USERS) == []
    assert askers >= ORACLE_USERS


def test_the_model_does_not_reach_the_oracle_through_its_own_package() -> None:
    # The declaration check is inside the model's package: the prefix rule alone would let a
    # model module import it (and through it the oracle). Only the package's face may.
    modules = _modules()
    for module, path in modules.items():
        if _part(module) == "gpukit.inventory" and module != "gpukit.inventory":
            reads = _imports(module, path, set(modules))
            assert not [t for t in reads if _part(t) == "gpukit.inventory.check"], module
