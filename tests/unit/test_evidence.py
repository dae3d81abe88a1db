"""`gpukit evidence`: the CNCF AI Conformance files from a suite run's JUnit XML; the draft
PRODUCT.yaml has the checklist's shape and claims only what passed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpukit.conformance import evidence as ev
from gpukit.conformance.report import Result
from gpukit.contracts import cncf_ai_conformance as cncf


def result(name: str, node: str, outcome: str, req: str, message: str = "") -> Result:
    return Result(nodeid=f"gpukit.conformance.t::{name}[{node}]", name=name, area="a",
                  node=node, resource="", outcome=outcome, message=message, cncf=req)


def statuses(doc: dict) -> dict[str, tuple[str, str]]:  # type: ignore[type-arg]
    return {r["id"]: (r["status"], r["notes"]) for reqs in doc["spec"].values() for r in reqs}


def test_only_requirements_whose_tests_passed_are_claimed() -> None:
    results = [
        result("iso", "gpu-t4", "passed", cncf.SECURE_ACCELERATOR_ACCESS),
        result("iso", "gpu-a100", "passed", cncf.SECURE_ACCELERATOR_ACCESS),
        result("share", "gpu-t4", "passed", cncf.GPU_SHARING),
        result("share", "gpu-a100", "failed", cncf.GPU_SHARING, "expected 8, observed 4"),
        result("dra", "gpu-t4", "skipped", cncf.DRA_SUPPORT, "not on DRA"),
    ]
    doc = ev.product(results, {"kubernetesVersion": "v1.37", "platformName": "gpukit"})
    assert ev.problems(doc) == []
    got = statuses(doc)
    assert got[cncf.SECURE_ACCELERATOR_ACCESS] == (
        cncf.IMPLEMENTED, "gpukit conformance suite: 2 tests passed on gpu-a100, gpu-t4")
    assert got[cncf.GPU_SHARING] == ("", "1 of 2 tests failed (share on gpu-a100): fix before "
                                         "claiming")
    assert got[cncf.DRA_SUPPORT] == ("", "all 1 tests skipped: nothing shown")
    assert got["gang_scheduling"][0] == "" and "not covered" in got["gang_scheduling"][1]
    secure = next(r for r in doc["spec"]["security"] if r["id"] == cncf.SECURE_ACCELERATOR_ACCESS)
    assert secure["evidence"] == [
        "junit.xml: gpukit.conformance.t::iso[gpu-t4] (gpu-t4): passed",
        "junit.xml: gpukit.conformance.t::iso[gpu-a100] (gpu-a100): passed"]
    assert doc["metadata"]["kubernetesVersion"] == "v1.37"


def test_the_shape_check_finds_departures() -> None:
    doc = ev.product([], {})
    assert ev.problems(doc) == []
    doc["spec"]["security"][0]["status"] = "Done"
    del doc["spec"]["operator"]
    assert ev.problems(doc) == ["spec.security[0].status: 'Done'",
                                "spec: requirement ids ['robust_controller'] differ"]
    with pytest.raises(ValueError, match=r"metadata.vendor: not a PRODUCT.yaml metadata field"):
        ev.product([], {"vendor": "x"})


JUNIT = """<?xml version="1.0"?>
<testsuites><testsuite name="pytest" tests="2" time="3.5">
<testcase classname="gpukit.conformance.test_isolation" name="test_iso[gpu-t4]" time="1">
<properties><property name="area" value="isolation"/><property name="node" value="gpu-t4"/>
<property name="cncf_ai_conformance" value="secure_accelerator_access"/></properties>
</testcase>
<testcase classname="gpukit.conformance.test_metrics" name="test_m[gpu-t4]" time="1">
<properties><property name="area" value="metrics"/><property name="node" value="gpu-t4"/>
<property name="cncf_ai_conformance" value="accelerator_metrics"/></properties>
<failure message="node gpu-t4: series absent">node gpu-t4: series absent</failure>
</testcase></testsuite></testsuites>
"""


def test_the_cli_writes_the_three_files(tmp_path: Path) -> None:
    junit = tmp_path / "run.xml"
    junit.write_text(JUNIT)
    out = tmp_path / "evidence"
    proc = subprocess.run([sys.executable, "-m", "gpukit", "evidence", str(junit), "-o", str(out),
                           "--kubernetes-version", "v1.37"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == (f"{out}: PRODUCT.yaml drafts 1 requirement(s) from 2 tests: "
                                   "secure_accelerator_access")
    assert (out / "junit.xml").read_text() == JUNIT
    assert (out / "e2e.log").read_text().splitlines() == [
        "PASSED  gpukit.conformance.test_isolation::test_iso[gpu-t4] "
        "[isolation/secure_accelerator_access]",
        "FAILED  gpukit.conformance.test_metrics::test_m[gpu-t4] [metrics/accelerator_metrics]: "
        "node gpu-t4: series absent"]
    doc = yaml.safe_load((out / "PRODUCT.yaml").read_text())
    assert ev.problems(doc) == []
    assert statuses(doc)[cncf.ACCELERATOR_METRICS][0] == ""
    bad = subprocess.run([sys.executable, "-m", "gpukit", "evidence", str(tmp_path / "none.xml"),
                          "-o", str(out)], capture_output=True, text=True)
    assert bad.returncode != 0 and "none.xml" in bad.stderr and "Traceback" not in bad.stderr
