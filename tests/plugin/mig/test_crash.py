"""Crash convergence: apply interrupted after each of its actions (and after pausing the
plugin), then run again, always reaches the target, and a further apply does nothing. Plus real
SIGKILLs of the CLI in the middle of NVML state writes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from migtest import CONFIGS, MockNode, configs, prepare_churn, run_cli

from gpukit.plugin.mig.applier import apply
from gpukit.plugin.mig.hooks import PauseFile

pytestmark = pytest.mark.nvml
PROFILE = "a100-sxm4-40gb-x8"


class Crash(BaseException):
    """Stands for a kill: a BaseException, so apply's error handling (reporting "failed",
    lifting the pause) does not run, as it would not after SIGKILL."""


class Counting:
    """Wraps a backend and the reset callback; crashes after the ``crash_after``-th change."""

    MUTATIONS = ("set_mig_mode", "create_gpu_instance", "create_compute_instance",
                 "destroy_compute_instance", "destroy_gpu_instance")

    def __init__(self, node: MockNode, crash_after: int | None = None) -> None:
        self.node = node
        self.crash_after = crash_after
        self.done: list[str] = []

    def _tick(self, what: str) -> None:
        self.done.append(what)
        if self.crash_after is not None and len(self.done) >= self.crash_after:
            raise Crash(f"killed after change {len(self.done)}: {what}")

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self.node.backend, name)
        if name not in self.MUTATIONS:
            return fn

        def wrapped(*args: Any) -> Any:
            out = fn(*args)
            self._tick(f"{name}{args}")
            return out

        return wrapped

    def reset(self, index: int) -> None:
        self.node.reset(index)
        self._tick(f"reset({index})")


class CrashingPause(PauseFile):
    def pause(self, gpus: Any, config: str) -> None:
        super().pause(gpus, config)
        raise Crash("killed right after pausing the plugin")


@pytest.fixture
def snapshot(node_factory: Callable[..., MockNode], tmp_path: Path) -> Path:
    """The churn starting state, prepared once per test and copied for every run."""
    node = node_factory(PROFILE, tmp_path / "prepared")
    prepare_churn(node)
    return node.state_dir


def fresh(node_factory: Callable[..., MockNode], snapshot: Path, tmp_path: Path, name: str
          ) -> MockNode:
    target = tmp_path / name
    shutil.copytree(snapshot, target)
    return node_factory(PROFILE, target)


def test_interrupt_after_each_action_then_rerun_converges(
    node_factory: Callable[..., MockNode], snapshot: Path, tmp_path: Path
) -> None:
    c = configs()
    clean = fresh(node_factory, snapshot, tmp_path, "clean")
    initial = clean.layout()
    counting = Counting(clean)
    first = apply(c, "churn", counting, counting.reset)
    target = clean.layout()
    n = len(counting.done)
    assert n == len(first.executed) == 31  # every kind of action, on 4 GPUs
    assert target != initial
    seen_partial = set()
    for k in range(1, n + 1):
        node = fresh(node_factory, snapshot, tmp_path, f"crash-{k}")
        pause_path = tmp_path / f"crash-{k}.pause"
        crashing = Counting(node, crash_after=k)
        with pytest.raises(Crash):
            apply(c, "churn", crashing, crashing.reset, pauser=PauseFile(pause_path))
        partial = node.layout()
        seen_partial.add(repr(partial))
        assert pause_path.exists()  # a killed apply leaves the plugin paused ...
        again = apply(c, "churn", node.backend, node.reset, pauser=PauseFile(pause_path))
        assert not pause_path.exists()  # ... and the rerun lifts it
        assert node.layout() == target, f"no convergence after a crash at change {k}"
        assert len(again.executed) + len(again.skipped) <= n - k + 1  # only what was left
        assert not apply(c, "churn", node.backend, node.reset).changed
    assert len(seen_partial) == n  # every interruption left a different intermediate state


def test_crash_right_after_pausing(
    node_factory: Callable[..., MockNode], snapshot: Path, tmp_path: Path
) -> None:
    node = fresh(node_factory, snapshot, tmp_path, "paused")
    pause_path = tmp_path / "plugin.pause"
    with pytest.raises(Crash):
        apply(configs(), "churn", node.backend, node.reset, pauser=CrashingPause(pause_path))
    doc = json.loads(pause_path.read_text())
    assert doc["indices"] == [0, 1, 2, 3] and doc["config"] == "churn"
    assert apply(configs(), "churn", node.backend, node.reset,
                 pauser=PauseFile(pause_path)).changed
    assert not pause_path.exists()


def test_crash_with_nothing_left_to_do_still_lifts_the_pause(a100: MockNode, tmp_path: Path
                                                             ) -> None:
    apply(configs(), "4g-3g", a100.backend, a100.reset)
    stale = PauseFile(tmp_path / "p")
    stale.pause([(0, "GPU-x")], "4g-3g")  # as if the last apply died after its last change
    assert not apply(configs(), "4g-3g", a100.backend, a100.reset, pauser=stale).changed
    assert not (tmp_path / "p").exists()


def test_sigkill_during_nvml_writes_then_rerun_converges(
    node_factory: Callable[..., MockNode], snapshot: Path, tmp_path: Path
) -> None:
    """The CLI (its own session, so its lab reset children go too) is SIGKILLed while the
    mock stalls half-way through writing its state file; apply again converges."""
    clean = fresh(node_factory, snapshot, tmp_path, "kill-clean")
    apply(configs(), "churn", clean.backend, clean.reset)
    target = clean.layout()
    cfg = tmp_path / "configs.json"
    cfg.write_text(json.dumps(CONFIGS))
    args = ["--configs-json", str(cfg), "--selected", "churn"]
    for delay in (0.5, 1.1, 1.7):
        node = fresh(node_factory, snapshot, tmp_path, f"kill-{delay}")
        env = dict(node.env, GPUKIT_NVML_TEST_COMMIT_DELAY_MS="60")
        pause = tmp_path / f"kill-{delay}.pause"
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpukit.plugin.mig", "apply", *args, "--pause-file",
             str(pause)], env=env, start_new_session=True, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE)
        time.sleep(delay)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        assert proc.returncode == -signal.SIGKILL, "apply finished before the kill"
        assert node.layout() != target
        done = run_cli(["apply", *args, "--pause-file", str(pause)], node.env)
        assert done.returncode == 0, done.stderr
        assert node.layout() == target
        check = run_cli(["assert", *args], node.env)
        assert check.returncode == 0, check.stdout + check.stderr
        assert not pause.exists()
