"""`lab down` leaves nothing behind, and a second `lab up` works (runs last in tests/lab)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from gpukit.lab import cgroups, cluster, network
from gpukit.lab.config import load_spec

pytestmark = pytest.mark.lab


def test_down_cleans_everything_and_up_again_works(lab_cluster: object) -> None:
    spec = load_spec()
    t = cluster.table()
    procs = [p for n in t.names() if (p := t.get(n)) is not None]
    node_pids = {n.name: cgroups.procs(n.name) for n in spec.nodes}
    record = json.loads(cluster.SYSCTL_RECORD.read_text())
    assert spec.instance in record["holders"]
    others = [h for h in record["holders"] if h != spec.instance]
    assert procs and all(node_pids.values())

    cluster.down(spec, say=lambda _m: None)

    assert not [p for p in procs if p.alive()], "a lab process outlived `lab down`"
    for name, pids in node_pids.items():
        alive = [pid for pid in pids if Path(f"/proc/{pid}").exists()
                 and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"]  # fmt: skip
        assert not alive, f"node {name}: processes {alive} outlived `lab down`"
        assert not any(d.exists() for d in cgroups.node_dirs(name).values())
    for n in spec.nodes:
        assert not network.netns_path(n, spec).exists()
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert f" {spec.bridge}:" not in links and f"gk{spec.instance}-" not in links
    if others:  # another lab instance still needs the kernel tunables the kubelet wants
        assert json.loads(cluster.SYSCTL_RECORD.read_text())["holders"] == others
        for key, value in cluster.KUBELET_SYSCTLS.items():
            assert Path("/proc/sys", key).read_text().strip() == value
        for key, floor in cluster.SYSCTL_FLOORS.items():
            assert int(Path("/proc/sys", key).read_text()) >= floor
    else:
        for key, value in record["saved"].items():
            assert Path("/proc/sys", key).read_text().strip() == value, f"sysctl {key} not restored"
        assert not cluster.SYSCTL_RECORD.exists()

    cluster.up(spec, say=lambda _m: None)
    assert cluster.status(spec).up
