"""A pause whose owner is gone is void (issue #14): a MIG apply killed mid-change must not
leave every resource of the node at zero until the file expires. The owner is a real child
process writing its pause through PauseFile; the reader is the plugin's PauseWatcher."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpukit.plugin.mig.hooks import PauseFile
from gpukit.plugin.mig.pause import (
    PauseWatcher,
    owner_record,
    pid_namespace,
    process_start,
    read_pause,
    write_pause,
)

OWNER = """
import sys, time
from gpukit.plugin.mig.hooks import PauseFile
PauseFile(sys.argv[1]).pause([(0, "GPU-a"), (1, "GPU-b")], "mixed")
print("paused", flush=True)
time.sleep(600)
"""


class Owner:
    """A child process that pauses the plugin and then waits to be killed."""

    def __init__(self, path: Path, prefix: tuple[str, ...] = ()) -> None:
        self.proc = subprocess.Popen([*prefix, sys.executable, "-c", OWNER, str(path)],
                                     stdout=subprocess.PIPE, text=True, start_new_session=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.strip() == "paused", f"owner did not pause (exit {self.proc.poll()})"

    def kill(self) -> None:
        """SIGKILL, not reaped: the owner stays a zombie until wait()."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def wait(self) -> None:
        self.kill()
        self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture
def owners() -> Iterator[list[Owner]]:
    started: list[Owner] = []
    yield started
    for o in started:
        o.wait()


def state(pid: int) -> str:
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rfind(")") + 2]


def test_the_pause_of_a_killed_owner_is_void_at_the_next_check(
        tmp_path: Path, owners: list[Owner]) -> None:
    path = tmp_path / "plugin.pause"
    watcher = PauseWatcher(path)
    owner = Owner(path)
    owners.append(owner)
    doc = json.loads(path.read_text())
    assert (doc["pid"], doc["pid_start"]) == (owner.proc.pid, process_start(owner.proc.pid))
    assert watcher.poll() and watcher.covers("GPU-a")
    owner.kill()
    deadline = time.monotonic() + 10
    while state(owner.proc.pid) != "Z":  # killed, not yet reaped: a zombie is no owner
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert watcher.poll() and not watcher.paused  # at once, not after `expires`
    assert not path.exists() and not (tmp_path / "plugin.pause.ack").exists()
    owner.wait()  # and reaped: nothing comes back
    assert not watcher.poll() and not watcher.paused


def test_a_live_owner_holds_its_pause(tmp_path: Path, owners: list[Owner]) -> None:
    path = tmp_path / "plugin.pause"
    watcher = PauseWatcher(path)
    owners.append(Owner(path))
    assert watcher.poll() and watcher.paused
    for _ in range(20):  # every tick re-checks the owner
        assert not watcher.poll()
        time.sleep(0.02)
    assert watcher.paused and path.exists()


def test_a_reused_pid_is_not_the_owner(tmp_path: Path) -> None:
    """Same PID, another start time: the owner died and its PID went to a new process."""
    path = tmp_path / "plugin.pause"
    me = owner_record()
    assert me["pid_start"] is not None and me["pid_ns"] is not None
    doc = {"token": "t", "gpus": [], "expires": time.time() + 900, **me}
    path.write_text(json.dumps(doc))
    assert read_pause(path) is not None  # the real owner (this process) holds
    path.write_text(json.dumps({**doc, "pid_start": me["pid_start"] + 1}))
    assert read_pause(path) is None and not path.exists()


def test_an_owner_the_reader_cannot_see_is_judged_by_its_lock(tmp_path: Path) -> None:
    """Another PID namespace (the agent's pod and a MIG apply on the host): the PID means
    nothing to the reader, the owner's flock does."""
    path = tmp_path / "plugin.pause"
    doc = {"token": "t", "gpus": [], "expires": time.time() + 900, **owner_record(),
           "pid_ns": "pid:[1]"}  # no namespace has inode 1: not the reader's
    fd = write_pause(path, doc)
    try:
        assert read_pause(path) is not None
    finally:
        os.close(fd)  # as the kernel does when the owner dies
    assert read_pause(path) is None and not path.exists()
    # Without a lock to test (an older writer): only `expires` can end it.
    path.write_text(json.dumps({**doc, "lock": False}))
    assert read_pause(path) is not None


def test_a_void_pause_is_not_confused_with_a_newer_one(tmp_path: Path) -> None:
    """Removing a void pause must not remove a pause written just before: whatever is at the
    path when the reader removes is put back unless it is the inode it judged void."""
    from gpukit.plugin.mig import pause

    path = tmp_path / "plugin.pause"
    path.write_text(json.dumps({"token": "old"}))
    void_ino = path.stat().st_ino
    newer = PauseFile(path)
    newer.pause([(0, "GPU-a")], "x")  # replaces the file: a new inode
    pause._remove_void(path, void_ino)
    assert json.loads(path.read_text())["gpus"] == ["GPU-a"]
    assert read_pause(path) is not None  # and it is still locked by its owner
    newer.resume()
    assert not path.exists()


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="a PID namespace needs root and unshare")  # fmt: skip
def test_a_killed_owner_in_another_pid_namespace(tmp_path: Path, owners: list[Owner]) -> None:
    path = tmp_path / "plugin.pause"
    watcher = PauseWatcher(path)
    owner = Owner(path, ("unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--"))
    owners.append(owner)
    doc = json.loads(path.read_text())
    assert doc["pid"] == 1 and doc["pid_ns"] != pid_namespace()
    assert watcher.poll() and watcher.paused
    for _ in range(5):
        assert not watcher.poll()
    owner.wait()  # unshare reaped; its child, the owner, dies with it (--kill-child)
    deadline = time.monotonic() + 10
    while not watcher.poll():
        assert time.monotonic() < deadline, "the owner's lock was never freed"
        time.sleep(0.02)
    assert not watcher.paused and not path.exists()
