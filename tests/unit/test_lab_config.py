"""Bad lab input gets a clear error naming the setting and value, and starts nothing."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gpukit.lab import config, controlplane
from gpukit.lab.config import LabConfigError, LabSpec, NodeSpec, parse_nodes
from gpukit.lab.controlplane import LabError
from gpukit.lab.procs import ProcTable


def test_default_lab_has_two_nodes_with_different_hardware() -> None:
    nodes = parse_nodes(config.DEFAULT_NODES)
    assert [n.name for n in nodes] == ["gpu-a100", "gpu-t4"]
    assert nodes[0].profile != nodes[1].profile


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("gpu-x=no-such-profile", "unknown profile 'no-such-profile'"),
        ("gpu-x", "is not name=profile"),
        ("GPU_X=t4-x2", "node name 'GPU_X' is not a DNS label"),
        ("a=t4-x2,a=t4-x2", "appears twice"),
        ("", "no nodes given"),
    ],
)
def test_bad_node_settings_name_the_value(text: str, needle: str) -> None:
    with pytest.raises(LabConfigError, match="GPUKIT_LAB_NODES") as e:
        parse_nodes(text)
    assert needle in str(e.value)


def test_addresses_stay_inside_the_lab_ranges() -> None:
    spec = LabSpec(nodes=parse_nodes(config.DEFAULT_NODES))
    assert spec.api_address == "198.18.0.1"
    for n in spec.nodes:
        addr = n.address(spec)
        assert addr.startswith("10.244.77.")
        assert addr != spec.host_address


def test_an_occupied_port_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        spec = LabSpec(nodes=(NodeSpec("n", "t4-x2", 1),), etcd_client_port_override=port)
        table = ProcTable(tmp_path / "pids")
        with pytest.raises(LabError, match=rf"port 127.0.0.1:{port} is in use"):
            controlplane.start(spec, table, "etcd", tmp_path)
        assert table.names() == []


def test_lab_up_without_root_says_so() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to drop to an unprivileged user")
    r = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
         sys.executable, "-m", "gpukit.cli", "lab", "up"],
        capture_output=True, text=True, env={**os.environ, "HOME": "/tmp"},
    )  # fmt: skip
    assert r.returncode == 2
    assert "the lab needs root" in r.stderr


def test_unknown_profile_from_the_cli_is_a_clear_error() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "gpukit.cli", "lab", "status"],
        capture_output=True, text=True, env={**os.environ, "GPUKIT_LAB_NODES": "n1=h200-x99"},
    )  # fmt: skip
    assert r.returncode == 2
    assert "unknown profile 'h200-x99'" in r.stderr


def test_lab_instances_claim_nothing_in_common(monkeypatch: pytest.MonkeyPatch) -> None:
    nodes = parse_nodes(config.DEFAULT_NODES)
    specs = [LabSpec(nodes=nodes, instance=i) for i in range(10)]
    ports: list[int] = []
    for s in specs:
        ports += [s.etcd_client_port, s.etcd_peer_port, s.controller_manager_port, s.scheduler_port]
    assert len(ports) == len(set(ports)), "two instances share a port"
    for a in specs:
        for b in specs:
            if a is not b:
                assert not a.network.overlaps(b.network)
                assert not a.service_cidr.overlaps(b.service_cidr)
                assert a.bridge != b.bridge and a.prefix != b.prefix
    monkeypatch.setenv("GPUKIT_LAB_INSTANCE", "3")
    assert config.state_dir() == Path("/var/lib/gpukit-lab-3")
    monkeypatch.setenv("GPUKIT_LAB_INSTANCE", "12")
    with pytest.raises(LabConfigError, match="GPUKIT_LAB_INSTANCE: '12'"):
        config.load_spec()
