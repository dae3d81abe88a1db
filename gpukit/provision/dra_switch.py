"""Moving a node between the device plugin and DRA (`gpukit_gpu_allocation`), with the node
drained of GPU pods: what the kubelet and the Node object keep of the device plugin, and how
it is cleared.

- The kubelet's device manager checkpoint keeps a gone plugin's allocations (pods long gone)
  and, while it does, takes nvidia.com/gpu for a device plugin resource: a pod DRA serves
  through the DeviceClass's extended resource fails ("endpoint not found in cache for a
  registered resource"), across kubelet restarts. It is removed with the kubelet stopped.
- The node's status keeps the nvidia.com/ extended resources (the kubelet no longer manages
  them once the checkpoint is gone): the scheduler would place pods through the stale count.
  They are removed from capacity and allocatable, as Kubernetes documents removing an
  extended resource (a JSON patch of the node's status).
- The node keeps the node agent's labels (GFD's counts, replicas, product): removed too.

Leaving DRA: no claim may stay prepared or allocated on the node (prepared: in gpukit's DRA
checkpoint, or in checkpoint.json beside it, an earlier gpukit's or NVIDIA's DRA driver's), and
the node's ResourceSlices of driver gpu.nvidia.com go (the DRA plugin's pod has left, so
nothing writes them again).

In place (site.yml) only while no pod holds the node's GPUs (`switch_refusal`); the rolling
upgrade (playbooks/upgrade.yml) drains the node first and names the change
(`allocation_change`). The role's tasks: roles/device_plugin/tasks/allocation_switch.yml.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from gpukit.contracts import dra as names
from gpukit.contracts import dra_checkpoint as nvidia
from gpukit.contracts.label_names import GPU_ALLOCATION, RESOURCE_PREFIX
from gpukit.inventory.model import GPU_ALLOCATIONS
from gpukit.plugin.labels import owned as labeler_owns

KUBELET_DEVICE_PLUGIN_CHECKPOINT = "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"
PREFIX = RESOURCE_PREFIX


def checkpoint_holds_device_plugin_resources(text: str) -> list[str]:
    """The nvidia.com/ resources the kubelet's device manager checkpoint still allocates or
    registers ('' or a file that is not JSON: none, nothing to clear)."""
    try:
        doc = json.loads(text) if text.strip() else {}
    except ValueError:
        return []
    data = doc.get("Data") or {} if isinstance(doc, Mapping) else {}
    found = {str(e.get("ResourceName", "")) for e in data.get("PodDeviceEntries") or []
             if isinstance(e, Mapping)}
    found |= {str(r) for r in (data.get("RegisteredDevices") or {})}
    return sorted(r for r in found if r.startswith(PREFIX))


def stale_resources(status: Mapping[str, Any]) -> list[str]:
    """The nvidia.com/ extended resources a node's status still lists (capacity or
    allocatable): none may stay on a DRA node."""
    names = set(status.get("capacity") or {}) | set(status.get("allocatable") or {})
    return sorted(n for n in names if n.startswith(PREFIX))


def status_patch(status: Mapping[str, Any]) -> list[dict[str, str]]:
    """The JSON patch (RFC 6902, '/' escaped as '~1') removing every nvidia.com/ resource
    from the node's capacity and allocatable: empty when there is nothing to remove."""
    return [{"op": "remove", "path": f"/status/{field}/{_pointer(name)}"}
            for field in ("capacity", "allocatable")
            for name in sorted(status.get(field) or {}) if name.startswith(PREFIX)]


def reported_since(node: Mapping[str, Any], since: str) -> bool:
    """The kubelet reported the node's status after `since` (RFC 3339): its Ready condition's
    heartbeat is later, so its resources are the restarted kubelet's view, not an older one's."""
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready" and cond.get("lastHeartbeatTime"):
            return _time(str(cond["lastHeartbeatTime"])) > _time(since)
    return False


def _time(stamp: str) -> datetime:
    t = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    return t if t.tzinfo else t.replace(tzinfo=UTC)  # the play's stamps are UTC


def _pointer(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


# -- which mode the node is in, and whether it may be switched now ----------------------------

DEVICE_PLUGIN, DRA = GPU_ALLOCATIONS
# The DRA plugin's own checkpoint of the claims it prepared on the node, and checkpoint.json
# beside it: an earlier gpukit's (not moved yet) or NVIDIA's DRA driver's; the role reads both.
DRA_PLUGIN_CHECKPOINT = f"{names.PLUGIN_DIR}/{names.GPUKIT_CHECKPOINT_FILE}"
DRA_CHECKPOINTS = (DRA_PLUGIN_CHECKPOINT, f"{names.PLUGIN_DIR}/{names.CHECKPOINT_FILE}")
DRA_DRIVER = names.DRIVER
UPGRADE_PLAYBOOK = "playbooks/upgrade.yml"


def current_allocation(node: Mapping[str, Any] | None) -> str:
    """The mode the node was last set to (its gpukit.io/gpu.allocation label): a node gpukit
    never labelled was served by the device plugin, the only mode before DRA."""
    labels = ((node or {}).get("metadata") or {}).get("labels") or {}
    return str(labels.get(GPU_ALLOCATION) or DEVICE_PLUGIN)


def allocation_change(node: Mapping[str, Any] | None, declared: str) -> str | None:
    """'GPU allocation <old> -> <new>' when the declared mode differs from the node's (a node
    not registered yet has no mode to leave: None)."""
    if not node:
        return None
    old = current_allocation(node)
    return None if old == declared else f"GPU allocation {old} -> {declared}"


def gpu_pods(pods: Sequence[Mapping[str, Any]]) -> list[str]:
    """'namespace/name (what it holds)' of the pods not finished that hold GPUs: nvidia.com/
    resources in a container's requests or limits, or ResourceClaims."""
    out = []
    for pod in pods:
        if ((pod.get("status") or {}).get("phase")) in ("Succeeded", "Failed"):
            continue
        spec = pod.get("spec") or {}
        held = sorted({name for c in [*(spec.get("initContainers") or []),
                                      *(spec.get("containers") or [])]
                       for part in ("requests", "limits")
                       for name in ((c.get("resources") or {}).get(part) or {})
                       if str(name).startswith(PREFIX)})
        held += [f"claim {c.get('name')}" for c in spec.get("resourceClaims") or []]
        if held:
            meta = pod.get("metadata") or {}
            out.append(f"{meta.get('namespace')}/{meta.get('name')} ({', '.join(held)})")
    return sorted(out)


def switch_refusal(node_name: str, node: Mapping[str, Any] | None, declared: str,
                   pods: Sequence[Mapping[str, Any]]) -> str:
    """Why the node may not be switched to `declared` in place ('' when it may): pods hold
    its GPUs through the API it leaves. The rolling upgrade drains the node first."""
    change = allocation_change(node, declared)
    running = gpu_pods(pods)
    if not change or not running:
        return ""
    return (f"node {node_name}: {change} refused while GPU pods run on it: "
            f"{'; '.join(running)}. Switch it with {UPGRADE_PLAYBOOK}, which drains the node "
            "first (or stop these pods and run again)")


# -- leaving DRA -------------------------------------------------------------------------------


def prepared_claims(checkpoint_text: str, where: str = DRA_PLUGIN_CHECKPOINT) -> list[str]:
    """'namespace/name' of the claims a DRA checkpoint still holds prepared ('' or no file:
    none): gpukit's format, or NVIDIA's (its completed claims). A file that is neither is
    reported as such, not guessed."""
    if not checkpoint_text.strip():
        return []
    unreadable = [f"(unreadable {where})"]
    try:
        doc = json.loads(checkpoint_text)
        if nvidia.looks_like_nvidia(doc):
            completed = nvidia.parse(checkpoint_text, where).completed()
            return sorted(f"{c.namespace}/{c.name}" if c.name else f"(uid {uid} in {where})"
                          for uid, c in completed.items())
        claims = doc["claims"]
        return sorted(f"{c['namespace']}/{c['name']}" for c in claims.values())
    except nvidia.NvidiaCheckpointError:
        return unreadable
    except (ValueError, KeyError, TypeError, AttributeError):
        return unreadable


def claims_left(checkpoint_texts: str | Sequence[str],
                claims: Sequence[Mapping[str, Any]] | None, node_name: str) -> list[str]:
    """What holds a DRA node's GPUs: the claims its checkpoints (the texts of DRA_CHECKPOINTS,
    in that order; one text: gpukit's file) hold prepared that still exist (an entry of a claim
    deleted while the plugin was down is stale: it must not refuse the switch for good), and
    those the API allocates on the node for a pod. `claims` None: the API was not asked, every
    prepared entry counts."""
    texts = [checkpoint_texts] if isinstance(checkpoint_texts, str) else list(checkpoint_texts)
    prepared = {c for text, where in zip(texts, DRA_CHECKPOINTS, strict=False)
                for c in prepared_claims(text or "", where)}
    if claims is None:
        return sorted(prepared)
    existing = {f"{(c.get('metadata') or {}).get('namespace')}/"
                f"{(c.get('metadata') or {}).get('name')}" for c in claims}
    prepared = {c for c in prepared if c in existing or c.startswith("(")}
    return sorted(prepared | set(allocated_claims(claims, node_name)))


def allocated_claims(claims: Sequence[Mapping[str, Any]], node_name: str) -> list[str]:
    """'namespace/name' of the ResourceClaims allocated a device of the node's pool (driver
    gpu.nvidia.com) and still reserved for a pod: the pod would lose its GPU."""
    out = []
    for claim in claims:
        status = claim.get("status") or {}
        results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
        if status.get("reservedFor") and any(
                r.get("driver") == DRA_DRIVER and r.get("pool") == node_name for r in results):
            meta = claim.get("metadata") or {}
            out.append(f"{meta.get('namespace')}/{meta.get('name')}")
    return sorted(out)


# -- what a switch would do, in words (check mode) ---------------------------------------------


def switch_actions(declared: str, *, checkpoint: Sequence[str] = (),
                   node: Mapping[str, Any] | None = None,
                   slices: Sequence[Mapping[str, Any]] = ()) -> list[str]:
    """What switching the node to `declared` clears, given what the kubelet's device plugin
    checkpoint holds (`checkpoint_holds_device_plugin_resources`), the Node (status, labels)
    and its ResourceSlices of driver gpu.nvidia.com: empty when nothing is left of the other
    mode."""
    if declared == DRA:
        out = []
        if checkpoint:
            out.append("restart the kubelet without its device plugin checkpoint "
                       f"({', '.join(checkpoint)})")
        stale = stale_resources((node or {}).get("status") or {})
        if stale:
            out.append(f"remove {', '.join(stale)} from the node's status")
        labels = stale_labels(((node or {}).get("metadata") or {}).get("labels") or {})
        if labels:
            out.append(f"remove the node agent's {len(labels)} labels ({labels[0]}, ...)")
        return out
    names_ = sorted(str((s.get("metadata") or {}).get("name")) for s in slices)
    return [f"delete the ResourceSlices {', '.join(names_)}"] if names_ else []


def stale_labels(labels: Mapping[str, str]) -> list[str]:
    """The node agent's labels (GFD's: counts, replicas, product, driver versions, ...) a node
    keeps once its agent has left: none applies on a DRA node, and readers would take the
    stale counts for what the node serves (the conformance suite's label checks did)."""
    return sorted(name for name in labels if labeler_owns(name))


def clear_device_plugin(core: Any, node_name: str, *, dry_run: bool = False
                        ) -> dict[str, list[str]]:
    """Remove what the device plugin left on the Node through the API (`core`: a CoreV1Api)
    unless `dry_run`: every nvidia.com/ resource of its status (a JSON patch of the status
    subresource, which the kubernetes.core modules cannot send) and the node agent's labels.
    What it removes (or would): {"resources": [...], "labels": [...]}."""
    node = core.api_client.sanitize_for_serialization(core.read_node_status(node_name))
    status = node.get("status") or {}
    labels = stale_labels((node.get("metadata") or {}).get("labels") or {})
    patch = status_patch(status)
    if patch and not dry_run:
        core.patch_node_status(node_name, patch)
    if labels and not dry_run:
        core.patch_node(node_name, {"metadata": {"labels": dict.fromkeys(labels)}})
    return {"resources": stale_resources(status), "labels": labels}
