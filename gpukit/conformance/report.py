"""The HTML report: a grid of area x node (pass/fail at a glance), then per node the tests with
expected vs observed for every comparison, and the CNCF AI Conformance requirements covered.

The suite writes it at the end of a run (`--report-html`) from its in-run results, and
`gpukit report junit.xml -o report.html` writes the same from the run's JUnit XML
(`from_junit`): every test case of the suite carries its area, node, resource, CNCF
requirement id and comparisons as JUnit properties (see plugin.py).
"""

from __future__ import annotations

import datetime as dt
import html
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .checks import AREAS, Row

ALL_NODES = "(cluster)"


@dataclass
class Result:
    nodeid: str
    name: str
    area: str
    node: str
    resource: str
    outcome: str  # passed | failed | skipped | error
    duration: float = 0.0
    message: str = ""
    cncf: str = ""
    rows: list[Row] = field(default_factory=list)


def _cell(results: list[Result]) -> tuple[str, str]:
    if not results:
        return "none", "&ndash;"
    failed = sum(r.outcome in ("failed", "error") for r in results)
    passed = sum(r.outcome == "passed" for r in results)
    skipped = sum(r.outcome == "skipped" for r in results)
    if failed:
        return "fail", f"&#10008; {failed} failed / {len(results)}"
    if passed:
        extra = f" ({skipped} skipped)" if skipped else ""
        return "pass", f"&#10004; {passed} passed{extra}"
    return "skip", f"skipped ({skipped})"


_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}
th,td{border:1px solid #ccc;padding:.3em .6em;text-align:left;vertical-align:top}
th{background:#f3f3f3}
td.pass{background:#e3f6e3}td.fail{background:#fbe0e0;font-weight:bold}
td.skip{background:#f4f4f4;color:#666}td.none{color:#aaa}
tr.bad td{background:#fbe0e0}
.outcome-passed{color:#1a7f1a}.outcome-failed,.outcome-error{color:#b00;font-weight:bold}
.outcome-skipped{color:#777}
pre{white-space:pre-wrap;margin:.2em 0;font-size:90%}
details{margin:.3em 0 .3em 1em}summary{cursor:pointer}
.muted{color:#777}
"""


def render(results: Iterable[Result], meta: Mapping[str, str]) -> str:
    results = list(results)
    nodes = sorted({r.node for r in results if r.node != ALL_NODES})
    if any(r.node == ALL_NODES for r in results):
        nodes.append(ALL_NODES)
    areas = [a for a in AREAS if any(r.area == a for r in results)]
    areas += sorted({r.area for r in results} - set(AREAS))
    # Grouped once, in run order: the grid and the node sections read each cell's results
    # (scanning every result per cell made the report quadratic in nodes: 17 s for 500).
    cells: dict[tuple[str, str], list[Result]] = {}
    for r in results:
        cells.setdefault((r.area, r.node), []).append(r)
    e = html.escape
    total = {o: sum(r.outcome == o for r in results)
             for o in ("passed", "failed", "error", "skipped")}
    out = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        "<title>gpukit conformance</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>gpukit conformance</h1>",
        "<p>" + " &middot; ".join(f"<b>{e(k)}</b>: {e(v)}" for k, v in meta.items()) + "</p>",
        "<p>" + ", ".join(f"{n} {o}" for o, n in total.items() if n) + "</p>",
        "<h2>Areas &times; nodes</h2><table><tr><th>area</th>"
        + "".join(f"<th><a href='#node-{e(n)}'>{e(n)}</a></th>" for n in nodes) + "</tr>",
    ]
    for area in areas:
        out.append(f"<tr><th>{e(area)}</th>")
        for n in nodes:
            cls, text = _cell(cells.get((area, n), []))
            out.append(f"<td class='{cls}'><a href='#node-{e(n)}-{e(area)}'>{text}</a></td>")
        out.append("</tr>")
    out.append("</table>")
    cncf = sorted({r.cncf for r in results if r.cncf})
    if cncf:
        out.append("<h2>CNCF Kubernetes AI Conformance requirements</h2><table>"
                   "<tr><th>requirement id</th><th>tests</th><th>result</th></tr>")
        for req in cncf:
            cls, text = _cell([r for r in results if r.cncf == req])
            tests = sum(r.cncf == req for r in results)
            out.append(f"<tr><td>{e(req)}</td><td>{tests}</td><td class='{cls}'>{text}</td></tr>")
        out.append("</table>")
    for n in nodes:
        out.append(f"<h2 id='node-{e(n)}'>node {e(n)}</h2>")
        for area in areas:
            mine = cells.get((area, n), [])
            if not mine:
                continue
            cls, text = _cell(mine)
            out.append(f"<h3 id='node-{e(n)}-{e(area)}'>{e(area)} "
                       f"<span class='muted'>({text})</span></h3>")
            out.append("<table><tr><th>test</th><th>resource</th><th>result</th>"
                       "<th>expected vs observed</th></tr>")
            for r in mine:
                out.append(_result_row(r))
            out.append("</table>")
    out.append("</body></html>")
    return "\n".join(out)


def _result_row(r: Result) -> str:
    e = html.escape
    detail: list[str] = []
    if r.rows:
        detail.append("<table><tr><th>what</th><th>expected</th><th>observed</th></tr>")
        for row in r.rows:
            cls = "" if row.ok else " class='bad'"
            what = f"{row.resource}: {row.what}" if row.resource and row.resource != r.resource \
                else row.what
            detail.append(f"<tr{cls}><td>{e(what)}</td><td>{e(row.expected)}</td>"
                          f"<td>{e(row.observed)}</td></tr>")
        detail.append("</table>")
    if r.message and (r.outcome != "passed"):
        detail.append(f"<pre>{e(r.message)}</pre>")
    body = "".join(detail)
    if r.outcome == "passed" and len(r.rows) > 6:
        body = f"<details><summary>{len(r.rows)} comparisons</summary>{body}</details>"
    return (f"<tr><td>{e(r.name)}<div class='muted'>{e(r.cncf)}</div></td><td>{e(r.resource)}"
            f"</td><td class='outcome-{e(r.outcome)}'>{e(r.outcome)} "
            f"<span class='muted'>{r.duration:.1f}s</span></td><td>{body}</td></tr>")


class JunitError(ValueError):
    """The file is not the suite's JUnit XML; the message names the file and why."""


def from_junit(path: str | Path) -> tuple[list[Result], dict[str, str]]:
    """The suite's results and the run's facts from its JUnit XML. Test cases without the
    suite's `area` property (other tests in the same run) are left out, as in the run's own
    report."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as e:
        raise JunitError(f"{path}: cannot read JUnit XML ({e})") from e
    if root.tag not in ("testsuites", "testsuite"):
        raise JunitError(f"{path}: not JUnit XML (root element <{root.tag}>)")
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    results: list[Result] = []
    for case in root.iter("testcase"):
        props: dict[str, str] = {}
        rows: list[Row] = []
        for prop in case.iter("property"):
            name, value = prop.get("name", ""), prop.get("value", "")
            if name == "check":
                try:
                    rows.append(Row.from_json(value))
                except (ValueError, TypeError) as e:
                    raise JunitError(f"{path}: test case {case.get('name')!r}: property "
                                     f"check={value[:80]!r} is not a comparison ({e})") from e
            else:
                props[name] = value
        if "area" not in props:
            continue
        outcome, message = _junit_outcome(case)
        name = case.get("name", "")
        results.append(Result(
            nodeid=f"{case.get('classname', '')}::{name}", name=name.split("[")[0],
            area=props["area"], node=props.get("node") or ALL_NODES,
            resource=props.get("resource", ""), outcome=outcome,
            duration=float(case.get("time") or 0), message=message,
            cncf=props.get("cncf_ai_conformance", ""), rows=rows,
        ))  # fmt: skip
    meta = {"from": str(path)}
    stamp = next((s.get("timestamp") for s in suites if s.get("timestamp")), None)
    if stamp:
        meta["run"] = stamp
    seconds = sum(float(s.get("time") or 0) for s in suites)
    if seconds:
        meta["duration"] = f"{seconds:.1f}s"
    return results, meta


def _junit_outcome(case: ET.Element) -> tuple[str, str]:
    for tag, outcome in (("failure", "failed"), ("error", "error")):
        bad = case.find(tag)
        if bad is not None:
            return outcome, bad.text or bad.get("message") or ""
    skipped = case.find("skipped")
    if skipped is not None:
        return "skipped", skipped.get("message") or skipped.text or ""
    return "passed", ""


def write(path: str, results: Iterable[Result], meta: Mapping[str, str]) -> Path:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    meta = {"generated": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ"), **meta}
    target.write_text(render(results, meta))
    return target
