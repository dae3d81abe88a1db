"""Small helpers the suite's test modules share."""

from __future__ import annotations

from typing import Any

import pytest

from gpukit import inventory as inv
from gpukit.contracts import node_declaration as nd
from gpukit.contracts.device_ids import strip_replica

from .fill import Seen
from .host import NvmlSeen


def need_decl(suite: Any, node: str) -> inv.NodeDecl:
    decl: inv.NodeDecl | None = suite.decl(node)
    if decl is None:
        pytest.skip(f"node {node}: no --inventory, nothing declared to compare with")
    return decl


def need_expected(suite: Any, node: str) -> dict[str, int]:
    need_decl(suite, node)
    expected: dict[str, int] | None = suite.expected_resources(node)
    if expected is None:
        pytest.fail(f"node {node}: the inventory's declaration is inconsistent: "
                    f"{suite.expectation_error(node)}", pytrace=False)
    return expected


def need_host(suite: Any, node: str) -> None:
    if not suite.options.host_access:
        pytest.skip(f"node {node}: host access is off (--no-host)")


def need_probe(suite: Any, node: str) -> NvmlSeen:
    need_host(suite, node)
    probe: NvmlSeen | None = suite.probe(node)
    if probe is None:
        pytest.fail(f"node {node}: NVML probe over SSH: expected an answer, observed "
                    f"{suite.probe_error(node)}", pytrace=False)
    return probe


# What a CDI spec's container edits set NVIDIA_VISIBLE_DEVICES to (nvidia-ctk's, gpukit's):
# the devices came as CDI device nodes, the runtime is to add none.
CDI_VISIBLE_DEVICES = "void"


def visible_uuids(seen: Seen, probe: NvmlSeen | None) -> list[str]:
    """The devices the container was told about, as UUIDs: NVIDIA_VISIBLE_DEVICES or the
    volume-mounts entries (index IDs mapped through NVML). Injected through CDI (the variable
    `void`), the devices whose nodes it got: a whole GPU by its /dev/nvidia<minor>, a MIG
    device by its capability nodes too (needs NVML on the node)."""
    if seen.env == CDI_VISIBLE_DEVICES and probe is not None:
        return cdi_devices(seen, probe)
    ids = seen.visible
    return [probe.index_to_uuid(i) for i in ids] if probe else ids


def cdi_devices(seen: Seen, probe: NvmlSeen) -> list[str]:
    caps = set(seen.cap_entries)
    out: list[str] = []
    for gpu in probe.readable:
        if f"/dev/nvidia{gpu.minor}" not in seen.gpu_nodes:
            continue
        if gpu.mig_current and gpu.migs:
            out += [m.uuid for m in gpu.migs
                    if m.caps and {f"nvidia-cap{c}" for c in m.caps} <= caps]
        else:
            out.append(gpu.uuid)
    return out


def allocated_units(seen: Seen, probe: NvmlSeen | None) -> list[str]:
    """Physical devices the kubelet gave the container (PodResources, replicas stripped),
    else those the container was told about."""
    if seen.kubelet_ids:
        return sorted({strip_replica(i) for i in seen.kubelet_ids})
    return sorted(set(visible_uuids(seen, probe)))


def lab_mode(suite: Any, node: str) -> bool:
    """The node's NVML is the lab's mock (no real GPU): NVML on the node says so, else --lab."""
    if suite.options.host_access and suite.decl(node) is not None:
        probe = suite.probe(node)
        if probe is not None:
            return bool(probe.mock)
    return bool(suite.options.lab)


def need_node_agent(suite: Any, node: str, check: Any, what: str) -> None:
    """Skip a check of `what` only gpukit's node agent reports where the inventory declares
    another device plugin on the node (gpukit_node_agent: false, NVIDIA's say)."""
    decl = suite.decl(node)
    if decl is not None and not decl.node_agent:
        check.skip(f"gpukit_node_agent false: another device plugin serves the node, and {what}"
                   " is gpukit's node agent's")


def check_declaration_condition(check: Any, node: Any, mismatch: bool, found: str,
                                reporter: str) -> None:
    """The node's GpuDeclarationMismatch condition is True exactly when the suite found a
    `mismatch` (`found` says what it compared); `reporter`: who sets it (the node agent, the
    DRA plugin), named when the condition is absent."""
    want = "True" if mismatch else "False"
    what = f"condition {nd.CONDITION_TYPE}"
    cond = next((c for c in (node.status.conditions or []) if c.type == nd.CONDITION_TYPE),
                None)
    if cond is None:
        check.record(what, f"{want} ({found})", f"absent: the {reporter} reports none", False)
    else:
        check.true(what, cond.status == want, f"{want} ({found})",
                   f"{cond.status} ({cond.reason}: {cond.message})")
