"""The lab is a real cluster of systemd nodes, confined to this machine."""

from __future__ import annotations

import ipaddress
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from labtools import boots, wait_for

from gpukit.lab import cgroups, cluster, network, nodes, smoke
from gpukit.lab.config import load_spec
from gpukit.lab.controlplane import paths

pytestmark = pytest.mark.lab


def _kubectl(*args: str) -> str:
    spec = load_spec()
    r = subprocess.run(
        [str(cluster.kubernetes_bindir(spec) / "kubectl"),
         f"--kubeconfig={paths().admin_kubeconfig}", *args],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return r.stdout


def _ssh(address: str, command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ssh", "-i", str(nodes.ssh_key()), "-o", "StrictHostKeyChecking=no",
         "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5",
         f"root@{address}", command],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip


def test_every_node_is_ready_on_the_lab_network(lab_cluster: object) -> None:
    spec = load_spec()
    items = json.loads(_kubectl("get", "nodes", "-o", "json"))["items"]
    by_name = {i["metadata"]["name"]: i for i in items}
    assert sorted(by_name) == sorted(spec.node_names())
    for n in spec.nodes:
        node = by_name[n.name]
        conds = {c["type"]: c["status"] for c in node["status"]["conditions"]}
        assert conds["Ready"] == "True", f"{n.name}: {conds}"
        addrs = {a["type"]: a["address"] for a in node["status"]["addresses"]}
        assert addrs["InternalIP"] == n.address(spec)
        assert ipaddress.ip_address(addrs["InternalIP"]) in spec.network
        assert node["status"]["nodeInfo"]["kubeletVersion"] == spec.k8s_version


def test_nodes_are_ssh_reachable_systemd_machines(lab_cluster: object) -> None:
    spec = load_spec()
    machine_ids = set()
    for n in spec.nodes:
        r = _ssh(
            n.address(spec),
            "hostname; systemctl is-system-running; systemctl is-active containerd kubelet;"
            " cat /etc/machine-id; ps -o comm= -p 1",
        )
        assert r.returncode == 0, r.stderr
        lines = r.stdout.split()
        assert lines[0] == n.name
        assert lines[1] == "running", r.stdout
        assert lines[2:4] == ["active", "active"]
        machine_ids.add(lines[4])
        assert lines[5] == "systemd"
    assert len(machine_ids) == len(spec.nodes), "each node needs its own machine-id"


def test_pods_run_on_each_node_and_see_its_device_files(lab_cluster: object) -> None:
    spec = load_spec()
    seen = smoke.run(spec)
    assert seen == {n.name: nodes.gpu_count(n.profile) for n in spec.nodes}
    assert len(set(seen.values())) > 1, "lab nodes should differ in hardware"


def test_lab_up_again_is_a_quick_no_op(lab_cluster: object) -> None:
    spec = load_spec()
    before = {c: cluster.table().get(c) for c in cluster.COMPONENTS}
    messages: list[str] = []
    t0 = time.monotonic()
    cluster.up(spec, say=messages.append)
    assert time.monotonic() - t0 < 15
    assert messages == ["lab is up (nothing to do)"]
    assert {c: cluster.table().get(c) for c in cluster.COMPONENTS} == before


_ALLOWED = [ipaddress.ip_network(n) for n in ("127.0.0.0/8", "::1/128", "0.0.0.0/32", "::/128")]


def _remote_addresses(netns: Path | None, pids: set[int]) -> list[tuple[str, int]]:
    """TCP/UDP peers of sockets owned by `pids` in one network namespace."""
    prefix = ["nsenter", f"--net={netns}"] if netns else []
    out = subprocess.run(
        [*prefix, "ss", "-tunapH"], capture_output=True, text=True, check=True
    ).stdout
    found = []
    for line in out.splitlines():
        owners = {int(p) for p in re.findall(r"pid=(\d+)", line)}
        if not owners & pids:
            continue
        peer = line.split()[5]
        host = peer.rsplit(":", 1)[0].strip("[]").split("%")[0]
        if host != "*":
            found.append((host, next(iter(owners & pids))))
    return found


def test_no_lab_process_talks_to_anything_off_the_machine(lab_cluster: object) -> None:
    spec = load_spec()
    allowed = [*_ALLOWED, spec.network, spec.service_cidr, spec.pod_network]
    t = cluster.table()
    host_pids = {p.pid for name in t.names() if (p := t.get(name)) is not None}
    checked = 0
    for netns, pids in [(None, host_pids)] + [
        (network.netns_path(n, spec), cgroups.procs(n.name)) for n in spec.nodes
    ]:
        assert pids
        for host, pid in _remote_addresses(netns, pids):
            checked += 1
            ip = ipaddress.ip_address(host)
            assert any(ip in net for net in allowed), f"pid {pid} talks to {host} (netns {netns})"
    assert checked > 0, "expected some lab connections (kubelets to the apiserver)"


def test_a_killed_component_is_detected_and_repaired(lab_cluster: object) -> None:
    spec = load_spec()
    t = cluster.table()
    victim = t.get("kube-scheduler")
    assert victim is not None
    os.kill(victim.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while victim.alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    st = cluster.status(spec)
    assert not st.up and not st.components["kube-scheduler"]
    cluster.up(spec)
    assert cluster.status(spec).up
    assert t.get("kube-scheduler") != victim


def test_a_node_whose_supervisor_was_killed_is_rebooted_by_lab_up(lab_cluster: object) -> None:
    spec = load_spec()
    n = spec.nodes[-1]
    t = cluster.table()
    sup = t.get(f"node-{n.name}")
    init = cluster.init_proc(n)
    assert sup is not None and init is not None
    os.kill(sup.pid, signal.SIGKILL)
    time.sleep(0.3)
    assert not cluster.status(spec).nodes[n.name]["supervisor"]
    cluster.up(spec)
    assert cluster.status(spec).up
    new_init = cluster.init_proc(n)
    assert new_init is not None and new_init != init
    assert not init.alive()


def test_a_node_reboots_like_a_machine(lab_cluster: object) -> None:
    spec = load_spec()
    n = spec.nodes[0]
    before = boots(n)
    r = _ssh(n.address(spec), "systemctl reboot")
    assert r.returncode in (0, 255), r.stderr  # the connection may drop as the node goes down
    wait_for(f"{n.name} back from a reboot", lambda: boots(n) > before and _ssh(
        n.address(spec), "systemctl is-active kubelet").stdout.strip() == "active", timeout=60)
    assert cluster.status(spec).up or cluster.up(spec)
