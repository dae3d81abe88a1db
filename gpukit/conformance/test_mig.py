"""MIG partitioning: the GPUs carry the declared layout, the node advertises it per profile (or
as nvidia.com/gpu with strategy single), and MIG pods get MIG devices of the declared parents."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from gpukit import inventory as inv
from gpukit.conformance import expect
from gpukit.conformance.checks import Check
from gpukit.conformance.common import allocated_units, need_decl, need_expected, need_probe
from gpukit.contracts import label_names as ln
from gpukit.contracts.device_ids import strip_replica
from gpukit.k8s.nodes import allocatable

pytestmark = [pytest.mark.mig, pytest.mark.applies_to("mig")]


def _need_layout(suite: Any, node: str, check: Check) -> inv.NodeDecl:
    decl = need_decl(suite, node)
    if not decl.mig_declared:
        check.skip("declares no MIG layout (gpukit_mig_config is null)")
    return decl


@pytest.mark.stages("probe")
def test_gpus_carry_the_declared_layout(gpukit_suite: Any, node: str, check: Check) -> None:
    """MIG mode and the GPU instance profiles of every GPU, as NVML on the node reports them."""
    decl = _need_layout(gpukit_suite, node, check)
    probe = need_probe(gpukit_suite, node)
    seen = {g.index: g for g in probe.gpus}
    for want in decl.mig_gpus:
        gpu = seen.get(want.index)
        if gpu is None or gpu.error:
            check.record(f"GPU {want.index}", "present", gpu.state if gpu else "absent", False)
            continue
        check.equal(f"GPU {want.index} MIG mode", "enabled" if want.mig_enabled else "disabled",
                    "enabled" if gpu.mig_current else "disabled")
        if want.mig_enabled or gpu.migs:
            check.equal(f"GPU {want.index} MIG devices", sorted(want.profiles),
                        sorted(m.profile for m in gpu.migs))
    check.verify()


def test_mig_resources_match_the_layout(gpukit_suite: Any, node: str, check: Check) -> None:
    """Allocatable per MIG profile equals the layout (strategy mixed), or nvidia.com/gpu equals
    the number of MIG devices (single)."""
    decl = _need_layout(gpukit_suite, node, check)
    if decl.dra:  # its MIG devices are ResourceSlice devices, not allocatable (test_dra)
        check.skip("not served by the device plugin (gpukit_gpu_allocation: dra)")
    if decl.mig_strategy == "none":
        check.skip(f"device plugin config {decl.plugin_config_name!r} uses migStrategy none")
    expected = need_expected(gpukit_suite, node)
    units = expect.expected_units(decl)
    mig_resources = sorted({u.resource for u in units if u.mig_profile})
    observed = allocatable(gpukit_suite.listed_node(node))
    for resource in mig_resources:
        check.equal("allocatable", expected[resource], observed.get(resource, 0), resource)
    if decl.mig_strategy == "mixed":
        stray = sorted(r for r, n in observed.items()
                       if r.startswith(ln.MIG_RESOURCE_PREFIX) and n and r not in expected)
        check.equal("MIG resources not in the layout", [], stray)
    check.verify()


@pytest.mark.stages("probe", "fill")
@pytest.mark.per_resource("mig")
def test_mig_devices_belong_to_declared_parents(gpukit_suite: Any, node: str, resource: str,
                                                check: Check) -> None:
    """Each MIG pod's device is a MIG device of the right profile on a GPU the layout gives
    that profile, and the devices per GPU add up to the layout."""
    decl = need_decl(gpukit_suite, node)
    probe = need_probe(gpukit_suite, node)
    f = gpukit_suite.fill(node)
    units = [u for u in expect.expected_units(decl) if u.resource == resource]
    want_per_gpu = Counter(u.gpu_index for u in units for _ in range(u.replicas))
    profile = units[0].mig_profile if units else None
    got_per_gpu: Counter[int | None] = Counter()
    for s in f.running(resource):
        ids = list(s.kubelet_ids) if s.kubelet_ids else allocated_units(s, probe)
        for device_id in ids:
            uuid = strip_replica(device_id)
            mig = probe.mig(uuid)
            parent = probe.parent(uuid)
            if mig is None or parent is None:
                check.record(f"pod {s.pod}: device {uuid}", "a MIG device known to NVML",
                             "not a MIG device on this node", False, resource)
                continue
            check.equal(f"pod {s.pod}: profile of {uuid}", profile, mig.profile, resource)
            check.true(f"pod {s.pod}: parent GPU of {uuid}", parent.index in want_per_gpu,
                       sorted(i for i in want_per_gpu if i is not None), parent.index, resource)
            got_per_gpu[parent.index] += 1
    if not f.running(resource):
        check.record("MIG pods Running", len(units), 0, False, resource)
    else:
        check.equal("devices per parent GPU", dict(want_per_gpu), dict(got_per_gpu), resource)
    check.verify()


def test_single_strategy_labels(gpukit_suite: Any, node: str, check: Check) -> None:
    """With migStrategy single, nvidia.com/gpu carries the MIG product label."""
    decl = _need_layout(gpukit_suite, node, check)
    if decl.mig_strategy != "single":
        check.skip(f"migStrategy is {decl.mig_strategy}, not single")
    profiles = {p for g in decl.mig_gpus for p in g.profiles}
    obj = gpukit_suite.listed_node(node)
    labels = dict(obj.metadata.labels or {}) if obj else {}
    want = expect.label_value(f"{decl.gpu.product.replace(' ', '-')}-MIG-{min(profiles)}")
    check.true(ln.GPU_PRODUCT, labels.get(ln.GPU_PRODUCT, "").startswith(
        want), want, labels.get(ln.GPU_PRODUCT))
    check.verify()
