"""Switching an existing node between the device plugin and DRA, both ways, on the lab.

The tests share one lab and run in order, on a copy of the lab's inventory that they edit as a
user would (host_vars/gpu-t4.yml: `gpukit_gpu_allocation: dra`).

Story: site.yml converges both nodes on the device plugin, and a GPU Deployment's pod
(`nvidia.com/gpu: 1`) runs on gpu-t4. gpu-t4 is declared on DRA: site.yml --check names the
switch and changes nothing; site.yml refuses before touching any host, naming node, old -> new
mode and the pod, pointing to playbooks/upgrade.yml. upgrade.yml --check plans
"GPU allocation device-plugin -> dra" for gpu-t4 alone; upgrade.yml rolls it (cordon, drain:
the pod evicted, relabel, switch, validation with the dra area, uncordon): gpu-t4 then
publishes its GPUs as ResourceSlices, has no nvidia.com/ resource in its status nor in the
kubelet's device plugin checkpoint, no node agent (GFD) label, the Deployment's unchanged pod runs there again (through
DeviceClass gpu.nvidia.com's extendedResourceName) and so does a pod with a ResourceClaim. A
second upgrade.yml touches nothing. gpu-t4 declared back on the device plugin: upgrade.yml
switches it back (the pod evicted again), its slices are gone and it advertises nvidia.com/gpu
again, the Deployment's pod served by the device plugin. The lab is left as its inventory
declares it (both nodes on the device plugin).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client
from labplay import PlayResult, assert_nothing_rolled, plan_lines, report_lines, run_playbook
from labtools import ApiLab, delete_namespace, live_pods, site_lab, wait_for

from gpukit.agent_manifests import APP, DRA_APP
from gpukit.contracts import label_names as ln
from gpukit.lab import cluster
from gpukit.lab.images import SHELL
from gpukit.lab.observe import Timeline
from gpukit.provision import dra_switch

# site.yml and upgrade.yml runs on a shared machine: minutes each (the module's fixture's
# site.yml counts against the first test).
pytestmark = [pytest.mark.lab, pytest.mark.timeout(2400)]

A100, T4 = "gpu-a100", "gpu-t4"
NS = "gpukit-dra-switch-test"
SERVICE = "gpu-service"  # the Deployment of one unchanged `nvidia.com/gpu: 1` pod on gpu-t4
REFUSED = "Check that no GPU pod runs on a node to switch"


@dataclass
class Lab(ApiLab):
    def site(self, *args: str, **kwargs: Any) -> PlayResult:
        return super().site(*args, var_files=(), **kwargs)

    def upgrade(self, *args: str) -> PlayResult:
        return run_playbook("playbooks/upgrade.yml", self.inventory, *args, var_files=(),
                            timeout=1800)  # fmt: skip

    def declare(self, allocation: str | None) -> None:
        """gpu-t4's gpukit_gpu_allocation in the inventory copy (None: the default)."""
        path = self.inventory / "host_vars" / f"{T4}.yml"
        if allocation is None:
            path.unlink(missing_ok=True)
            return
        path.parent.mkdir(exist_ok=True)
        path.write_text(f"gpukit_gpu_allocation: {allocation}\n")

    def sh(self, node: str, command: str) -> str:
        r = cluster.node_exec(self.spec.node(node), ["sh", "-c", command])
        return r.stdout

    def labels(self, node: str) -> dict[str, str]:
        return dict(self.core.read_node(node).metadata.labels or {})

    def service_pods(self) -> list[client.V1Pod]:
        return live_pods(self.core, NS, f"app={SERVICE}")


@pytest.fixture(scope="module")
def lab(lab_cluster: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    base = site_lab(tmp_path_factory, "dra-switch", keep_host_vars=False)  # (GPUKIT_LAB_DRA's)
    lab = base.as_(Lab, core=client.CoreV1Api(), custom=client.CustomObjectsApi())
    for node in (A100, T4):  # no rollout state of an earlier run
        lab.core.patch_node(node, {"spec": {"unschedulable": None},
                                   "metadata": {"labels": {ln.UPGRADE_STATE: None}}})
    delete_namespace(lab.core, NS)
    r = lab.site()
    assert r.rc == 0 and not r.failed, r.describe()
    lab.core.create_namespace({"metadata": {"name": NS}})
    try:
        yield lab
    finally:
        delete_namespace(lab.core, NS)
        lab.declare(None)
        back = lab.site()  # the lab as its inventory declares it
        assert back.rc == 0 and not back.failed, back.describe()


def _gpu_container(**resources: Any) -> dict[str, Any]:
    return {"name": "main", "image": SHELL, "imagePullPolicy": "Never",
            "command": ["sh", "-c", 'ls /dev | grep -E "^nvidia[0-9]+$"; exec sleep 3600'],
            "resources": resources}


def _start_service(lab: Lab) -> client.V1Pod:
    """A Deployment's pod asking `nvidia.com/gpu: 1` on gpu-t4, as any workload does."""
    labels = {"app": SERVICE}
    spec = {"terminationGracePeriodSeconds": 1,
            "nodeSelector": {"kubernetes.io/hostname": T4},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
            "containers": [_gpu_container(limits={"nvidia.com/gpu": "1"})]}
    client.AppsV1Api().create_namespaced_deployment(NS, {
        "metadata": {"name": SERVICE},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": spec}}})
    return _service_running(lab)


def _service_running(lab: Lab, other_than: str = "") -> client.V1Pod:
    pod: client.V1Pod = wait_for(
        f"the {SERVICE} pod Running on {T4}",
        lambda: next((p for p in lab.service_pods() if p.status.phase == "Running"
                      and p.metadata.uid != other_than and p.spec.node_name == T4), None),
        explain=lambda: str([(p.metadata.name, p.status.phase, p.status.conditions)
                             for p in lab.service_pods()]), every=2, timeout=120)
    return pod


def _gpus_seen(lab: Lab, pod: str) -> list[str]:
    """The /dev/nvidia<N> the pod's container sees (its command lists them)."""
    seen: list[str] = wait_for(f"pod {pod}: its GPU device nodes in its log",
                           lambda: lab.core.read_namespaced_pod_log(pod, NS).split(), every=2, timeout=120)
    return seen


def _kubelet_checkpoint(lab: Lab) -> list[str]:
    text = lab.sh(T4, f"cat {dra_switch.KUBELET_DEVICE_PLUGIN_CHECKPOINT} 2>/dev/null")
    return dra_switch.checkpoint_holds_device_plugin_resources(text)


def test_site_check_reports_the_switch_and_changes_nothing(lab: Lab) -> None:
    """No GPU pod on gpu-t4 yet: site.yml may switch it, and --check says what it would clear
    (the switch's tasks do not run in check mode)."""
    assert lab.labels(T4).get(ln.GPU_ALLOCATION) == "device-plugin"
    assert _kubelet_checkpoint(lab) == ["nvidia.com/gpu"]
    lab.declare("dra")
    r = lab.site("--check", "--diff")
    assert r.rc == 0 and not r.failed, r.describe()
    report = r.results[T4]["Report what the switch would clear"]
    stale = dra_switch.stale_labels(lab.labels(T4))
    assert report.get("changed") and report["msg"] == (
        f"node {T4} to dra: restart the kubelet without its device plugin checkpoint "
        "(nvidia.com/gpu); remove nvidia.com/gpu from the node's status; remove the node "
        f"agent's {len(stale)} labels ({stale[0]}, ...)"), report
    assert "Restart the kubelet without its device plugin checkpoint" not in r.changed[T4]
    assert A100 not in r.changed or "Report what the switch would clear" not in r.changed[A100]
    labels = lab.labels(T4)
    assert (labels[ln.GPU_ALLOCATION], labels[ln.DEPLOY_DEVICE_PLUGIN]) == ("device-plugin",
                                                                          "true")
    assert lab.agents(APP).get(T4) == "Running" and T4 not in lab.agents(DRA_APP)
    assert _kubelet_checkpoint(lab) == ["nvidia.com/gpu"]
    assert "allocatable/nvidia.com/gpu" in lab.gpu_status(T4)


def test_site_refuses_to_switch_a_node_under_its_gpu_pod(lab: Lab) -> None:
    lab.declare(None)
    pod = _start_service(lab)
    assert len(_gpus_seen(lab, pod.metadata.name)) == 1
    lab.declare("dra")
    for args in ((), ("--check", "--diff")):
        r = lab.site(*args)
        assert r.rc != 0, r.describe()
        # Every host stopped at the check: nothing changed anywhere.
        assert not r.changed, r.changed
        (failure,) = r.failed[T4]
        assert failure == (
            f"{REFUSED}: node {T4}: GPU allocation device-plugin -> dra refused while GPU pods "
            f"run on it: {NS}/{pod.metadata.name} (nvidia.com/gpu). Switch it with "
            "playbooks/upgrade.yml, which drains the node first (or stop these pods and run "
            "again)"), r.failed
        assert set(r.failed) == {T4}, r.failed
    labels = lab.labels(T4)
    assert (labels[ln.GPU_ALLOCATION], labels[ln.DEPLOY_DEVICE_PLUGIN]) == ("device-plugin",
                                                                          "true")
    assert lab.agents(APP).get(T4) == "Running" and T4 not in lab.agents(DRA_APP)
    assert [p.metadata.uid for p in lab.service_pods()] == [pod.metadata.uid]


def test_upgrade_check_plans_the_switch_of_gpu_t4_alone(lab: Lab) -> None:
    lab.declare("dra")
    r = lab.upgrade("--check")
    assert r.rc == 0 and not r.failed, r.describe()
    lines = plan_lines(r)
    assert f"  {T4}: GPU allocation device-plugin -> dra" in lines, lines
    assert f"{A100}: matches the inventory, not touched" in lines, lines
    assert lab.labels(T4)[ln.GPU_ALLOCATION] == "device-plugin"


def test_upgrade_switches_gpu_t4_to_dra(lab: Lab) -> None:
    lab.declare("dra")
    (old,) = lab.service_pods()
    with Timeline(lab.core, NS) as seen:
        r = lab.upgrade()
    assert r.rc == 0 and not r.failed, r.describe()
    assert report_lines(r) == [f"{T4}: upgraded and validated",
                               f"{A100}: matches the inventory"], report_lines(r)
    assert seen.states(T4)[-5:] == ["cordoned", "draining", "upgrading", "validating", "done"]
    assert all(not e.unschedulable for e in seen.node_events(A100))
    # The pod on the device plugin was drained before the switch.
    gone = [e.at for e in seen.pod_events(SERVICE)
            if e.uid == old.metadata.uid and e.kind == "DELETED"]
    upgrading = seen.first(T4, "upgrading")
    assert gone and upgrading is not None and gone[0] < upgrading
    labels = lab.labels(T4)
    assert (labels[ln.GPU_ALLOCATION], labels[ln.DEPLOY_DEVICE_PLUGIN]) == ("dra", "false")
    assert T4 not in lab.agents(APP) and lab.agents(DRA_APP).get(T4) == "Running"
    devices = sorted(d["name"] for s in lab.slices(T4) for d in s["spec"].get("devices", []))
    assert devices == ["gpu-0", "gpu-1"], devices
    assert lab.gpu_status(T4) == {}
    assert dra_switch.stale_labels(labels) == []  # the node agent's (GFD's) labels
    assert _kubelet_checkpoint(lab) == []
    # The unchanged pod runs on gpu-t4 again, served by DRA through the extended resource.
    pod = _service_running(lab, other_than=old.metadata.uid)
    status = pod.status.extended_resource_claim_status
    assert status and status.resource_claim_name, f"pod {pod.metadata.name}: no claim made"
    assert len(_gpus_seen(lab, pod.metadata.name)) == 1
    # So does a pod with a ResourceClaim written for NVIDIA's driver.
    lab.custom.create_namespaced_custom_object("resource.k8s.io", "v1", NS, "resourceclaims", {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "one-gpu"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount",
            "count": 1}}]}}})
    container = _gpu_container(claims=[{"name": "gpu"}])
    lab.core.create_namespaced_pod(NS, {"metadata": {"name": "claimed"}, "spec": {
        "restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
        "nodeSelector": {"kubernetes.io/hostname": T4}, "containers": [container],
        "resourceClaims": [{"name": "gpu", "resourceClaimName": "one-gpu"}]}})
    wait_for("pod claimed Running on gpu-t4",
         lambda: lab.core.read_namespaced_pod("claimed", NS).status.phase == "Running", every=2, timeout=120)
    assert len(_gpus_seen(lab, "claimed")) == 1


def test_a_second_upgrade_touches_nothing(lab: Lab) -> None:
    lab.declare("dra")
    with Timeline(lab.core) as seen:
        r = lab.upgrade()
    assert_nothing_rolled(r, seen.nodes, (A100, T4))


def test_upgrade_switches_gpu_t4_back_to_the_device_plugin(lab: Lab) -> None:
    # A bare pod would stop the drain (gpukit_upgrade_drain_force false): gone first.
    lab.core.delete_namespaced_pod("claimed", NS, grace_period_seconds=0)
    lab.custom.delete_namespaced_custom_object("resource.k8s.io", "v1", NS, "resourceclaims",
                                               "one-gpu")
    lab.declare("device-plugin")
    (old,) = lab.service_pods()
    with Timeline(lab.core, NS) as seen:
        r = lab.upgrade()
    assert r.rc == 0 and not r.failed, r.describe()
    assert f"  {T4}: GPU allocation dra -> device-plugin" in plan_lines(r), plan_lines(r)
    assert report_lines(r) == [f"{T4}: upgraded and validated",
                               f"{A100}: matches the inventory"], report_lines(r)
    assert seen.states(T4)[-5:] == ["cordoned", "draining", "upgrading", "validating", "done"]
    labels = lab.labels(T4)
    assert (labels[ln.GPU_ALLOCATION], labels[ln.DEPLOY_DEVICE_PLUGIN]) == ("device-plugin",
                                                                          "true")
    assert lab.agents(APP).get(T4) == "Running" and T4 not in lab.agents(DRA_APP)
    assert lab.slices(T4) == []
    assert ln.GPU_COUNT in lab.labels(T4)  # the node agent labels the node again
    assert int(lab.gpu_status(T4).get("allocatable/nvidia.com/gpu", 0)) > 0, lab.gpu_status(T4)
    pod = _service_running(lab, other_than=old.metadata.uid)
    assert pod.status.extended_resource_claim_status is None
    assert len(_gpus_seen(lab, pod.metadata.name)) == 1
    # The claim DRA made for the drained pod's nvidia.com/gpu went with it.
    wait_for("no ResourceClaim left", lambda: not lab.custom.list_namespaced_custom_object(
        "resource.k8s.io", "v1", NS, "resourceclaims")["items"], timeout=60,
         explain=lambda: json.dumps(lab.custom.list_namespaced_custom_object(
             "resource.k8s.io", "v1", NS, "resourceclaims")["items"])[:500], every=2)
