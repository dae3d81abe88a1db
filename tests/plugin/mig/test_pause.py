"""The plugin pause protocol: the MIG manager's PauseFile and the plugin's PauseWatcher, and
the node-label state reporter (with a fake node client)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import FrameType

import pytest

from gpukit.contracts import label_names
from gpukit.plugin.mig.hooks import (
    FileReporter,
    NodeLabelReporter,
    PauseFile,
    ResetError,
    command_reset,
)
from gpukit.plugin.mig.pause import PauseWatcher, read_pause


def test_pause_resume_seen_by_the_plugin(tmp_path: Path) -> None:
    path = tmp_path / "plugin.pause"
    changes: list[bool] = []
    watcher = PauseWatcher(path, on_change=changes.append)
    assert not watcher.poll() and not watcher.paused
    pf = PauseFile(path)
    pf.pause([(0, "GPU-a"), (3, "GPU-d")], "mixed-a100")
    doc = json.loads(path.read_text())
    assert doc["indices"] == [0, 3] and doc["gpus"] == ["GPU-a", "GPU-d"]
    assert doc["expires"] > time.time() and doc["pid"] == os.getpid()
    assert watcher.poll() and watcher.paused and changes == [True]
    assert watcher.covers("GPU-a") and not watcher.covers("GPU-b")
    assert (tmp_path / "plugin.pause.ack").read_text().strip() == doc["token"]
    assert not watcher.poll()  # unchanged file: no re-read, no transition
    pf.resume()
    assert not path.exists()
    assert watcher.poll() and not watcher.paused and changes == [True, False]
    assert not (tmp_path / "plugin.pause.ack").exists()
    pf.resume()  # idempotent


def test_manager_waits_for_the_ack(tmp_path: Path) -> None:
    path = tmp_path / "p"
    watcher = PauseWatcher(path)
    stop = threading.Event()

    def plugin_loop() -> None:
        while not stop.is_set():
            watcher.poll()
            time.sleep(0.01)

    t = threading.Thread(target=plugin_loop)
    t.start()
    try:
        started = time.monotonic()
        PauseFile(path, ack_timeout=5).pause([(1, "GPU-b")], "x")
        assert time.monotonic() - started < 2 and watcher.covers("GPU-b")
    finally:
        stop.set()
        t.join()
    # no plugin: the manager waits ack_timeout, then goes on
    lonely = tmp_path / "q"
    started = time.monotonic()
    PauseFile(lonely, ack_timeout=0.2).pause([], "x")
    assert 0.2 <= time.monotonic() - started < 2 and lonely.exists()


def test_expired_or_malformed_pause_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "p"
    clock = [1000.0]
    watcher = PauseWatcher(path, clock=lambda: clock[0])
    path.write_text(json.dumps({"token": "t", "gpus": [], "expires": 1010.0}))
    assert watcher.poll() and watcher.covers("anything")  # empty list: every GPU
    clock[0] = 1011.0
    assert watcher.poll() and not watcher.paused  # a killed manager cannot pause forever
    path.write_text("{not json")
    assert read_pause(path) is None
    path.write_text(json.dumps(["no", "token"]))
    assert read_pause(path) is None
    assert read_pause(tmp_path / "missing") is None


def test_resume_signals_the_plugin(tmp_path: Path) -> None:
    got: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        got.append(signum)

    old = signal.signal(signal.SIGUSR1, handler)
    try:
        pid_file = tmp_path / "plugin.pid"
        pid_file.write_text(f"{os.getpid()}\n")
        pf = PauseFile(tmp_path / "p", plugin_pid_file=pid_file)
        pf.pause([(0, "GPU-a")], "x")
        assert got == []  # the plugin polls the file; no signal needed to pause
        pf.resume()
        assert got == [signal.SIGUSR1]
    finally:
        signal.signal(signal.SIGUSR1, old)


def test_state_reporters(tmp_path: Path) -> None:
    class FakeNodes:
        def __init__(self) -> None:
            self.patches: list[tuple[str, dict[str, str | None]]] = []
            self.node_labels = {label_names.MIG_CONFIG: "mixed-a100"}

        def patch_labels(self, node: str, changes: Mapping[str, str | None]) -> None:
            self.patches.append((node, dict(changes)))

        def labels(self, node: str) -> dict[str, str]:
            return self.node_labels

    fake = FakeNodes()
    r = NodeLabelReporter("gpu-node-1", client=fake)
    r.report("pending")
    r.report("success", "done")
    assert fake.patches == [("gpu-node-1", {"nvidia.com/mig.config.state": "pending"}),
                            ("gpu-node-1", {"nvidia.com/mig.config.state": "success"})]
    assert r.selected_config() == "mixed-a100"
    f = FileReporter(tmp_path / "state" / "mig.json")
    f.report("failed", "why")
    doc = json.loads((tmp_path / "state" / "mig.json").read_text())
    assert (doc["state"], doc["detail"]) == ("failed", "why")


def test_command_reset(tmp_path: Path) -> None:
    marker = tmp_path / "reset"
    command_reset(["sh", "-c", f"echo {{index}} >> {marker}"])(3)
    assert marker.read_text() == "3\n"
    with pytest.raises(ResetError, match=r"reset GPU 1: sh -c 'echo busy >&2; exit 4' exited 4: "
                                         r"busy"):
        command_reset(["sh", "-c", "echo busy >&2; exit 4"])(1)
    with pytest.raises(ResetError, match="reset GPU 0: /nonexistent/nvidia-smi"):
        command_reset(["/nonexistent/nvidia-smi", "-r", "-i", "{index}"])(0)
