"""Per node: what a provisioning run changed and what the conformance suite found.

`make lab` prints this at its end (also when a step failed):

    python -m gpukit.summary --play results/site.json --junit results/conformance.xml
    gpukit summary --play results/site.json --junit results/conformance.xml   # the same

Inputs:
- the playbook run as JSON: the document of the `ansible.posix.json` stdout callback, or the
  file the `gpukit.gpu.play_record` callback writes next to the normal output (same layout:
  ``plays[].tasks[].hosts{host: result}`` and ``stats{host: counts}``);
- the suite's JUnit XML (`pytest gpukit/conformance --junitxml …`): every test case carries a `node`
  property (`(cluster)` for cluster-wide tests, see gpukit.conformance.plugin).

Play hosts are inventory names and suite nodes are Kubernetes node names; they are the same
unless the inventory sets `gpukit_node_name`. Either input may be missing (a step that did not
run): the summary says so instead of failing.
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpukit import __version__

CLUSTER = "(cluster)"  # the suite's node property for cluster-wide tests
_MESSAGE_CHARS = 200


class SummaryError(ValueError):
    """An input exists but cannot be read as what it should be."""


def _first_line(text: str, limit: int = _MESSAGE_CHARS) -> str:
    line = next((s.strip() for s in text.splitlines() if s.strip()), "")
    return line if len(line) <= limit else line[: limit - 1] + "…"


@dataclass
class HostPlay:
    """One host's part of a playbook run."""

    host: str
    ok: int = 0
    changed: int = 0
    failed: int = 0
    unreachable: int = 0
    skipped: int = 0
    changed_tasks: list[str] = field(default_factory=list)  # in run order, each once
    failed_tasks: list[tuple[str, str]] = field(default_factory=list)  # (task, message)
    recap: bool = False  # the run reached its recap (stats); else judged by the task results

    @property
    def succeeded(self) -> bool:
        if self.recap:
            return not self.failed and not self.unreachable
        return not self.failed_tasks


@dataclass
class PlayRun:
    hosts: dict[str, HostPlay] = field(default_factory=dict)

    @property
    def succeeded(self) -> bool:
        return all(h.succeeded for h in self.hosts.values())

    def host(self, name: str) -> HostPlay:
        return self.hosts.setdefault(name, HostPlay(name))


def _result_message(res: Mapping[str, Any]) -> str:
    for key in ("msg", "stderr", "module_stderr", "reason"):
        value = res.get(key)
        if value:
            return _first_line(str(value))
    return ""


def parse_play(doc: Mapping[str, Any]) -> PlayRun:
    """A playbook run from its JSON document (see the module docstring for the layout)."""
    if not isinstance(doc.get("plays", []), list) or not isinstance(doc.get("stats", {}), dict):
        raise SummaryError("not a playbook run: expected 'plays' (a list) and 'stats'")
    run = PlayRun()
    for play in doc.get("plays", []):
        for task in play.get("tasks", []):
            name = str((task.get("task") or {}).get("name") or "(unnamed task)")
            for host, res in (task.get("hosts") or {}).items():
                hp = run.host(str(host))
                if not isinstance(res, Mapping):
                    continue
                if res.get("changed") and name not in hp.changed_tasks:
                    hp.changed_tasks.append(name)
                if (res.get("failed") and not res.get("ignored")) or res.get("unreachable"):
                    hp.failed_tasks.append((name, _result_message(res)))
    for host, counts in (doc.get("stats") or {}).items():
        hp = run.host(str(host))
        hp.ok = int(counts.get("ok", 0))
        hp.changed = int(counts.get("changed", 0))
        hp.failed = int(counts.get("failures", 0))
        hp.unreachable = int(counts.get("unreachable", 0))
        hp.skipped = int(counts.get("skipped", 0))
        hp.recap = True
    return run


def read_play(path: str | Path) -> PlayRun:
    text = Path(path).read_text()
    # ansible-playbook may print warnings before the document on stdout.
    start = text.find("{")
    if start < 0:
        raise SummaryError(f"{path}: no JSON document")
    try:
        doc = json.loads(text[start:])
    except ValueError as e:
        raise SummaryError(f"{path}: not JSON ({e})") from e
    if not isinstance(doc, dict):
        raise SummaryError(f"{path}: not a playbook run")
    try:
        return parse_play(doc)
    except SummaryError as e:
        raise SummaryError(f"{path}: {e}") from e


@dataclass
class NodeConformance:
    """One node's part of a conformance run."""

    node: str
    passed: int = 0
    failed: int = 0  # failures and errors
    skipped: int = 0
    failures: list[tuple[str, str]] = field(default_factory=list)  # (test, first line)

    @property
    def total(self) -> int:
        return self.passed + self.failed + self.skipped


@dataclass
class ConformanceRun:
    nodes: dict[str, NodeConformance] = field(default_factory=dict)
    seconds: float | None = None

    def node(self, name: str) -> NodeConformance:
        return self.nodes.setdefault(name, NodeConformance(name))

    @property
    def passed(self) -> int:
        return sum(n.passed for n in self.nodes.values())

    @property
    def failed(self) -> int:
        return sum(n.failed for n in self.nodes.values())

    @property
    def skipped(self) -> int:
        return sum(n.skipped for n in self.nodes.values())

    @property
    def succeeded(self) -> bool:
        return self.failed == 0 and self.passed > 0


def parse_junit(root: ET.Element) -> ConformanceRun:
    """A conformance run from the suite's JUnit XML (`<testsuites>` or one `<testsuite>`)."""
    if root.tag not in ("testsuites", "testsuite"):
        raise SummaryError(f"not JUnit XML: root element <{root.tag}>")
    run = ConformanceRun()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    times = [s.get("time") for s in suites if s.get("time")]
    if times:
        run.seconds = sum(float(t) for t in times if t is not None)
    for case in root.iter("testcase"):
        props = {p.get("name"): p.get("value", "") for p in case.iter("property")}
        node = run.node(props.get("node") or CLUSTER)
        name = case.get("name", "")
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if bad is not None:
            node.failed += 1
            node.failures.append((name, _first_line(bad.get("message") or bad.text or "")))
        elif case.find("skipped") is not None:
            node.skipped += 1
        else:
            node.passed += 1
    return run


def read_junit(path: str | Path) -> ConformanceRun:
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as e:
        raise SummaryError(f"{path}: not XML ({e})") from e
    try:
        return parse_junit(root)
    except SummaryError as e:
        raise SummaryError(f"{path}: {e}") from e


def _play_lines(hp: HostPlay | None, play: PlayRun | None, note: str | None) -> list[str]:
    if play is None:
        return [f"  site.yml     {note}"] if note else []
    if hp is None:
        return ["  site.yml     not in this run"]
    state = "ok" if hp.succeeded else ("UNREACHABLE" if hp.unreachable else "FAILED")
    head = (f"  site.yml     {state}: {hp.changed} changed, {hp.ok} ok, {hp.skipped} skipped"
            + (f", {hp.failed} failed" if hp.failed else "")
            + (f", {hp.unreachable} unreachable" if hp.unreachable else ""))  # fmt: skip
    out = [head]
    for i, task in enumerate(hp.changed_tasks):
        out.append(f"  {'changed:' if i == 0 else '':12} {task}")
    for task, msg in hp.failed_tasks:
        out.append(f"  {'failed:':12} {task}" + (f": {msg}" if msg else ""))
    return out


def _conformance_lines(nc: NodeConformance | None, conf: ConformanceRun | None,
                       note: str | None) -> list[str]:  # fmt: skip
    if conf is None:
        return [f"  conformance  {note}"] if note else []
    if nc is None or nc.total == 0:
        return ["  conformance  no tests for this node"]
    state = "FAILED" if nc.failed else ("passed" if nc.passed else "skipped only")
    out = [f"  conformance  {state}: {nc.passed} passed, {nc.failed} failed, {nc.skipped} skipped"]
    for test, msg in nc.failures:
        out.append(f"  {'failed:':12} {test}" + (f": {msg}" if msg else ""))
    return out


def render(
    play: PlayRun | None,
    conformance: ConformanceRun | None,
    *,
    play_note: str | None = None,
    conformance_note: str | None = None,
) -> str:
    """The summary as text: one block per node, then the overall result.

    A step whose result is None is shown with its note (e.g. "not run"), or left out when
    the note is None too (the step was not asked about)."""
    names: list[str] = []
    for source in (play.hosts if play else {}, conformance.nodes if conformance else {}):
        names += [n for n in source if n not in names and n != CLUSTER]
    names.sort()
    if conformance is not None and CLUSTER in conformance.nodes:
        names.append(CLUSTER)
    steps = " and ".join(
        s for s, shown in (("site.yml changes", play is not None or play_note),
                           ("conformance results", conformance is not None or conformance_note))
        if shown
    )  # fmt: skip
    out = ["", f"== summary per node: {steps or 'nothing to summarise'} =="]
    for name in names:
        out.append(name)
        if name != CLUSTER:
            out += _play_lines(play.hosts.get(name) if play else None, play, play_note)
        out += _conformance_lines(conformance.nodes.get(name) if conformance else None,
                                  conformance, conformance_note)  # fmt: skip
    if not names:
        out.append("(no nodes in the results)")
    out.append(_overall(play, conformance, play_note, conformance_note))
    return "\n".join(out) + "\n"


def _overall(play: PlayRun | None, conf: ConformanceRun | None, play_note: str | None,
             conf_note: str | None) -> str:  # fmt: skip
    parts: list[str] = []
    if play is not None:
        bad = sorted(h.host for h in play.hosts.values() if not h.succeeded)
        changed = sum(h.changed for h in play.hosts.values())
        parts.append((f"site.yml FAILED on {', '.join(bad)}" if bad else "site.yml ok")
                     + f" ({changed} changed over {len(play.hosts)} nodes)")  # fmt: skip
    elif play_note:
        parts.append(f"site.yml {play_note}")
    if conf is not None:
        verdict = "passed" if conf.succeeded else "FAILED"
        parts.append(f"conformance {verdict} ({conf.passed} passed, {conf.failed} failed, "
                     f"{conf.skipped} skipped"
                     + (f", {conf.seconds:.0f}s" if conf.seconds else "") + ")")  # fmt: skip
    elif conf_note:
        parts.append(f"conformance {conf_note}")
    return "result: " + ("; ".join(parts) or "nothing")


def unchanged_violations(play: PlayRun | None) -> list[str]:
    """Why a run that should have changed nothing did not: per host, the tasks it changed
    (or that there was no run to judge)."""
    if play is None:
        return ["no play record to judge"]
    return [f"{h.host} changed {h.changed}: {', '.join(h.changed_tasks) or '(tasks unknown)'}"
            for h in sorted(play.hosts.values(), key=lambda h: h.host) if h.changed]  # fmt: skip


def _load(path: str | None, reader: Any) -> tuple[Any, str | None]:
    if not path:
        return None, None
    if not Path(path).exists():
        return None, f"no result ({path} missing: not run, or interrupted)"
    return reader(path), None


def main(argv: Sequence[str] | None = None, prog: str = "python -m gpukit.summary") -> int:
    """`prog`: the name --help and --version show (`gpukit summary` runs this too)."""
    ap = argparse.ArgumentParser(
        prog=prog,
        description="Per node: what site.yml changed and the conformance suite's result.",
    )
    ap.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    ap.add_argument("--play", help="the playbook run as JSON (ansible.posix.json or "
                    "gpukit.gpu.play_record)")  # fmt: skip
    ap.add_argument("--junit", help="the conformance suite's JUnit XML")
    ap.add_argument("--strict", action="store_true",
                    help="exit 1 when either step failed or did not run")  # fmt: skip
    ap.add_argument("--unchanged", action="store_true",
                    help="exit 1 when the play changed anything (idempotence)")  # fmt: skip
    args = ap.parse_args(argv)
    try:
        play, play_note = _load(args.play, read_play)
        conf, conf_note = _load(args.junit, read_junit)
    except (OSError, SummaryError) as e:
        print(f"summary: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(render(play, conf, play_note=play_note, conformance_note=conf_note))
    if args.unchanged:
        drift = unchanged_violations(play)
        for line in drift:
            print(f"not idempotent: {line}", file=sys.stderr)
        if drift:
            return 1
    if args.strict:
        ok = (play is None or play.succeeded) and (conf is None or conf.succeeded)
        ok = ok and (play is not None or not args.play) and (conf is not None or not args.junit)
        return 0 if ok else 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
