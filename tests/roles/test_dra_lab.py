"""site.yml with a node group on DRA: the lab inventory with gpu-t4 declared
`gpukit_gpu_allocation: dra` and `gpukit_dra_shares: 2` (host_vars, as GPUKIT_LAB_DRA=t4_nodes
writes them), gpu-a100 on the device plugin.

site.yml converges both nodes: node_labels labels gpu-t4 gpukit.io/gpu.allocation=dra,
gpukit.io/dra.shares=2 and nvidia.com/gpu.deploy.device-plugin=false, so the node agent's
DaemonSet leaves it and the DRA plugin's runs there; device_plugin applies both sides and waits
until gpu-t4's ResourceSlices publish its declared GPUs, shared by 2 claims each (and gpu-a100
advertises its resources). gpu-t4 then has no
nvidia.com/ resource in its status; the conformance suite (every area, dra and metrics
included) passes on both nodes; a second run changes nothing, and check mode with gpu-t4
declared back on the device plugin reports the label change without making it. Afterwards the
lab is left as its own inventory declares it (gpu-t4 back on the device plugin).

A fresh lab's gpu-t4 never had a device plugin; on a lab an earlier test provisioned, site.yml
first switches the node (the device_plugin role's allocation switch).
"""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from labplay import REPO, PlayResult
from labtools import ApiLab, site_lab

from gpukit.agent_manifests import APP, DRA_APP
from gpukit.contracts import label_names as ln
from gpukit.lab.controlplane import paths
from gpukit.provision import agent, declaration

pytestmark = [pytest.mark.lab, pytest.mark.timeout(2400)]  # site.yml on a fresh lab

A100, T4 = "gpu-a100", "gpu-t4"
SHARES = 2  # gpukit_dra_shares of gpu-t4, as GPUKIT_LAB_DRA=t4_nodes declares it
LABEL_TASK = "Label and taint the node"


@dataclass
class Lab(ApiLab):  # its inventory: the lab's, gpu-t4 on DRA
    def play(self, *args: str, inventory: Path | None = None, timeout: float = 1800
             ) -> PlayResult:
        return self.site(*args, inventory=inventory, timeout=timeout)


@pytest.fixture(scope="module")
def lab(lab_cluster: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    from gpukit.lab.inventory import write_dra_host_vars

    base = site_lab(tmp_path_factory, "dra")
    write_dra_host_vars(base.inventory, [T4], {T4: SHARES})
    lab = base.as_(Lab, core=client.CoreV1Api(), custom=client.CustomObjectsApi())
    yield lab
    back = lab.play(inventory=lab.original)  # leave the lab as its inventory declares
    assert back.rc == 0 and not back.failed, back.describe()


def _declared(lab: Lab, host: str) -> dict[str, Any]:
    """The host's declaration as the preflight computes it (gpukit.provision.declaration)."""
    out = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-inventory"), "-i", str(lab.inventory),
         "--host", host], capture_output=True, text=True, check=True).stdout  # fmt: skip
    return declaration.for_vars(host, json.loads(out))


def test_site_converges_with_gpu_t4_on_dra(lab: Lab) -> None:
    r = lab.play()
    assert r.rc == 0 and not r.failed, r.describe()
    t4, a100 = (lab.core.read_node(n).metadata.labels for n in (T4, A100))
    assert (t4[ln.GPU_ALLOCATION], t4[ln.DEPLOY_DEVICE_PLUGIN]) == ("dra", "false")
    assert t4.get(ln.DRA_SHARES) == str(SHARES) and ln.DRA_SHARES not in a100
    assert (a100[ln.GPU_ALLOCATION], a100[ln.DEPLOY_DEVICE_PLUGIN]) == ("device-plugin", "true")
    # One API per node: the agent's pod on gpu-a100 only, the DRA plugin's on gpu-t4 only.
    assert lab.agents(APP) == {A100: "Running"}, lab.agents(APP)
    assert lab.agents(DRA_APP) == {T4: "Running"}, lab.agents(DRA_APP)
    # The role waited for it: gpu-t4's slices publish exactly its declared devices, shared.
    want = _declared(lab, T4)["expected_dra_devices"]
    assert len(want) == 2 and {w["capacity"]["shares"] for w in want} == {str(SHARES)}
    assert agent.dra_slice_differences(lab.slices(T4), want) == []
    assert all(d.get("allowMultipleAllocations") for s in lab.slices(T4)
               for d in s["spec"]["devices"])
    assert lab.slices(A100) == []
    assert lab.gpu_status(T4) == {}
    served = {k.removeprefix("allocatable/"): int(v) for k, v in lab.gpu_status(A100).items()
              if k.startswith("allocatable/") and int(v) > 0}  # fmt: skip
    assert served == _declared(lab, A100)["expected_resources"]
    classes = {c["metadata"]["name"]: c["spec"] for c in lab.custom.list_cluster_custom_object(
        "resource.k8s.io", "v1", "deviceclasses")["items"]}
    assert {"gpu.nvidia.com", "mig.nvidia.com"} <= set(classes)


def _testcases(junit: Path) -> list[tuple[str, str, str]]:
    """(classname, name, outcome) of every test case of a JUnit file."""
    out = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        outcome = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")),
                       "passed")
        out.append((case.get("classname", ""), case.get("name", ""), outcome))
    return out


def test_the_conformance_suite_passes_on_both_nodes(lab: Lab, tmp_path: Path) -> None:
    """Every area against the inventory with gpu-t4 on DRA: the dra area checks gpu-t4 (and
    skips gpu-a100), metrics scrapes both nodes (gpu-t4's from the DRA plugin)."""
    from gpukit.summary import read_junit

    junit = tmp_path / "conformance.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "gpukit/conformance", "--inventory", str(lab.inventory),
         "--kubeconfig", str(paths().admin_kubeconfig), "-q", "-p", "no:cacheprovider",
         f"--junitxml={junit}"],
        cwd=REPO, capture_output=True, text=True, timeout=1200)  # fmt: skip
    out = proc.stdout[-6000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, out
    run = read_junit(junit)
    assert run.failed == 0 and all(run.nodes[h].passed > 0 for h in (A100, T4)), out
    cases = _testcases(junit)
    for area in ("test_dra", "test_metrics"):
        passed = [n for c, n, o in cases if area in c and T4 in n and o == "passed"]
        assert passed, f"no {area} check passed on {T4}: {[c for c in cases if area in c[0]]}"
    assert [n for c, n, o in cases if "test_metrics" in c and A100 in n and o == "passed"]


def test_a_second_run_changes_nothing(lab: Lab) -> None:
    r = lab.play()
    assert r.rc == 0 and not r.failed, r.describe()
    assert r.changed == {}, f"a second run changed something: {r.changed}"
    assert all(r.changed_count(h) == 0 for h in (A100, T4)), r.stats


def test_check_mode_changes_nothing(lab: Lab) -> None:
    """--check --diff: with the DRA declaration nothing differs; with gpu-t4 declared back on
    the device plugin the label change is reported, with its diff, and not made."""
    same = lab.play("--check", "--diff")
    assert same.rc == 0 and not same.failed and same.changed == {}, same.describe()
    back = lab.play("--check", "--diff", "--limit", T4, inventory=lab.original)
    assert back.rc == 0 and not back.failed, back.describe()
    assert LABEL_TASK in back.changed.get(T4, []), back.describe()
    labels = lab.core.read_node(T4).metadata.labels
    assert (labels[ln.GPU_ALLOCATION], labels[ln.DEPLOY_DEVICE_PLUGIN]) == ("dra", "false")
    assert lab.agents(DRA_APP) == {T4: "Running"} and T4 not in lab.agents(APP)
