"""The whole inventory checked on the controller, connecting to nothing: what the playbooks'
preflight (the gpukit.gpu.inventory_check action) runs. A declaration is valid when every host
validates (validate.node_from_vars) and the suite's oracle (gpukit.conformance.expect) can say
what each node must serve."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .load import load
from .model import GpuInventory, NodeDecl
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
    # What a node must serve is the suite's oracle's to say (one computation for the suite,
    # the preflight and the roles' waits); it imports only this model and the contracts.
    from gpukit.conformance.expect import expected_labels, expected_resources

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


def expected_resources(decl: NodeDecl) -> dict[str, int]:
    """Resource -> count `decl`'s node must serve: gpukit.conformance.expect's, for callers
    that know the model only (`gpukit inventory check`, the roles' expected_resources filter
    through gpukit.provision.play_inputs)."""
    from gpukit.conformance.expect import expected_resources as oracle

    return oracle(decl)


def expected_labels(decl: NodeDecl) -> dict[str, str]:
    """The labels `decl`'s node must carry: gpukit.conformance.expect's (as above)."""
    from gpukit.conformance.expect import expected_labels as oracle

    return oracle(decl)
