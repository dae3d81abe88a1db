"""gpukit.gpu filters for the declared GPU tenancy: quotas, LimitRanges and PriorityClasses
(gpukit.provision.quotas; validated as gpukit.inventory.quotas does).
Documentation: <filter>.yml beside this file (ansible-doc -t filter gpukit.gpu.<filter>)."""

from __future__ import annotations

from ansible_collections.gpukit.gpu.plugins.plugin_utils import gpukit_filters as gk

quotas = gk.library("gpukit.provision.quotas")


@gk.gpukit_filter
def gpu_quota_objects(declared):
    return quotas.objects(quotas.tenancy(dict(declared or {})))


@gk.gpukit_filter
def gpu_quota_stale(listed, objects):
    by_kind = [(r["item"][0], r["item"][1], r.get("resources") or [])
               for r in listed if not r.get("skipped")]
    return quotas.stale(by_kind, objects)


@gk.gpukit_filter
def gpu_quota_kinds(_input=None):
    return {"kinds": [list(k) for k in quotas.KINDS], "selector": quotas.SELECTOR}


class FilterModule:
    def filters(self):
        return gk.filter_map(gpu_quota_objects, gpu_quota_stale, gpu_quota_kinds)
