"""`gpukit report junit.xml -o report.html`: the suite's per-node HTML report from the JUnit XML
of a run, the same as the report the run wrote itself; no phantom node in either.

The run is the suite's own, against a stand-in API server that answers /version and the two
lab nodes (gpu-t4 advertising fewer GPUs than declared and not Ready), so the discovery checks
pass on one node and fail on the other; with gpu-t4 sharing nothing, the time-slicing tests
have no (node, resource) to run for: pytest's empty parameter set, which used to show up as a
node named `NotSetType.token`.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml

from gpukit import inventory as inv
from gpukit.conformance import report

REPO = Path(__file__).resolve().parents[2]
HOST_VARS = {"gpu-t4": {"gpukit_device_plugin_config": "default"}}


def _node(name: str, resources: dict[str, int], ready: bool) -> dict[str, Any]:
    counts = {r: str(n) for r, n in resources.items()}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {"capacity": counts, "allocatable": counts, "conditions": [
            {"type": "Ready", "status": "True" if ready else "False",
             "reason": "KubeletReady" if ready else "KubeletNotReady",
             "message": "stand-in"},
            # The node agent's served-vs-declared condition: True where fewer GPUs are served.
            {"type": "GpuDeclarationMismatch", "status": "False" if ready else "True",
             "reason": "ServesDeclaration" if ready else "DevicesDifferFromDeclaration",
             "message": "stand-in"}]},
    }  # fmt: skip


class _Api(BaseHTTPRequestHandler):
    nodes: ClassVar[dict[str, dict[str, Any]]] = {}

    def do_GET(self) -> None:
        if self.path.rstrip("/") == "/version":
            self._send(200, {"major": "1", "minor": "34", "gitVersion": "v1.34.0",
                             "gitCommit": "0" * 40, "gitTreeState": "clean",
                             "buildDate": "2025-08-27T00:00:00Z", "goVersion": "go1.24.6",
                             "compiler": "gc", "platform": "linux/amd64"})
            return
        if self.path.split("?")[0].rstrip("/") == "/api/v1/nodes":  # the suite lists them
            self._send(200, {"kind": "NodeList", "apiVersion": "v1", "metadata": {},
                             "items": list(self.nodes.values())})
            return
        m = re.fullmatch(r"/api/v1/nodes/([^/?]+)", self.path.split("?")[0])
        if m and m.group(1) in self.nodes:
            self._send(200, self.nodes[m.group(1)])
            return
        self._send(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                         "reason": "NotFound", "code": 404, "message": f"{self.path} not here"})

    def _send(self, code: int, doc: dict[str, Any]) -> None:
        body = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A kubeconfig for the stand-in API server."""
    lab = inv.load(REPO / "inventories" / "lab", host_vars=HOST_VARS)
    a100 = inv.expected_resources(lab.node("gpu-a100"))
    t4 = {r: n // 2 for r, n in inv.expected_resources(lab.node("gpu-t4")).items()}
    _Api.nodes = {"gpu-a100": _node("gpu-a100", a100, True),
                  "gpu-t4": _node("gpu-t4", t4, False)}  # fmt: skip
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    path = tmp_path_factory.mktemp("api") / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    try:
        yield path
    finally:
        server.shutdown()


@pytest.fixture(scope="module")
def run(api: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The suite's run: its JUnit XML (junit.xml) and its own report (suite.html)."""
    out = tmp_path_factory.mktemp("run")
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "gpukit/conformance",
         "--inventory", "inventories/lab", "--kubeconfig", str(api), "--no-host",
         "--host-vars", json.dumps(HOST_VARS), "-m", "discovery or timeslicing",
         "-k", "not kubelet_sees and not shared_resource_names",
         f"--junitxml={out / 'junit.xml'}", f"--report-html={out / 'suite.html'}"],
        cwd=REPO, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 1, r.stdout[-4000:] + r.stderr[-2000:]  # checks failed, none broke
    assert "3 skipped" in r.stdout and "passed" in r.stdout and "failed" in r.stdout, r.stdout
    return out


def _comparable(html: str) -> str:
    """The report without what differs by source: the run's facts and per-test durations
    (the JUnit time covers setup and teardown too), and pytest's 'Skipped: ' prefix,
    which its JUnit writer leaves out."""
    html = re.sub(r"<p><b>.*?</p>", "", html, count=1)
    html = re.sub(r"<span class='muted'>[0-9.]+s</span>", "", html)
    return html.replace("Skipped: ", "")


def test_the_report_from_junit_is_the_run_s_own(run: Path) -> None:
    out = run / "from-junit.html"
    r = subprocess.run([sys.executable, "-m", "gpukit", "report", str(run / "junit.xml"),
                        "-o", str(out)], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"{out}: 11 tests on 2 node(s), 3 failed"
    html = out.read_text()
    assert _comparable(html) == _comparable((run / "suite.html").read_text())
    # It names the nodes, the failed tests and what was expected and observed.
    assert "<h2 id='node-gpu-t4'>node gpu-t4</h2>" in html
    assert "<h2 id='node-gpu-a100'>node gpu-a100</h2>" in html
    t4 = html.split("<h2 id='node-gpu-t4'>")[1]
    assert "test_capacity_and_allocatable" in t4 and "outcome-failed" in t4
    want = inv.expected_resources(inv.load(REPO / "inventories" / "lab", host_vars=HOST_VARS
                                           ).node("gpu-t4"))["nvidia.com/gpu"]  # fmt: skip
    assert f"node gpu-t4: nvidia.com/gpu: capacity: expected {want}, observed {want // 2}" in t4
    assert "<td>condition Ready</td><td>True</td><td>False (KubeletNotReady stand-in)</td>" in t4
    a100 = html.split("<h2 id='node-gpu-a100'>")[1].split("<h2 id=")[0]
    assert "outcome-failed" not in a100 and "outcome-passed" in a100


def test_no_phantom_node_in_junit_or_either_report(run: Path) -> None:
    """Tests with an empty parameter set ran for no node: they appear under no node."""
    root = ET.parse(run / "junit.xml").getroot()
    cases = {c.get("name"): c for c in root.iter("testcase")}
    assert {n for n in cases if n and "NOTSET" in n} == {
        "test_replica_counts[NOTSET]", "test_replicas_spread_over_gpus[NOTSET]",
        "test_request_above_one[NOTSET]"}  # fmt: skip
    nodes = {p.get("value") for p in root.iter("property") if p.get("name") == "node"}
    assert nodes == {"gpu-a100", "gpu-t4"}
    results, _ = report.from_junit(run / "junit.xml")
    assert {r.node for r in results} == {"gpu-a100", "gpu-t4"}
    for page in ("suite.html",):
        text = (run / page).read_text()
        assert "NotSet" not in text and "NOTSET" not in text, page
    # The summary counts nodes the same way.
    summary = subprocess.run([sys.executable, "-m", "gpukit", "summary", "--junit",
                              str(run / "junit.xml")], capture_output=True, text=True,
                             timeout=60)  # fmt: skip
    assert summary.returncode == 0, summary.stderr
    assert "NotSet" not in summary.stdout, summary.stdout


def test_a_file_that_is_not_the_suite_s_junit_is_refused(tmp_path: Path) -> None:
    cases = {
        "broken.xml": ("<testsuites><testsuite>", "cannot read JUnit XML"),
        "html.xml": ("<html></html>", "not JUnit XML (root element <html>)"),
        "other.xml": ("<testsuite><testcase classname='t' name='test_x'/></testsuite>",
                      "no test case of the gpukit conformance suite"),
        "badcheck.xml": ("<testsuite><testcase classname='t' name='test_x'><properties>"
                         "<property name='area' value='discovery'/>"
                         "<property name='check' value='[1]'/></properties></testcase>"
                         "</testsuite>", "property check='[1]' is not a comparison"),
    }  # fmt: skip
    for name, (text, message) in cases.items():
        (tmp_path / name).write_text(text)
        r = subprocess.run([sys.executable, "-m", "gpukit", "report", str(tmp_path / name),
                            "-o", str(tmp_path / "r.html")], capture_output=True, text=True,
                           timeout=60)  # fmt: skip
        assert r.returncode == 2 and message in r.stderr, (name, r.stderr)
        assert not (tmp_path / "r.html").exists()
