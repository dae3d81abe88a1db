"""The whole inventory checked on the controller, connecting to nothing: what the playbooks'
preflight (the gpukit.gpu.inventory_check action) and `gpukit inventory check` run."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .expect import expected_labels, expected_resources
from .load import load
from .model import GpuInventory
from .problems import InventoryError, Problem


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

