"""The suite with nodes worked in parallel reports what it reports sequentially: the same test
cases in the same order, with the same outcomes, messages and comparisons (JUnit properties),
on the lab of this instance (GPUKIT_LAB_INSTANCE, its GPUKIT_LAB_NODES). Wall times printed.

Which of a node's equal devices the kubelet hands to which filler pod is its own choice and
differs from run to run, sequential or not (pod fill-gpu-t4-gpu-0 saw /dev/nvidia0 in one run,
/dev/nvidia1 in the next): device identities (UUIDs, replica and MIG IDs, device and capability
nodes) are compared as placeholders; everything else must be equal."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import labprovision as lp
import pytest
from test_lab_suite import run_suite

from gpukit import inventory as inv
from gpukit.lab.config import load_spec
from gpukit.lab.inventory import for_instance

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def provisioned(lab_cluster: object) -> Iterator[inv.GpuInventory]:
    spec = load_spec()
    fleet = inv.load(for_instance(spec))
    lp.provision(spec, fleet)
    yield fleet
    lp.unprovision(spec, fleet)


DEVICE_IDS = re.compile(r"(GPU|MIG)-[0-9a-f-]{36}(::\d+)?|/dev/nvidia\d+|nvidia-cap\d+")


def masked(text: str) -> str:
    return DEVICE_IDS.sub("<device>", text)


def masked_property(name: str, value: str) -> tuple[str, str]:
    """A comparison row with its device identities masked; the index of the GPU a MIG device
    sits on (which of the declared parents) is a device identity too."""
    if name != "check":
        return name, masked(value)
    row = json.loads(value)
    if "parent GPU of" in row["what"]:
        row["observed"] = "<device>"
    return name, masked(json.dumps(row, sort_keys=True))


def cases(junit: Path) -> list[tuple[str, str, str, tuple[tuple[str, str], ...]]]:
    """(test id, outcome, message, properties) of every case, in report order."""
    out = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for kind in ("failure", "error", "skipped"):
            el = case.find(kind)
            if el is not None:
                outcome, message = kind, (el.get("message") or "") + (el.text or "")
        props = tuple(masked_property(p.get("name", ""), p.get("value", ""))
                      for p in case.iter("property"))
        out.append((f"{case.get('classname')}::{case.get('name')}", outcome, masked(message),
                    props))
    return out


def test_parallel_nodes_give_the_same_report(provisioned: inv.GpuInventory,
                                             tmp_path: Path) -> None:
    (tmp_path / "seq").mkdir()
    (tmp_path / "par").mkdir()
    seq = run_suite(tmp_path / "seq", "--node-parallelism", "1")
    par = run_suite(tmp_path / "par", "--node-parallelism", "4")
    n = len(provisioned.nodes)
    print(f"suite on {n} lab nodes: sequential {seq.seconds:.1f}s, 4 nodes at once"
          f" {par.seconds:.1f}s ({len(seq.passed)} passed, {len(seq.skipped)} skipped)")
    assert seq.rc == 0, seq.output
    assert par.rc == 0, par.output
    a, b = cases(tmp_path / "seq" / "junit.xml"), cases(tmp_path / "par" / "junit.xml")
    assert len(a) >= 60
    assert [c[0] for c in a] == [c[0] for c in b]  # same cases, same order
    assert a == b  # same outcomes, messages, comparisons
    # the HTML report: the same but for times (its header's, each test's duration)
    assert _timeless(seq.html) == _timeless(par.html)


# A comparison row of the HTML report whose observed cell is which declared parent GPU a MIG
# device sits on: a device identity, masked as masked_property masks it in the JUnit report.
PARENT_ROW = re.compile(r"(parent GPU of (?:<device>|[^<])*</td><td>[^<]*</td><td>)[^<]*")


def _timeless(html: str) -> str:
    html = re.sub(r"<span class='muted'>[0-9.]+s</span>", "", html)
    html = masked(re.sub(r"<b>(generated|duration)</b>: [^&<]*", "", html))
    return PARENT_ROW.sub(r"\1<device>", html)
