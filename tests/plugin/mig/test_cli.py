"""``python -m gpukit.plugin.mig`` as the Ansible role calls it: a real subprocess against the
mock NVML (found through LD_LIBRARY_PATH / GPUKIT_NVML_LIB), exit codes and JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from migtest import CONFIGS, MockNode, cli_json, run_cli

pytestmark = pytest.mark.nvml


@pytest.fixture
def cfg(tmp_path: Path) -> Path:
    p = tmp_path / "mig.yaml"
    p.write_text(yaml.safe_dump({"version": "v1", "mig-configs": CONFIGS}))
    return p


def test_plan_apply_assert_export(a100: MockNode, cfg: Path, tmp_path: Path) -> None:
    env = a100.env
    common = ["--config-file", str(cfg), "--selected", "mixed-a100"]
    pause, state = tmp_path / "plugin.pause", tmp_path / "state.json"
    # check mode: plan says what would change, touches nothing
    rc, doc = cli_json(["plan", *common], env)
    assert rc == 0 and doc["changed"] is True and doc["command"] == "plan"
    assert doc["reset_required"] == [0, 1] and len(doc["actions"]) == 20
    assert doc["gpus"][0]["diff"]["after"] == "MIG enabled: 2g.10gb@0 1g.5gb@2 1g.5gb@3 3g.20gb@4"
    assert doc["diff"]["after"].splitlines()[0].startswith("GPU 0: MIG enabled")
    assert a100.layout()[0] == (False, False, ())
    proc = run_cli(["assert", *common], env)
    assert proc.returncode == 3 and "does not match" in proc.stderr + proc.stdout
    # apply (resets through the mock library's own reset, the lab's nvidia-smi -r)
    rc, doc = cli_json(["apply", *common, "--pause-file", str(pause), "--state-file",
                        str(state)], env)
    assert rc == 0 and doc["changed"] is True and len(doc["executed"]) == 20
    assert json.loads(state.read_text())["state"] == "success" and not pause.exists()
    assert a100.layout()[1][2] == ("2g.10gb@0/1ci", "1g.5gb@2/1ci", "1g.5gb@3/1ci",
                                   "3g.20gb@4/1ci")
    assert run_cli(["assert", *common], env).returncode == 0
    rc, doc = cli_json(["apply", *common, "--pause-file", str(pause)], env)
    assert rc == 0 and doc["changed"] is False and doc["executed"] == []
    human = run_cli(["apply", *common, "--pause-file", str(pause)], env)
    assert human.stdout.strip() == "MIG config 'mixed-a100': already applied, nothing to do"
    # export -> the same layout, under the given name; plan from it: no change
    out = tmp_path / "exported.yaml"
    assert run_cli(["export", "--selected", "snap", "-o", str(out)], env).returncode == 0
    exported = yaml.safe_load(out.read_text())
    assert exported["mig-configs"]["snap"] == [
        {"devices": [0, 1], "mig-enabled": True,
         "mig-devices": {"3g.20gb": 1, "2g.10gb": 1, "1g.5gb": 2}},
        {"devices": [2, 3, 4, 5, 6, 7], "mig-enabled": False}]
    rc, doc = cli_json(["plan", "--config-file", str(out), "--selected", "snap"], env)
    assert rc == 0 and doc["changed"] is False


def test_inventory_json_and_human_plan(a100: MockNode) -> None:
    inner = json.dumps({"all-3g.20gb": CONFIGS["all-3g"]})
    proc = run_cli(["plan", "--configs-json", inner, "--selected", "all-3g.20gb"], a100.env)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "MIG config 'all-3g.20gb' on 8 GPU(s): 8 to change, 0 unchanged"
    assert "  target: MIG enabled: 3g.20gb@0 3g.20gb@4" in lines
    assert "  - create GPU instance 3g.20gb at slice 4" in lines


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--selected", "nope"], 2, "no config named 'nope'"),
        (["--configs-json", '{"x": [{"devices": "all"}]}', "--selected", "x"], 2,
         "mig-configs.x[0].mig-enabled: missing"),
        (["--configs-json", '{"x": [{"devices": "all", "mig-enabled": true, '
                            '"mig-devices": {"5g.20gb": 1}}]}', "--selected", "x"], 2,
         "mig-configs.x[0].mig-devices.5g.20gb: unknown profile for NVIDIA A100-SXM4-40GB"),
        (["--configs-json", '{"x": [{"devices": "all", "mig-enabled": true, '
                            '"mig-devices": {"4g.20gb": 2}}]}', "--selected", "x"], 2,
         "4g.20gb: 2 requested, at most 1 per GPU"),
        (["--selected", "x", "--config-file", ""], 2, "give --config-file or --configs-json"),
    ],
)
def test_exit_codes_for_bad_configs(a100: MockNode, cfg: Path, args: list[str], code: int,
                                    message: str) -> None:
    full = args if "--configs-json" in args or "--config-file" in args else [
        "--config-file", str(cfg), *args]
    rc, doc = cli_json(["plan", *full], a100.env)
    assert rc == code and doc["failed"] is True and doc["exit_code"] == code
    assert any(message in p for p in doc["problems"]), doc["problems"]


def test_processes_refuse_then_force(a100: MockNode, cfg: Path, tmp_path: Path) -> None:
    a100.make(0, [("3g.20gb", 0)])
    a100.ctl.set_process(0, pid=31337, gi=2, ci=0)
    c = tmp_path / "one.json"
    c.write_text(json.dumps({"x": [{"devices": [0], "mig-enabled": True,
                                    "mig-devices": {"3g.20gb": 2}}]}))
    args = ["--configs-json", str(c), "--selected", "x", "--pause-file", str(tmp_path / "p"),
            "--state-file", str(tmp_path / "st")]
    rc, doc = cli_json(["plan", *args], a100.env)
    assert rc == 0 and doc["blocking_processes"] == {"0": [31337]}
    rc, doc = cli_json(["apply", *args], a100.env)
    assert rc == 1 and "GPU 0: pid 31337" in doc["msg"]
    assert json.loads((tmp_path / "st").read_text())["state"] == "failed"
    rc, doc = cli_json(["apply", *args, "--force"], a100.env)
    assert rc == 0 and doc["changed"] is True
    assert json.loads((tmp_path / "st").read_text())["state"] == "success"


def test_reset_failure_is_exit_1_and_rerun_converges(a100: MockNode, tmp_path: Path) -> None:
    c = json.dumps({"x": [{"devices": [0], "mig-enabled": True, "mig-devices": {"7g.40gb": 1}}]})
    args = ["--configs-json", c, "--selected", "x", "--pause-file", str(tmp_path / "p")]
    proc = run_cli(["apply", *args, "--reset-command", "false"], a100.env)
    assert proc.returncode == 1
    assert "reset GPU 0: false exited 1" in proc.stderr and "rerun apply" in proc.stderr
    assert a100.layout()[0] == (False, True, ())  # mode pending: the reset is what is left
    rc, doc = cli_json(["plan", *args], a100.env)
    assert rc == 0
    assert [a["action"] for a in doc["gpus"][0]["actions"]][:2] == [
        "reset-gpu", "create-gpu-instance"]
    assert run_cli(["apply", *args], a100.env).returncode == 0
    assert a100.layout()[0] == (True, True, ("7g.40gb@0/1ci",))


def test_t4_cli(t4: MockNode) -> None:
    inner = json.dumps(CONFIGS)
    rc, doc = cli_json(["apply", "--configs-json", inner, "--selected", "all-3g",
                        "--pause-file", ""], t4.env)
    assert rc == 2 and "GPU 0 (Tesla T4): mig-configs.all-3g[0] sets mig-enabled: true, but " \
                       "this GPU is not MIG capable" in doc["problems"][0]
    rc, doc = cli_json(["apply", "--configs-json", inner, "--selected", "all-disabled",
                        "--pause-file", ""], t4.env)
    assert rc == 0 and doc["changed"] is False


def test_a_hung_apply_ends_failed_within_its_bound(a100: MockNode, tmp_path: Path) -> None:
    """Issue 30: an apply whose GPU reset never finishes (here: outlives --timeout 1) ends with
    exit 1 and one line naming the bound, mig.config.state failed and the plugin's pause
    lifted (the node serves what it has), instead of leaving the node paused and pending."""
    import time

    c = json.dumps({"x": [{"devices": [0], "mig-enabled": True, "mig-devices": {"7g.40gb": 1}}]})
    pause, state = tmp_path / "p", tmp_path / "st"
    args = ["--configs-json", c, "--selected", "x", "--pause-file", str(pause),
            "--state-file", str(state), "--timeout", "1", "--reset-command", "sleep 4"]
    t0 = time.monotonic()
    rc, doc = cli_json(["apply", *args], a100.env)
    took = time.monotonic() - t0
    assert rc == 1 and doc["failed"] is True, doc
    assert "MIG config 'x' did not finish within 1s (--timeout)" in doc["msg"], doc["msg"]
    assert took < 4, took  # ended by the bound, not by the reset finishing
    assert json.loads(state.read_text())["state"] == "failed"
    assert not pause.exists()
    # The node is left as the apply left it (mode pending a reset); a rerun converges.
    assert run_cli(["apply", "--configs-json", c, "--selected", "x", "--pause-file",
                    str(pause)], a100.env).returncode == 0
    assert a100.layout()[0] == (True, True, ("7g.40gb@0/1ci",))
