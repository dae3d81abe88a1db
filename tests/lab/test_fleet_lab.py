"""A simulated fleet on this lab instance's control plane (GPUKIT_LAB_INSTANCE): stand-in nodes
register Ready with the declared GPUs and labels, stay Ready past the lease duration, and the
suite's API-side checks pass on them while the checks that need a kubelet or the host are
skipped, each naming what it needs (none counted as passed)."""

from __future__ import annotations

import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from gpukit import inventory as inv
from gpukit.k8s import connect
from gpukit.lab import cluster
from gpukit.lab.config import load_spec
from gpukit.lab.controlplane import paths
from gpukit.lab.fleet import inventory as fleet_inventory
from gpukit.lab.fleet import standin

pytestmark = pytest.mark.lab
REPO = Path(__file__).resolve().parents[2]
HOSTS = 24


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, standin.StandIns]]:
    lab = load_spec()
    was_up = cluster.status(lab).components.get("apiserver-ready", False)
    cluster.start_control_plane(lab, say=lambda _m: None)
    path = fleet_inventory.generate(tmp_path_factory.mktemp("fleet") / "inv", HOSTS,
                                    kubeconfig=paths().admin_kubeconfig)
    api = connect.api_client(paths().admin_kubeconfig)
    nodes = standin.StandIns(client.CoreV1Api(api), client.CoordinationV1Api(api))
    nodes.register(inv.load(path))
    nodes.start_renewing(every=5)
    try:
        yield path, nodes
    finally:
        nodes.remove()
        if not was_up:
            cluster.down(lab, say=lambda _m: None)


def test_stand_ins_register_ready_and_stay_ready(fleet: tuple[Path, standin.StandIns]) -> None:
    _, nodes = fleet
    standin.wait_registered(nodes.core, HOSTS, timeout=60)
    lease = nodes.coordination.read_namespaced_lease("sim-0001", standin.LEASE_NAMESPACE)
    first = lease.spec.renew_time
    time.sleep(standin.LEASE_SECONDS + 5)  # past a lease: the node lifecycle controller looks
    assert standin.ready_count(nodes.core) == (HOSTS, HOSTS)
    lease = nodes.coordination.read_namespaced_lease("sim-0001", standin.LEASE_NAMESPACE)
    assert lease.spec.renew_time > first
    assert not nodes.errors


def test_the_api_side_checks_pass_and_the_rest_skip_by_name(
        fleet: tuple[Path, standin.StandIns], tmp_path: Path) -> None:
    path, _ = fleet
    junit = tmp_path / "junit.xml"
    # Not the tenancy area: the stand-ins simulate nodes, not the cluster-wide objects (quotas,
    # LimitRanges, PriorityClasses) site.yml's gpu_quotas role applies, and its pods need a kubelet.
    r = subprocess.run([sys.executable, "-m", "pytest", "gpukit/conformance", "--inventory", str(path),
                        "--kubeconfig", str(paths().admin_kubeconfig), "--api-only", "--no-host",
                        "-m", "not tenancy",
                        "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"],
                       cwd=REPO, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    passed: list[str] = []
    skipped: dict[str, str] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = case.get("name", "")
        assert case.find("failure") is None and case.find("error") is None, name
        skip = case.find("skipped")
        if skip is None:
            passed.append(name)
        else:
            skipped[name] = skip.get("message", "")
    assert "test_capacity_and_allocatable[sim-0001-gpu]" in passed
    assert "test_gfd_labels[sim-0004]" in passed
    assert "test_node_is_registered_and_ready[sim-0003]" in passed
    assert "test_the_agent_s_declaration_condition_agrees[sim-0001]" in passed  # issue 30
    # A check that needs a kubelet is one skipped test for every node, naming what it needs.
    every = f"[every-node-of-{HOSTS}]"
    for test, needs in (("test_devices_are_disjoint", "needs pods running on the node"),
                        ("test_container_runtime_running", "needs the host over SSH"),
                        ("test_kubelet_sees_the_same_devices", "PodResources API")):
        ids = [n for n in skipped if n.startswith(f"{test}[")]
        assert ids == [test + every], ids
        assert needs in skipped[test + every] and f"every node ({HOSTS})" in \
            skipped[test + every], skipped[test + every]
    assert not any(n.startswith(("test_devices_are_disjoint", "test_workload_sees")) for n in
                   passed)
