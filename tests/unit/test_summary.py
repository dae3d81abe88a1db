"""gpukit.summary: per node, what site.yml changed and the conformance suite's result, from
sample playbook records and JUnit files; and the gpukit.gpu.play_record callback that writes
the record on a real (local) ansible-playbook run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from gpukit import summary

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def task(name: str, **hosts: dict[str, Any]) -> dict[str, Any]:
    return {"task": {"name": name}, "hosts": hosts}


OK: dict[str, Any] = {"changed": False}
CHANGED: dict[str, Any] = {"changed": True}

# The layout of ansible.posix.json (results are the modules' own, plus failed/skipped flags).
PLAY = {
    "plays": [{"play": {"name": "Provision GPU nodes"}, "tasks": [
        task("Gathering Facts", **{"gpu-a100": OK, "gpu-t4": OK}),
        task("gpu_sharing : Apply the node's MIG layout",
             **{"gpu-a100": CHANGED, "gpu-t4": {"skipped": True, "changed": False}}),
        task("gpu_sharing : Rewrite the CDI spec for the new MIG devices",
             **{"gpu-a100": CHANGED}),
        task("node_labels : Label and taint the node",
             **{"gpu-a100": CHANGED, "gpu-t4": OK}),
        # a handler run for two notifications is one task
        task("gpu_sharing : Apply the node's MIG layout", **{"gpu-a100": CHANGED}),
    ]}],
    "stats": {
        "gpu-a100": {"ok": 30, "changed": 4, "failures": 0, "unreachable": 0, "skipped": 5},
        "gpu-t4": {"ok": 28, "changed": 0, "failures": 0, "unreachable": 0, "skipped": 7},
    },
}

FAILED_PLAY = {
    "plays": [{"play": {"name": "p"}, "tasks": [
        task("nvidia_driver : Pin the driver branch", **{"gpu-a100": CHANGED, "gpu-t4": OK}),
        task("nvidia_driver : Install the driver packages", **{
            "gpu-a100": {"failed": True, "changed": False,
                         "msg": "No package matching 'nvidia-driver-999' is available\nmore"},
        }),
        task("nvidia_driver : Optional probe", **{
            "gpu-t4": {"failed": True, "ignored": True, "msg": "ignored on purpose"}}),
    ]}, {"play": {"name": "p2"}, "tasks": [
        task("Gathering Facts", **{"gpu-h100": {"unreachable": True, "changed": False,
                                                "msg": "ssh: connect to host 10.0.0.9 port 22"}}),
    ]}],
    "stats": {
        "gpu-a100": {"ok": 3, "changed": 1, "failures": 1, "unreachable": 0, "skipped": 0},
        "gpu-t4": {"ok": 4, "changed": 0, "failures": 0, "unreachable": 0, "skipped": 0,
                   "ignored": 1},
        "gpu-h100": {"ok": 0, "changed": 0, "failures": 0, "unreachable": 1, "skipped": 0},
    },
}


def junit(cases: list[str]) -> str:
    return ("<?xml version='1.0' encoding='utf-8'?><testsuites name='pytest tests'>"
            "<testsuite name='pytest' errors='1' failures='1' skipped='2' tests='6' time='61.5'>"
            + "".join(cases) + "</testsuite></testsuites>")  # fmt: skip


def case(name: str, node: str | None, body: str = "") -> str:
    props = "<property name='area' value='discovery'/>"
    if node is not None:
        props += f"<property name='node' value='{node}'/>"
    props += "<property name='check' value='{&quot;ok&quot;: true}'/>"
    return f"<testcase classname='conformance.t' name='{name}' time='0.1'>" \
           f"<properties>{props}</properties>{body}</testcase>"


JUNIT = junit([
    case("test_capacity[gpu-a100-gpu]", "gpu-a100"),
    case("test_labels[gpu-a100]", "gpu-a100",
         "<failure message='node gpu-a100: label nvidia.com/mig.config: expected b, observed a"
         "&#10;assert False'>traceback</failure>"),
    case("test_timeslicing[gpu-t4]", "gpu-t4"),
    case("test_mig[gpu-t4]", "gpu-t4", "<skipped type='pytest.skip' message='no MIG'/>"),
    case("test_cuda[gpu-t4]", "gpu-t4", "<skipped message='no real GPU'/>"),
    case("test_pod_security", "(cluster)", "<error message='setup failed'>boom</error>"),
    case("test_without_node_property", None),
])


def test_play_changes_per_host() -> None:
    run = summary.parse_play(PLAY)
    a100, t4 = run.hosts["gpu-a100"], run.hosts["gpu-t4"]
    assert a100.changed == 4 and t4.changed == 0  # the recap's counts
    assert a100.changed_tasks == ["gpu_sharing : Apply the node's MIG layout",
                                  "gpu_sharing : Rewrite the CDI spec for the new MIG devices",
                                  "node_labels : Label and taint the node"]  # fmt: skip
    assert t4.changed_tasks == [] and t4.skipped == 7
    assert run.succeeded and a100.succeeded


def test_failed_unreachable_and_ignored_hosts() -> None:
    run = summary.parse_play(FAILED_PLAY)
    assert not run.succeeded
    a100, t4, h100 = (run.hosts[h] for h in ("gpu-a100", "gpu-t4", "gpu-h100"))
    assert not a100.succeeded and a100.failed_tasks == [
        ("nvidia_driver : Install the driver packages",
         "No package matching 'nvidia-driver-999' is available")]  # fmt: skip
    assert t4.succeeded and t4.failed_tasks == []  # an ignored failure is not a failure
    assert not h100.succeeded and h100.unreachable == 1
    assert h100.failed_tasks[0][1].startswith("ssh: connect to host")
    text = summary.render(run, None, conformance_note="not run")
    assert "site.yml     FAILED: 1 changed, 3 ok, 0 skipped, 1 failed" in text
    assert "site.yml     UNREACHABLE" in text
    assert "== summary per node: site.yml changes and conformance results ==" in text
    assert "failed:      nvidia_driver : Install the driver packages: No package" in text
    assert "result: site.yml FAILED on gpu-a100, gpu-h100" in text
    assert "conformance  not run" in text


def test_a_run_without_recap_is_judged_by_its_task_results() -> None:
    doc = {"plays": FAILED_PLAY["plays"]}
    run = summary.parse_play(doc)
    assert not run.hosts["gpu-a100"].succeeded and run.hosts["gpu-t4"].succeeded


def test_conformance_per_node() -> None:
    import xml.etree.ElementTree as ET

    run = summary.parse_junit(ET.fromstring(JUNIT))
    a100, t4, cluster = (run.nodes[n] for n in ("gpu-a100", "gpu-t4", "(cluster)"))
    assert (a100.passed, a100.failed, a100.skipped) == (1, 1, 0)
    assert a100.failures == [("test_labels[gpu-a100]", "node gpu-a100: label "
                              "nvidia.com/mig.config: expected b, observed a")]  # fmt: skip
    assert (t4.passed, t4.failed, t4.skipped) == (1, 0, 2)
    # errors count as failures; a case without a node property is cluster-wide
    assert (cluster.passed, cluster.failed) == (1, 1)
    assert (run.passed, run.failed, run.skipped) == (3, 2, 2) and not run.succeeded
    assert run.seconds == pytest.approx(61.5)


def test_render_both(tmp_path: Path) -> None:
    play, xml = tmp_path / "site.json", tmp_path / "conformance.xml"
    # ansible-playbook may print a warning before the JSON document on stdout
    play.write_text("[WARNING]: something\n" + json.dumps(PLAY))
    xml.write_text(JUNIT)
    text = summary.render(summary.read_play(play), summary.read_junit(xml))
    lines = text.splitlines()
    a100 = lines.index("gpu-a100")
    assert lines[a100 + 1:a100 + 6] == [
        "  site.yml     ok: 4 changed, 30 ok, 5 skipped",
        "  changed:     gpu_sharing : Apply the node's MIG layout",
        "               gpu_sharing : Rewrite the CDI spec for the new MIG devices",
        "               node_labels : Label and taint the node",
        "  conformance  FAILED: 1 passed, 1 failed, 0 skipped",
    ]  # fmt: skip
    assert lines[a100 + 6].startswith("  failed:      test_labels[gpu-a100]: node gpu-a100: label")
    t4 = lines.index("gpu-t4")
    assert lines[t4 + 1:t4 + 3] == ["  site.yml     ok: 0 changed, 28 ok, 7 skipped",
                                    "  conformance  passed: 1 passed, 0 failed, 2 skipped"]
    cluster = lines.index("(cluster)")
    assert cluster > t4 and "site.yml" not in lines[cluster + 1]
    assert lines[-1] == ("result: site.yml ok (4 changed over 2 nodes); conformance FAILED "
                         "(3 passed, 2 failed, 2 skipped, 62s)")  # fmt: skip


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpukit.summary", *args],
                          capture_output=True, text=True, cwd=REPO)  # fmt: skip


def test_cli_missing_inputs_and_strict(tmp_path: Path) -> None:
    play = tmp_path / "site.json"
    play.write_text(json.dumps(PLAY))
    missing = tmp_path / "conformance.xml"
    r = run_cli("--play", str(play), "--junit", str(missing))
    assert r.returncode == 0, r.stderr
    assert f"conformance  no result ({missing} missing: not run, or interrupted)" in r.stdout
    assert run_cli("--play", str(play), "--junit", str(missing), "--strict").returncode == 1
    alone = run_cli("--play", str(play), "--strict")
    assert alone.returncode == 0
    assert "conformance" not in alone.stdout  # not asked about: not shown
    assert "== summary per node: site.yml changes ==" in alone.stdout
    failed = tmp_path / "failed.json"
    failed.write_text(json.dumps(FAILED_PLAY))
    assert run_cli("--play", str(failed), "--strict").returncode == 1


def test_cli_unchanged_names_each_host_and_task_that_changed(tmp_path: Path) -> None:
    play = tmp_path / "site.json"
    play.write_text(json.dumps(PLAY))
    r = run_cli("--play", str(play), "--unchanged")
    assert r.returncode == 1
    assert ("not idempotent: gpu-a100 changed 4: gpu_sharing : Apply the node's MIG layout,"
            " gpu_sharing : Rewrite the CDI spec for the new MIG devices,"
            " node_labels : Label and taint the node") in r.stderr  # fmt: skip
    assert "gpu-t4" not in r.stderr
    quiet = json.loads(json.dumps(PLAY))
    quiet["plays"][0]["tasks"] = quiet["plays"][0]["tasks"][:1]
    quiet["stats"]["gpu-a100"]["changed"] = 0
    play.write_text(json.dumps(quiet))
    assert run_cli("--play", str(play), "--unchanged").returncode == 0
    assert run_cli("--play", str(tmp_path / "absent.json"), "--unchanged").returncode == 1


@pytest.mark.parametrize(("name", "content", "needle"), [
    ("site.json", "not json at all", "no JSON document"),
    ("site.json", "{\"plays\": 3}", "not a playbook run"),
    ("conformance.xml", "<html/>", "not JUnit XML: root element <html>"),
    ("conformance.xml", "<testsuites", "not XML"),
])  # fmt: skip
def test_cli_refuses_what_is_not_a_result(tmp_path: Path, name: str, content: str,
                                          needle: str) -> None:  # fmt: skip
    path = tmp_path / name
    path.write_text(content)
    r = run_cli("--play" if name.endswith(".json") else "--junit", str(path))
    assert r.returncode == 2 and needle in r.stderr, r.stderr


@pytest.mark.skipif(not (BIN / "ansible-playbook").exists(), reason="ansible is not installed")
def test_play_record_callback_on_a_real_run(tmp_path: Path) -> None:
    """The callback keeps the normal output and writes what the summary reads."""
    book = tmp_path / "play.yml"
    book.write_text(textwrap.dedent("""\
        - name: A play
          hosts: all
          gather_facts: false
          tasks:
            - name: Changes
              ansible.builtin.command: "true"
              changed_when: true
            - name: Changes only on b
              ansible.builtin.command: "true"
              changed_when: inventory_hostname == 'b'
            - name: Fails but ignored
              ansible.builtin.command: "false"
              changed_when: false
              ignore_errors: true
            - name: Skipped
              ansible.builtin.debug:
                msg: never
              when: false
            - name: Fails on b
              ansible.builtin.fail:
                msg: b is broken
              when: inventory_hostname == 'b'
        """))
    inventory = tmp_path / "hosts"
    inventory.write_text("a ansible_connection=local\nb ansible_connection=local\n[all:vars]\n"
                         f"ansible_python_interpreter={sys.executable}\n")
    record = tmp_path / "results" / "site.json"
    env = {**os.environ, "ANSIBLE_CALLBACKS_ENABLED": "gpukit.gpu.play_record",
           "GPUKIT_PLAY_RECORD": str(record), "ANSIBLE_NOCOLOR": "1"}
    r = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inventory), str(book)],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "PLAY RECAP" in r.stdout  # the normal output is still there
    run = summary.read_play(record)
    a, b = run.hosts["a"], run.hosts["b"]
    assert a.changed_tasks == ["Changes"] and a.changed == 1 and a.succeeded
    assert b.changed_tasks == ["Changes", "Changes only on b"] and b.changed == 2
    assert not b.succeeded and b.failed_tasks == [("Fails on b", "b is broken")]
    assert (a.skipped, b.skipped) == (2, 1)  # "Fails on b" is skipped on a
    assert oct(record.stat().st_mode & 0o777) == "0o644"
