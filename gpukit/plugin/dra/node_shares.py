"""How many claims may share each of this node's devices: the node's label gpukit.io/dra.shares
(the inventory's gpukit_dra_shares, set by the node_labels role; gpukit.contracts.dra has the
bounds). Read from the node at every rescan, so a relabelled node republishes its devices."""

from __future__ import annotations

import logging
from typing import Any

from kubernetes.client import CoreV1Api

from gpukit.contracts.dra import MAX_SHARES, MIN_SHARES
from gpukit.contracts.label_names import DRA_SHARES

log = logging.getLogger(__name__)


def parse_shares(value: str | None, node: str) -> int:
    """The label's value as a share count (0: not shared); ValueError naming node, label and
    value for anything but an integer from MIN_SHARES to MAX_SHARES."""
    if value is None or value == "":
        return 0
    if not value.isdigit() or not MIN_SHARES <= int(value) <= MAX_SHARES:
        raise ValueError(f"node {node}: label {DRA_SHARES}={value!r} is not an integer from "
                         f"{MIN_SHARES} to {MAX_SHARES}: devices published unshared")
    return int(value)


def read_node_shares(api_client: Any, node: str, last: int) -> int:
    """The node's share count now; `last` when the API cannot say (the devices do not flap
    between shared and not while the API is away), 0 for a bad label (logged)."""
    try:
        labels = CoreV1Api(api_client).read_node(node).metadata.labels or {}
    except Exception as exc:  # the API is away: keep what was published
        log.debug("node %s: reading label %s: %s", node, DRA_SHARES, exc)
        return last
    try:
        shares = parse_shares(labels.get(DRA_SHARES), node)
    except ValueError as exc:  # the preflight refuses such a declaration: someone set it by hand
        log.error("%s", exc)
        return 0
    if shares != last:
        log.info("node %s: %s", node, f"each device shared by up to {shares} claims"
                 if shares else "devices not shared")
    return shares
