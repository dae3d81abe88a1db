"""The whole inventory checked on the controller, connecting to nothing: what the playbooks'
preflight (the gpukit.gpu.inventory_check action) and `gpukit inventory check` run. A
declaration is valid when every host validates (validate.node_from_vars) and the suite's oracle
(gpukit.conformance.expect) can say what each node must serve.

This module is the one place where the model meets the oracle: a layer of its own above both
(ARCHITECTURE.md, tests/unit/test_import_direction.py). The oracle reads only the model's
types; the rest of the model never imports the oracle."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpukit.conformance import expect

from . import quotas
from .load import load
from .model import GpuInventory, NodeDecl
from .problems import InventoryError, Problem, merged


@dataclass(frozen=True)
class CheckResult:
    """What `check` found: the inventory (None when it could not be loaded), what each node
    must serve and carry, and every problem."""

    inventory: GpuInventory | None
    resources: Mapping[str, Mapping[str, int]]  # node name -> resource -> count
    problems: tuple[Problem, ...]
    labels: Mapping[str, Mapping[str, str]] | None = None  # node name -> GFD label -> value


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
    labels: dict[str, Mapping[str, str]] = {}
    for decl in gpus.nodes:
        try:
            resources[decl.node_name] = expected_resources(decl)
            labels[decl.node_name] = expected_labels(decl)
        except InventoryError as exc:
            problems += exc.problems
    if not problems:  # GPU quotas name resources some node serves
        served = {r for counts in resources.values() for r, n in counts.items() if n}
        problems += quotas.served_problems(gpus.tenancy, served)
    return CheckResult(gpus, resources, tuple(merged(problems)), labels)


def expected_resources(decl: NodeDecl) -> dict[str, int]:
    """Resource -> count `decl`'s node must serve: the suite's oracle's (one computation for
    the suite, the preflight and the roles' waits)."""
    return expect.expected_resources(decl)


def expected_dra_devices(decl: NodeDecl) -> list[dict[str, Any]]:
    """The ResourceSlice devices a DRA node must publish (none on a device plugin node), as
    plain values (a fact travels so): the oracle's `expected_dra_devices`."""
    return [{"type": d.type, "gpu_index": d.gpu_index, "profile": d.profile,
             "name_pattern": d.name_pattern, "attributes": d.attributes(),
             "capacity": d.capacity()} for d in expect.expected_dra_devices(decl)]


def expected_labels(decl: NodeDecl) -> dict[str, str]:
    """The labels `decl`'s node must carry: the suite's oracle's (as above)."""
    return expect.expected_labels(decl)
