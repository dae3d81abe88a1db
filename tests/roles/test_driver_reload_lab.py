"""A driver branch change on the lab without a reboot: role nvidia_driver reloads the kernel
modules (the stand-in's modprobe), and reboots only when a process holds a GPU device.

The tests share one lab and run in order, on a copy of the lab's inventory edited as a user
would (group_vars/gpu_nodes.yml's nvidia_driver_branch). The stand-in driver behaves as the
real one after a package upgrade: the new libnvidia-ml.so.<version> answers nvmlInit with
"version mismatch" until the modules are reloaded, and the unload is refused while a process
holds a /dev/nvidia* file. Whether a node rebooted is its boot count (its init's record).

Story: the lab converged on 550; a rollout to 570 reloads them on both nodes (no reboot, NVML and /proc/driver report 570, the
node agent back, a GPU pod runs); a second rollout changes nothing; with a process holding
/dev/nvidia0 on the second node, the rollout back to 550 reboots that node and names the
process, and reloads the first. The lab is left on 550, as its inventory declares.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client
from labplay import PlayResult, assert_nothing_rolled, branch_version, report_lines
from labtools import DriverLab, boots, delete_namespace, release_nodes, site_lab

from gpukit.lab.images import SHELL
from gpukit.lab.observe import Timeline
from gpukit.provision.upgrade import STATE_LABEL

pytestmark = pytest.mark.lab

FIRST, SECOND = "gpu-a100", "gpu-t4"
NS = "gpukit-driver-reload-test"
PLAN = "Plan how the installed driver becomes the running one"
RELOAD = "Unload the old modules, load the new ones and check them through NVML"
HOLDER = "gpukit-test-gpu-holder"


@dataclass
class Lab(DriverLab):
    def boots(self, node: str) -> int:
        return boots(self.spec.node(node))

    def proc_driver_version(self, node: str) -> str:
        return self.sh(node, "cat /proc/driver/nvidia/version")


@pytest.fixture(scope="module")
def lab(lab_cluster: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    lab = site_lab(tmp_path_factory, "driver-reload").as_(Lab, core=client.CoreV1Api())
    for node in (FIRST, SECOND):
        lab.sh(node, f"systemctl stop {HOLDER} 2>/dev/null || true")
    release_nodes(lab.core, [FIRST, SECOND], STATE_LABEL)
    # The lab as its inventory declares (550): site.yml only when a node runs another driver
    # (the tests' upgrade.yml runs converge the rest of the node).
    if any(lab.running_driver(n) != branch_version("550") for n in (FIRST, SECOND)):
        r = lab.site(var_files=())
        assert r.rc == 0 and not r.failed, r.describe()
    delete_namespace(lab.core, NS, timeout=60)
    lab.core.create_namespace({"metadata": {"name": NS}})
    yield lab
    for node in (FIRST, SECOND):
        lab.sh(node, f"systemctl stop {HOLDER} 2>/dev/null || true")
    delete_namespace(lab.core, NS, timeout=60)


def activation(r: PlayResult, host: str, task: str) -> dict[str, Any]:
    res = r.results.get(host, {}).get(task)
    assert res is not None and "activation" in res, f"{host}: no {task!r} in {r.describe()}"
    out: dict[str, Any] = res["activation"]
    return out


def gpu_pod_runs(lab: Lab, node: str) -> None:
    """A pod asking for one GPU is admitted on `node`, gets a device and exits 0."""
    name = f"gpu-check-{node}"
    lab.core.create_namespaced_pod(NS, {
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
            "containers": [{
                "name": "main", "image": SHELL, "imagePullPolicy": "Never",
                "command": ["sh", "-c", "ls /dev/nvidia[0-9]*"],
                "resources": {"limits": {"nvidia.com/gpu": "1"}},
            }],
        },
    })  # fmt: skip
    deadline = time.monotonic() + 120
    phase = None
    while time.monotonic() < deadline:
        phase = lab.core.read_namespaced_pod(name, NS).status.phase
        if phase in ("Succeeded", "Failed"):
            break
        time.sleep(1)
    assert phase == "Succeeded", f"{node}: the GPU pod ended {phase}"


@pytest.mark.timeout(1500)
def test_upgrade_reloads_the_driver_without_a_reboot(lab: Lab) -> None:
    new = branch_version("570")
    before = {n: lab.boots(n) for n in (FIRST, SECOND)}
    lab.set_branch("570")
    with Timeline(lab.core) as seen:
        r = lab.upgrade()
    assert r.rc == 0 and not r.failed, r.describe()
    assert report_lines(r) == [f"{FIRST}: upgraded and validated",
                               f"{SECOND}: upgraded and validated"]  # fmt: skip
    for node in (FIRST, SECOND):
        assert lab.boots(node) == before[node], f"{node} rebooted"
        done = activation(r, node, RELOAD)
        assert (done["action"], done["reloaded"]) == ("reload", True), done
        assert r.results[node]["Reboot for the installed driver"].get("skipped"), node
        assert lab.running_driver(node) == new
        assert f"Kernel Module  {new}" in lab.proc_driver_version(node)
        # The agent left for the reload and is back, labelling the new driver.
        agents = lab.core.list_namespaced_pod(
            "gpukit-system", label_selector="app.kubernetes.io/name=gpukit-node-agent",
            field_selector=f"spec.nodeName={node}").items  # fmt: skip
        assert [a.status.phase for a in agents] == ["Running"], node
        assert any(e.driver == new for e in seen.node_events(node))
        gpu_pod_runs(lab, node)
        print(f"{node}: unschedulable {seen.unschedulable_periods(node)}")


def test_a_second_run_changes_nothing(lab: Lab) -> None:
    with Timeline(lab.core) as seen:
        r = lab.upgrade()
    assert_nothing_rolled(r, seen.nodes, (FIRST, SECOND))


@pytest.mark.timeout(1500)
def test_a_process_holding_a_gpu_makes_it_a_reboot_and_is_named(lab: Lab) -> None:
    old = branch_version("550")
    lab.sh(SECOND, f"systemd-run --unit {HOLDER} python3 -c "
                   "'import os, time; os.open(\"/dev/nvidia0\", os.O_PATH); time.sleep(3600)'")
    time.sleep(1)
    pid = int(lab.sh(SECOND, f"systemctl show -p MainPID --value {HOLDER}").strip())
    assert pid > 0
    before = {n: lab.boots(n) for n in (FIRST, SECOND)}
    lab.set_branch("550")
    r = lab.upgrade()
    assert r.rc == 0 and not r.failed, r.describe()
    plan = activation(r, SECOND, PLAN)
    assert plan["action"] == "reboot", plan
    assert f"pid {pid} (python3, {HOLDER}.service) holds /dev/nvidia0" in plan["reason"], plan
    assert lab.boots(SECOND) == before[SECOND] + 1
    assert lab.running_driver(SECOND) == old
    # The other node had no holder: reloaded, not rebooted.
    assert activation(r, FIRST, RELOAD)["action"] == "reload"
    assert lab.boots(FIRST) == before[FIRST]
    assert lab.running_driver(FIRST) == old
