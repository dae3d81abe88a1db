"""The suite's NVML-on-the-node checks without a cluster: the check functions themselves, run
on a stand-in suite that answers with a declaration and a probe result."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any

import pytest

from gpukit import inventory as inv
from gpukit.conformance import host
from gpukit.conformance import test_host as host_checks
from gpukit.conformance import test_mig as mig_checks
from gpukit.conformance.checks import Check

LAB = Path(__file__).resolve().parents[2] / "inventories" / "lab"
T4 = "Tesla T4"


def _suite(decl: inv.NodeDecl, probe: host.NvmlSeen) -> Any:
    return NS(decl=lambda _n: decl, options=NS(host_access=True), probe=lambda _n: probe,
              probe_error=lambda _n: "")


def _t4(**raw: Any) -> inv.NodeDecl:
    return inv.node_from_vars("gpu-t4", {"gpukit_gpu": {"product": T4, "count": 2},
                                         "nvidia_driver_branch": "550", **raw})


def _probe(driver: str, gpus: list[dict[str, Any]] | None = None) -> host.NvmlSeen:
    if gpus is None:
        gpus = [{"index": i, "uuid": f"GPU-{i}", "name": T4, "minor": i, "memory_mib": 15360}
                for i in range(2)]
    return host.parse_probe({"ok": True, "driver_version": driver, "gpus": gpus})


def _run(test: Any, decl: inv.NodeDecl, probe: host.NvmlSeen) -> Check:
    """Run one check function; returns its Check (raises pytest's fail/skip as the suite)."""
    c = Check(decl.node_name, "host")
    test(_suite(decl, probe), decl.node_name, c)
    return c


def test_a_pinned_version_that_runs_passes() -> None:
    c = _run(host_checks.test_driver_version, _t4(nvidia_driver_version="550.127.05"),
             _probe("550.127.05"))
    assert [(r.what, r.expected, r.observed, r.ok) for r in c.rows] == [
        ("driver version (nvmlSystemGetDriverVersion)", "550.127.05", "550.127.05", True)]


def test_another_version_of_the_branch_fails_naming_node_expected_observed() -> None:
    """Issue #14: pinned 550.127.05 while 550.90.07 runs used to pass."""
    decl, probe = _t4(nvidia_driver_version="550.127.05"), _probe("550.90.07")
    with pytest.raises(pytest.fail.Exception) as exc:
        _run(host_checks.test_driver_version, decl, probe)
    assert str(exc.value) == ("node gpu-t4: driver version (nvmlSystemGetDriverVersion): "
                              "expected 550.127.05, observed 550.90.07")
    # The branch check judges the branch only: it passes, and says nothing contrary.
    branch = _run(host_checks.test_driver_branch, decl, probe)
    assert [(r.expected, r.observed, r.ok) for r in branch.rows] == [("550", "550", True)]


def test_a_probe_without_a_driver_version_fails_with_its_error() -> None:
    probe = host.parse_probe({"ok": False, "error": "nvmlInit_v2: Driver Not Loaded (9)"})
    with pytest.raises(pytest.fail.Exception, match=r"expected 550\.127\.05, observed "
                       r"nvmlInit_v2: Driver Not Loaded \(9\)$"):
        _run(host_checks.test_driver_version, _t4(nvidia_driver_version="550.127.05"), probe)


def test_no_pinned_version_skips_with_the_reason() -> None:
    with pytest.raises(pytest.skip.Exception, match="node gpu-t4: pins no nvidia_driver_version"):
        _run(host_checks.test_driver_version, _t4(), _probe("550.90.07"))


def _a100_gpus(lost: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(8):
        if i == lost:
            out.append({"index": i, "lost": True,
                        "error": "nvmlDeviceGetHandleByIndex_v2: GPU is lost (15)"})
            continue
        out.append({"index": i, "uuid": f"GPU-{i}", "name": "NVIDIA A100-SXM4-40GB", "minor": i,
                    "memory_mib": 40960, "mig_current": False, "mig_pending": False,
                    "migs": []})
    return out


def test_a_lost_gpu_fails_only_itself_in_the_mig_layout_check() -> None:
    decl = inv.load(LAB).node("gpu-a100")
    # The lab layout: GPUs 0-1 MIG, 2-7 whole; lose GPU 3, a whole one after MIG ones.
    probe = host.parse_probe({"ok": True, "driver_version": "550.90.07",
                              "gpus": _a100_gpus(lost=3)})
    # MIG parents stay disabled here: lines for 0-1 are expected, none for 4-7.
    with pytest.raises(pytest.fail.Exception) as exc:
        _run(mig_checks.test_gpus_carry_the_declared_layout, decl, probe)
    lines = str(exc.value).splitlines()
    assert [ln for ln in lines if "GPU 3" in ln] == [
        "node gpu-a100: GPU 3: expected present, observed lost "
        "(nvmlDeviceGetHandleByIndex_v2: GPU is lost (15))"]
    assert not [ln for ln in lines if re.search(r"GPU [4-7]\b", ln)], lines
