"""The plugins' MPS daemons through gpukit's MPS control container: requests and status files
under the MPS root (gpukit.plugin.mps_requests), served by gpukit.plugin.mps_control."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from plugin_testlib import ScriptedMpsControl

from gpukit.plugin.mps_control import serve_once
from gpukit.plugin.mps_daemons import DaemonSpec, MpsDaemons, MpsError
from gpukit.plugin.mps_requests import MpsRequests, mps_control, read_status, request_path

GPU0, GPU1 = "GPU-00000000-0000-0000-0000-000000000000", "GPU-11111111-1111-1111-1111-111111111111"


def spec(uuid: str, pct: int = 50) -> DaemonSpec:
    return DaemonSpec(key=uuid, devices=(uuid,), exclusive=(uuid,),
                      memory_limits=((uuid, "7680M"),), thread_percentage=pct)


class Node:
    """One node: a plugin's MpsRequests and the control container's daemons, one MPS root."""

    def __init__(self, root: Path) -> None:
        self.root = str(root)
        self.control = ScriptedMpsControl()
        self.modes: dict[str, bool] = {}
        self.daemons = MpsDaemons(lambda uuid, ex: self.modes.__setitem__(uuid, ex),
                                  run=self.control)
        self.now = 0.0
        self.passes = 0
        self.controller_up = True

    def tick(self, seconds: float) -> None:
        """The plugin waits; meanwhile the control container makes a pass."""
        self.now += seconds
        if self.controller_up:
            self.passes += 1
            serve_once(self.daemons, self.root)

    def plugin(self) -> MpsRequests:
        return MpsRequests(start_timeout=5.0, poll_seconds=1.0, sleep=self.tick,
                           clock=lambda: self.now)


def test_a_claims_daemon_is_started_by_the_control_container_and_stopped_again(
        tmp_path: Path) -> None:
    node = Node(tmp_path)
    plugin = node.plugin()
    plugin.start(node.root, spec(GPU0))
    pipe = str(tmp_path / GPU0 / "pipe")
    assert node.control.daemons[pipe] == {
        "set_default_device_pinned_mem_limit": f"{GPU0} 7680M",
        "set_default_active_thread_percentage": "50"}
    assert node.modes == {GPU0: True}
    status = read_status(node.root, GPU0)
    assert status is not None and status.serving and status.spec == spec(GPU0)
    plugin.stop(node.root, GPU0)
    assert node.control.daemons == {} and node.modes == {GPU0: False}
    assert not (tmp_path / GPU0).exists()
    assert not Path(request_path(node.root, GPU0)).exists()


def test_a_daemon_that_cannot_start_is_refused_with_the_control_containers_reason(
        tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.control.fail_start = True
    with pytest.raises(MpsError, match=f"MPS daemon {GPU0}: did not start: cannot start"):
        node.plugin().start(node.root, spec(GPU0))
    # Nothing half-applied: the request is withdrawn, the next pass clears the daemon's dir.
    assert not Path(request_path(node.root, GPU0)).exists()
    node.tick(1.0)
    assert node.modes == {GPU0: False} and not (tmp_path / GPU0).exists()


def test_without_a_control_container_start_says_which_daemonset_to_look_at(
        tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.controller_up = False
    with pytest.raises(MpsError, match=r"DaemonSet gpukit-mps-control.*within 5 s"):
        node.plugin().start(node.root, spec(GPU0))
    assert not Path(request_path(node.root, GPU0)).exists()


def test_reconcile_asks_without_waiting_and_withdraws_only_its_own_keys(tmp_path: Path) -> None:
    node = Node(tmp_path)
    agent = node.plugin()
    dra = node.plugin()
    claim = DaemonSpec(key="claim-1", devices=(GPU1,), exclusive=(GPU1,))
    dra.start(node.root, claim)
    problems = agent.reconcile(node.root, {GPU0: spec(GPU0)}, "GPU-")
    assert problems == {GPU0: f"MPS daemon {GPU0}: waiting for gpukit's MPS control container"}
    assert node.passes == 1  # the claim's start waited for one pass; reconcile did not wait
    node.tick(1.0)
    assert agent.reconcile(node.root, {GPU0: spec(GPU0)}, "GPU-") == {}
    # New limits: a problem until the control container configured the daemon again.
    assert GPU0 in agent.reconcile(node.root, {GPU0: spec(GPU0, pct=25)}, "GPU-")
    node.tick(1.0)
    assert agent.reconcile(node.root, {GPU0: spec(GPU0, pct=25)}, "GPU-") == {}
    assert node.control.daemons[str(tmp_path / GPU0 / "pipe")][
        "set_default_active_thread_percentage"] == "25"
    # The agent's config leaves MPS: its daemon goes, the claim's stays.
    assert agent.reconcile(node.root, {}, "GPU-") == {}
    node.tick(1.0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["claim-1", "requests", "shm"]
    assert node.modes == {GPU0: False, GPU1: True}


def test_a_failing_daemon_is_a_problem_of_the_agent_until_it_serves(tmp_path: Path) -> None:
    node = Node(tmp_path)
    agent = node.plugin()
    node.control.fail_command = "set_default_active_thread_percentage"
    agent.reconcile(node.root, {GPU0: spec(GPU0)}, "GPU-")
    node.tick(1.0)
    problems = agent.reconcile(node.root, {GPU0: spec(GPU0)}, "GPU-")
    assert "control command 'set_default_active_thread_percentage': refused" in problems[GPU0]
    node.control.fail_command = ""
    node.tick(1.0)
    assert agent.reconcile(node.root, {GPU0: spec(GPU0)}, "GPU-") == {}


def test_an_unreadable_request_is_logged_and_the_others_served(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    node = Node(tmp_path)
    node.plugin().reconcile(node.root, {GPU0: spec(GPU0)}, "GPU-")
    (tmp_path / "requests" / "GPU-bad.json").write_bytes(b"\xff\xfe not json")
    (tmp_path / "requests" / "claim-2.json").write_text(json.dumps({"key": "claim-3"}))
    node.tick(1.0)
    assert str(tmp_path / GPU0 / "pipe") in node.control.daemons
    assert "MPS daemon request GPU-bad.json: unreadable" in caplog.text
    assert "MPS daemon request claim-2.json: names key 'claim-3'" in caplog.text


def test_who_runs_the_daemons_is_one_of_three_and_nothing_else() -> None:
    assert isinstance(mps_control("own", lambda u, e: None), MpsDaemons)
    assert isinstance(mps_control("delegate", lambda u, e: None), MpsRequests)
    assert mps_control("none", lambda u, e: None) is None
    with pytest.raises(ValueError, match=r"GPUKIT_MPS_DAEMONS\): 'delegated' is not one of "
                                         "own, delegate, none"):
        mps_control("delegated", lambda u, e: None)
