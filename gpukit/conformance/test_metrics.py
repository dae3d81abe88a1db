"""Accelerator metrics (CNCF accelerator_metrics): every declared GPU and MIG device of a node has
dcgm-exporter's series on the node's gpukit agent, a running GPU pod's series carry its pod,
namespace and container, and the values agree with NVML on the node; and only an authorised
scraper reads them (gpukit_metrics_auth: kubernetes, the default).

The agent is scraped from a small pod on its node (conformance.scraper: busybox's wget) running
as the run's scraper ServiceAccount, allowed `get nodes/metrics` as a Prometheus scraping
kubelets is: the API server's node proxy forwards no credentials. The pod reaches the node's
InternalIP, so the agent must listen there (gpukit_metrics_listen_address 0.0.0.0, the default;
a loopback-only agent fails here, naming the node and address). The port is the inventory's
gpukit_metrics_port (9402 without --inventory)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest

from gpukit.conformance import attribution
from gpukit.conformance.attribution import FB_USED, Sample
from gpukit.conformance.checks import Check
from gpukit.conformance.common import need_node_agent, need_probe
from gpukit.conformance.scraper import ScrapeError

pytestmark = pytest.mark.metrics

FB_FREE = "DCGM_FI_DEV_FB_FREE"


def scrape(suite: Any, node: str, check: Check) -> list[Sample]:
    """The agent's /metrics as an authorised scraper (fails naming node and address)."""
    need_node_agent(suite, node, check, "the GPU metrics endpoint")
    try:
        return attribution.scrape(suite, node)
    except ScrapeError as exc:
        check.record("agent metrics (authorised scraper)", "served", str(exc), False)
        check.verify()
        raise AssertionError("unreachable") from exc


@pytest.mark.stages("scraper")
def test_only_an_authorised_scraper_reads_the_metrics(gpukit_suite: Any, node: str,
                                                      check: Check) -> None:
    """With gpukit_metrics_auth kubernetes (the default) a scrape without a token is refused
    (401, or 403) and one with a token allowed `get nodes/metrics` on the node is answered
    (200); with none, both are answered. Any other path is not found (404)."""
    decl = gpukit_suite.decl(node)
    if decl is None:
        check.skip("who may scrape is declared by the inventory's gpukit_metrics_auth "
                   "(run with --inventory)")
    if not decl.metrics.enabled:
        check.skip("gpukit_metrics_enabled is false: no metrics endpoint is declared")
    need_node_agent(gpukit_suite, node, check, "the GPU metrics endpoint")
    try:
        anonymous = gpukit_suite.scrape(node, authorised=False)
        authorised = gpukit_suite.scrape(node)
        other = gpukit_suite.scrape(node, path="/debug")
    except ScrapeError as exc:
        check.record("agent metrics", "answered", str(exc), False)
        check.verify()
        raise AssertionError("unreachable") from exc
    open_port = decl.metrics.auth == "none"
    url = authorised.url
    check.true(f"{url} without a token (gpukit_metrics_auth {decl.metrics.auth})",
               anonymous.status == 200 if open_port else anonymous.status in (401, 403),
               "200" if open_port else "401 or 403", anonymous.status)
    check.equal(f"{url} with the scraper's token (allowed get nodes/metrics)", 200,
                authorised.status)
    check.equal(f"{other.url} with the token", 404, other.status)
    check.verify()


def _series(samples: list[Sample], name: str) -> list[Sample]:
    return [s for s in samples if s[0] == name]


@pytest.mark.stages("probe")
def test_every_device_has_dcgm_series(gpukit_suite: Any, node: str, check: Check) -> None:
    """Each GPU NVML shows (and each MIG device on it) has its memory series, under its own
    UUID, GPU index and GPU instance; no series for a device NVML does not show."""
    probe = need_probe(gpukit_suite, node)
    samples = scrape(gpukit_suite, node, check)
    decl = gpukit_suite.decl(node)
    if decl is not None:
        check.equal("GPUs NVML shows (declared gpukit_gpu.count)", decl.gpu.count,
                    len(probe.gpus))
    used = _series(samples, FB_USED)
    whole = {s[1].get("UUID", ""): s[1] for s in used if "GPU_I_ID" not in s[1]}
    migs = {(s[1].get("UUID"), s[1].get("GPU_I_ID")) for s in used if "GPU_I_ID" in s[1]}
    for gpu in probe.readable:
        if gpu.mig_current:
            for m in gpu.migs:
                check.true(f"GPU {gpu.index} MIG device {m.uuid} ({m.profile}) {FB_USED}",
                           (gpu.uuid, str(m.gi)) in migs, f"UUID={gpu.uuid} GPU_I_ID={m.gi}",
                           "absent")
            continue
        labels = whole.get(gpu.uuid)
        check.equal(f"GPU {gpu.index} ({gpu.uuid}) {FB_USED} gpu label", str(gpu.index),
                    labels.get("gpu") if labels else "no series")
        if labels:
            check.equal(f"GPU {gpu.index} modelName", gpu.name, labels.get("modelName"))
    known = {g.uuid for g in probe.gpus if not g.error}
    stray = sorted(set(whole) - known)
    check.equal("series of GPUs NVML does not show", [], stray)
    check.verify()


@pytest.mark.stages("probe")
def test_memory_series_agree_with_nvml(gpukit_suite: Any, node: str, check: Check) -> None:
    """FB_USED + FB_FREE of each whole GPU is the memory NVML reports for it (MiB, rounded)."""
    probe = need_probe(gpukit_suite, node)
    samples = scrape(gpukit_suite, node, check)
    per_uuid: dict[str, dict[str, float]] = defaultdict(dict)
    for name in (FB_USED, FB_FREE):
        for _, labels, value in _series(samples, name):
            if "GPU_I_ID" not in labels:
                per_uuid[labels.get("UUID", "")][name] = value
    for gpu in probe.readable:
        if gpu.mig_current:
            continue
        got = per_uuid.get(gpu.uuid, {})
        if FB_USED not in got or FB_FREE not in got:
            check.record(f"GPU {gpu.index} ({gpu.uuid}) {FB_USED}+{FB_FREE}",
                         f"{gpu.memory_mib} MiB", "no series", False)
            continue
        total = got[FB_USED] + got[FB_FREE]
        check.true(f"GPU {gpu.index} ({gpu.uuid}) {FB_USED}+{FB_FREE} (MiB)",
                   abs(total - gpu.memory_mib) <= 1, gpu.memory_mib, total)
    check.verify()


@pytest.mark.stages("probe", "fill", "attribution")
@pytest.mark.per_resource("all")
def test_a_running_gpu_pod_s_series_carry_its_labels(gpukit_suite: Any, node: str,
                                                     resource: str, check: Check) -> None:
    """The series of the devices a running fill pod was given carry its pod, namespace and
    container (dcgm-exporter's attribution, through the kubelet's PodResources API), as the
    suite observed while the fill ran (conformance.attribution)."""
    need_probe(gpukit_suite, node)
    need_node_agent(gpukit_suite, node, check, "the GPU metrics endpoint")
    if not gpukit_suite.fill(node).running(resource):
        check.skip(f"no running pod of {resource} on the node")
    seen = gpukit_suite.attribution(node)
    if seen.error:
        check.record("agent metrics while the fill ran", "served", seen.error, False)
        check.verify()
    want = seen.want.get(resource, {})
    check.true(f"fill pods of {resource} observed while running", bool(want), "at least 1",
               len(want))
    observed = seen.observed.get(resource, {})
    for pod, uuids in want.items():
        # The pod's name alone: the run's namespace differs from run to run.
        check.equal(f"fill pod {pod} container main: UUIDs of its {FB_USED} series", uuids,
                    observed.get(pod, []), resource)
    check.verify()
