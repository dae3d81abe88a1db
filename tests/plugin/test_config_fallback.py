"""Bad input never takes a node's GPUs away (issue 14 points 1, 2): an agent restarted into an
unknown, malformed, binary or non-UTF-8 selected config serves its last good one and says so (node label,
Event, metric); an empty config is refused like any invalid one; with no last good config the
agent refuses loudly as before."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from plugin_testlib import T4, FakeBackend, FakeKubelet, FakeNode, make_gpu, make_inventory

from gpukit.contracts import label_names as ln
from gpukit.contracts.plugin_config import ConfigError
from gpukit.plugin.config_source import ConfigSource, Override
from gpukit.plugin.manager import ManagerOptions, PluginManager

PRODUCT_LABEL = ln.resource_label(ln.GPU_RESOURCE, ln.PRODUCT)
COUNT_LABEL = ln.resource_label(ln.GPU_RESOURCE, ln.COUNT)
SHARED = ("version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
          "    - {name: nvidia.com/gpu, replicas: 4}\n")


def wait_until(what: str, check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def agent(tmp: Path, node: FakeNode, record: Path | None) -> PluginManager:
    """An agent on node n1 with two T4s, choosing among tmp/configs by n1's label."""
    source = ConfigSource(config_dir=tmp / "configs", node_name="n1", label_reader=node.labels,
                          overrides=[Override("gpukit.kubeletDir", str(tmp), "test"),
                                     Override("gpukit.rescanIntervalSeconds", 0, "test")])
    return PluginManager(
        source, FakeBackend(make_inventory([make_gpu(0, T4), make_gpu(1, T4)])),
        options=ManagerOptions(tick=0.05, health=False, config_poll_seconds=0.1,
                               node_labels=True,
                               last_good_file=str(record) if record else None),
        node_client=node,  # type: ignore[arg-type]
    )


def served(m: PluginManager) -> dict[str, int]:
    return {name: len(r.devices) for name, r in m.resources.resources.items()}


@pytest.fixture
def configs(short_tmp: Path) -> Path:
    d = short_tmp / "configs"
    d.mkdir()
    (d / "default").write_text("version: v1\n")
    (d / "shared").write_text(SHARED)
    return d


@pytest.mark.parametrize("bad", ["unknown", "malformed", "empty", "binary", "not-utf8",
                                 "oversized", "loader-exception"])
def test_a_restart_into_bad_input_serves_the_last_good_config(
        kubelet: FakeKubelet, short_tmp: Path, configs: Path, bad: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    record = short_tmp / "state" / "last-good.json"
    node = FakeNode({ln.DEVICE_PLUGIN_CONFIG: "shared"})
    first = agent(short_tmp, node, record)
    first.start()
    try:
        assert served(first) == {"nvidia.com/gpu": 8}
        assert node.labels_now[ln.DEVICE_PLUGIN_CONFIG_STATE] == "success"
    finally:
        first.stop()
    assert json.loads(record.read_text())["name"] == "shared"

    # The input goes bad while the agent is down (a reboot, a rollout, an eviction).
    if bad == "unknown":
        node.labels_now[ln.DEVICE_PLUGIN_CONFIG] = "no-such-config"
    elif bad == "malformed":
        (configs / "shared").write_text("version: v1\nsharing: [unclosed\n")
    elif bad == "empty":
        (configs / "shared").write_text("")
    elif bad == "binary":  # a ConfigMap binaryData entry, mounted as its raw bytes
        (configs / "shared").write_bytes(b"\x1f\x8b\x08\x00" + bytes(64))
    elif bad == "oversized":
        (configs / "shared").write_text(SHARED + "#" * (2 << 20) + "\n")
    elif bad == "loader-exception":  # any surprise while loading takes the last-good path too
        def broken(path: Path) -> dict[str, object]:
            raise RecursionError("maximum recursion depth exceeded")

        monkeypatch.setattr("gpukit.plugin.config_source.load_document", broken)
    else:
        (configs / "shared").write_bytes(SHARED.replace("4", "\xe9").encode("latin-1"))
    second = agent(short_tmp, node, record)
    second.start()
    try:
        assert served(second) == {"nvidia.com/gpu": 8}, "the restart lost the node's GPUs"
        assert second.loaded is not None and second.loaded.name == "shared"
        assert node.labels_now[ln.DEVICE_PLUGIN_CONFIG_STATE] == "failed"
        assert second.metrics.config_failed._value.get() == 1
        [(reason, message, kind)] = node.events
        assert (reason, kind) == ("DevicePluginConfigRefused", "Warning")
        expected = {"unknown": "names no config", "malformed": "malformed YAML",
                    "empty": "the config is empty", "binary": "binary, not text",
                    "not-utf8": "not UTF-8 text", "oversized": "larger than 1048576 bytes",
                    "loader-exception": "cannot be loaded: RecursionError: maximum"}[bad]
        assert expected in message and "serving the last good config 'shared'" in message
        # Fixing the input brings the state back, and the fixed config is the new record.
        if bad == "unknown":
            node.labels_now[ln.DEVICE_PLUGIN_CONFIG] = "default"
        elif bad == "loader-exception":
            monkeypatch.undo()
            (configs / "shared").write_text("version: v1\n")
        else:
            (configs / "shared").write_text("version: v1\n")
        wait_until("state success", lambda: node.labels_now.get(
            ln.DEVICE_PLUGIN_CONFIG_STATE) == "success")
        wait_until("defaults served", lambda: served(second) == {"nvidia.com/gpu": 2})
        assert second.metrics.config_failed._value.get() == 0
        assert json.loads(record.read_text())["document"] == {"version": "v1"}
    finally:
        second.stop()


def test_with_no_last_good_config_a_bad_start_is_refused(
        kubelet: FakeKubelet, short_tmp: Path, configs: Path) -> None:
    node = FakeNode({ln.DEVICE_PLUGIN_CONFIG: "no-such-config"})
    m = agent(short_tmp, node, short_tmp / "never-written.json")
    with pytest.raises(ConfigError, match="names no config"):
        m.start()
    m.stop()
    assert not (short_tmp / "never-written.json").exists()


def test_a_record_that_no_longer_validates_is_not_served(
        kubelet: FakeKubelet, short_tmp: Path, configs: Path) -> None:
    record = short_tmp / "last-good.json"
    record.write_text(json.dumps({"format": 1, "name": "old", "path": "", "savedAt": 0,
                                  "document": {"version": "v2"}}))
    m = agent(short_tmp, FakeNode({ln.DEVICE_PLUGIN_CONFIG: "gone"}), record)
    with pytest.raises(ConfigError, match="names no config"):
        m.start()
    m.stop()


def test_a_live_reload_into_bad_input_reports_once_and_keeps_serving(
        kubelet: FakeKubelet, short_tmp: Path, configs: Path) -> None:
    node = FakeNode({ln.DEVICE_PLUGIN_CONFIG: "shared"})
    m = agent(short_tmp, node, None)
    m.start()
    try:
        (configs / "shared").write_text("")  # an empty entry is not "defaults"
        wait_until("state failed", lambda: node.labels_now.get(
            ln.DEVICE_PLUGIN_CONFIG_STATE) == "failed")
        assert served(m) == {"nvidia.com/gpu": 8}
        time.sleep(0.5)  # several config polls: still one Event for one problem
        assert [e[0] for e in node.events] == ["DevicePluginConfigRefused"]
        assert "keeping the current config" in node.events[0][1]
    finally:
        m.stop()


def test_drifted_owned_labels_come_back_and_others_are_left_alone(
        kubelet: FakeKubelet, short_tmp: Path, configs: Path) -> None:
    node = FakeNode({"team": "a"})
    m = agent(short_tmp, node, None)
    m.start()
    try:
        wait_until("labels", lambda: node.labels_now.get(PRODUCT_LABEL) == "Tesla-T4")
        node.touch({PRODUCT_LABEL: "hand-edited", COUNT_LABEL: None, "team": "b",
                    "nvidia.com/someone-else": "x"})
        wait_until("restored", lambda: node.labels_now.get(PRODUCT_LABEL) == "Tesla-T4"
                   and node.labels_now.get(COUNT_LABEL) == "2", timeout=2)
        assert node.labels_now["team"] == "b"
        assert node.labels_now["nvidia.com/someone-else"] == "x"
        assert m.metrics.labels_restored._value.get() == 2
    finally:
        m.stop()


def test_labels_are_reasserted_periodically_without_a_watch(
        kubelet: FakeKubelet, short_tmp: Path, configs: Path) -> None:
    node = FakeNode({})
    m = agent(short_tmp, node, None)
    m.options.label_reassert_seconds = 0.2
    m.start()
    try:
        wait_until("labels", lambda: node.labels_now.get(PRODUCT_LABEL) == "Tesla-T4")
        node.labels_now[PRODUCT_LABEL] = "edited-unseen"  # no watch event
        wait_until("re-asserted", lambda: node.labels_now.get(PRODUCT_LABEL) == "Tesla-T4")
    finally:
        m.stop()


def test_a_config_rewritten_while_it_is_read_is_read_again(
        kubelet: FakeKubelet, short_tmp: Path, configs: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An editor truncates, then writes: a read that lands between the two sees an empty
    file. The write that follows is a change the agent reads, not the input it just refused
    (seen under load in CI: the fixed config never served, state stuck at failed)."""
    node = FakeNode({ln.DEVICE_PLUGIN_CONFIG: "shared"})
    m = agent(short_tmp, node, None)
    m.start()
    try:
        assert served(m) == {"nvidia.com/gpu": 8}
        load = m.source.load
        calls = []

        def read_mid_write() -> object:
            calls.append(1)
            if len(calls) == 1:  # the write ends just after this read saw an empty file
                (configs / "shared").write_text("version: v1\n")
                raise ConfigError("<root>: the config is empty")
            return load()

        monkeypatch.setattr(m.source, "load", read_mid_write)
        (configs / "shared").write_text("")
        wait_until("the refused read", lambda: len(calls) >= 1)
        wait_until("the rewritten config served", lambda: served(m) == {"nvidia.com/gpu": 2})
        wait_until("state success", lambda: node.labels_now.get(
            ln.DEVICE_PLUGIN_CONFIG_STATE) == "success")
    finally:
        m.stop()
