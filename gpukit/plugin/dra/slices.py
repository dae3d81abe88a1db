"""This node's ResourceSlices: one pool named after the node, published and kept current.

`SlicePublisher.sync(devices)` makes the API hold exactly `devices` for driver gpu.nvidia.com
on this node: slices of at most 128 devices (64 once a device has taints: the API's limits)
named `<node>-gpu.nvidia.com-<i>`, every slice of a pool carrying the pool's generation, bumped
on each change so the scheduler never mixes an old slice with a new one. Slices of this node
and driver it did not write (an earlier agent's, or another layout's) are deleted; slices
someone else changed or removed (the kubelet wipes a driver's slices some time after its plugin
went away) are written again.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from gpukit.contracts.dra import DRIVER, MAX_TAINTED_DEVICES_PER_SLICE

log = logging.getLogger(__name__)

API_VERSION = "resource.k8s.io/v1"
MAX_DEVICES_PER_SLICE = 128
FIELD_MANAGER = "gpukit-dra"


def slice_name(node: str, index: int) -> str:
    return f"{node}-{DRIVER}-{index}"


def desired_slices(node: str, devices: Sequence[Mapping[str, Any]], generation: int,
                   counter_sets: Sequence[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
    """The slices for `devices` (API form) at `generation`; one empty slice for no devices,
    so the pool still says "nothing here" rather than vanishing. `counter_sets` (dynamic MIG,
    KEP-4815): each in a slice of its own, first (a slice holds devices or sharedCounters,
    never both); devices consuming counters or tainted go at most 64 to a slice."""
    limited = any(d.get("taints") or d.get("consumesCounters") for d in devices)
    size = MAX_TAINTED_DEVICES_PER_SLICE if limited else MAX_DEVICES_PER_SLICE
    chunks = [list(devices[i:i + size]) for i in range(0, len(devices), size)] or [[]]
    specs: list[dict[str, Any]] = [{"sharedCounters": [dict(c)]} for c in counter_sets]
    specs += [{"devices": chunk} for chunk in chunks]
    return [{
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {"name": slice_name(node, i),
                     "labels": {"app.kubernetes.io/managed-by": FIELD_MANAGER}},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": len(specs)},
            **content,
        },
    } for i, content in enumerate(specs)]


def _device_view(device: Mapping[str, Any]) -> dict[str, Any]:
    """The fields gpukit sets on a device (the API may add defaults to others, and sets a
    taint's timeAdded)."""
    return {"name": device.get("name"), "attributes": device.get("attributes") or {},
            "capacity": {k: {"value": v.get("value"), "requestPolicy": v.get("requestPolicy")}
                         for k, v in (device.get("capacity") or {}).items()},
            "allowMultipleAllocations": bool(device.get("allowMultipleAllocations")),
            "consumesCounters": device.get("consumesCounters") or [],
            "taints": [{k: t.get(k) for k in ("key", "value", "effect")}
                       for t in device.get("taints") or []]}


def same_content(api_slices: Sequence[Mapping[str, Any]], wanted: Sequence[Mapping[str, Any]]
                 ) -> bool:
    """The API's slices are the wanted ones (names, pool, devices), whatever generation."""
    def view(s: Mapping[str, Any]) -> tuple[str, str, str, int, str]:
        spec = s.get("spec") or {}
        pool = spec.get("pool") or {}
        devices = [_device_view(d) for d in spec.get("devices") or []]
        counters = spec.get("sharedCounters") or []
        return (s["metadata"]["name"], str(spec.get("nodeName")), str(pool.get("name")),
                int(pool.get("resourceSliceCount", 0)),
                json.dumps([devices, counters], sort_keys=True))
    gens = {int((s.get("spec") or {}).get("pool", {}).get("generation", 0)) for s in api_slices}
    return len(gens) <= 1 and sorted(map(view, api_slices)) == sorted(map(view, wanted))


class SlicePublisher:
    def __init__(self, api_client: Any, node: str, api: Any = None) -> None:
        self.api = api if api is not None else client.ResourceV1Api(api_client)
        self.node = node
        self.generation = 0

    def current(self) -> list[dict[str, Any]]:
        """This node's slices of driver gpu.nvidia.com, as the API has them."""
        resp = self.api.list_resource_slice(
            field_selector=f"spec.nodeName={self.node},spec.driver={DRIVER}",
            _preload_content=False)
        items: list[dict[str, Any]] = json.loads(resp.data).get("items") or []
        return items

    def sync(self, devices: Sequence[Mapping[str, Any]],
             counter_sets: Sequence[Mapping[str, Any]] = ()) -> bool:
        """Make the API hold `devices` (and the dynamic MIG GPUs' `counter_sets`); True when it
        wrote anything."""
        existing = self.current()
        known = max((int(s["spec"]["pool"].get("generation", 0)) for s in existing), default=0)
        if existing and same_content(existing, desired_slices(self.node, devices, 0,
                                                              counter_sets)):
            self.generation = known
            return False
        self.generation = max(known, self.generation) + 1
        wanted = desired_slices(self.node, devices, self.generation, counter_sets)
        by_name = {s["metadata"]["name"]: s for s in existing}
        for body in wanted:
            name = body["metadata"]["name"]
            old = by_name.pop(name, None)
            if old is None:
                self.api.create_resource_slice(body, field_manager=FIELD_MANAGER)
            else:
                body["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
                self.api.replace_resource_slice(name, body, field_manager=FIELD_MANAGER)
        for name in by_name:  # stale: another layout's or an earlier writer's
            self._delete(name)
        log.info("published %d device(s) of node %s in %d ResourceSlice(s), generation %d",
                 len(devices), self.node, len(wanted), self.generation)
        return True

    def _delete(self, name: str) -> None:
        try:
            self.api.delete_resource_slice(name)
        except ApiException as exc:
            if exc.status != 404:
                raise

    def watch_changes(self, on_change: Callable[[], None], stop: threading.Event,
                      timeout: int = 300) -> None:
        """Call `on_change` whenever someone deletes or changes one of this node's slices
        (the kubelet wiping them, a stray writer), until `stop`; the caller then syncs."""
        selector = f"spec.nodeName={self.node},spec.driver={DRIVER}"
        while not stop.is_set():
            w = watch.Watch()
            try:
                for ev in w.stream(self.api.list_resource_slice, field_selector=selector,
                                   timeout_seconds=timeout, _request_timeout=timeout + 10):
                    if stop.is_set():
                        w.stop()
                        return
                    managers = {m.manager for m in ev["object"].metadata.managed_fields or []}
                    if ev["type"] == "DELETED" or FIELD_MANAGER not in managers or \
                            len(managers) > 1:  # fmt: skip
                        on_change()
            except Exception as exc:  # the API went away for a while: watch again
                log.debug("watching ResourceSlices: %s", exc)
                stop.wait(5)

    def withdraw(self) -> None:
        """Delete every slice of this node and driver (the agent is going away for good)."""
        for s in self.current():
            self._delete(s["metadata"]["name"])
