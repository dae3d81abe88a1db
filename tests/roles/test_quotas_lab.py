"""The gpu_quotas role on the lab: it applies the lab inventory's GPU quota, LimitRange and
PriorityClass, a second run changes nothing, check mode shows the diff of a changed quota and
changes nothing, a removed declaration deletes its object (and the inventory's brings it back);
the real apiserver refuses a pod beyond the quota naming the resource, and the conformance
suite's tenancy area passes.

The lab needs the node agent serving its GPUs for the suite's pods (site.yml once: the fixture
runs it when the nodes advertise no nvidia.com/gpu)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from labplay import REPO, PlayResult, run_playbook

from gpukit.inventory import quotas as decl
from gpukit.lab.config import load_spec
from gpukit.lab.controlplane import paths
from gpukit.lab.inventory import for_instance
from gpukit.provision import quotas

pytestmark = pytest.mark.lab

NS = "team-a"
HOST = "gpu-a100"  # the play's first GPU host: run_once tasks report on it
APPLY = "Apply the GPU quota objects"
DELETE = "Delete gpukit's GPU quota objects that are no longer declared"


@dataclass
class Lab:
    inventory: Path
    core: client.CoreV1Api
    scheduling: client.SchedulingV1Api

    def play(self, *args: str, extra: dict[str, Any] | None = None) -> PlayResult:
        r = run_playbook("site.yml", self.inventory, "--tags", "gpu_quotas", *args,
                         extra_vars=extra, timeout=600)
        assert r.rc == 0, r.describe()
        return r

    def hard(self) -> dict[str, str]:
        rq = self.core.read_namespaced_resource_quota(quotas.QUOTA_NAME, NS)
        return dict(rq.spec.hard)


def _serves_gpus(core: client.CoreV1Api) -> bool:
    return all(int((n.status.allocatable or {}).get("nvidia.com/gpu", "0")) > 0
               for n in core.list_node().items if n.metadata.name.startswith("gpu-"))


@pytest.fixture(scope="module")
def lab(lab_cluster: object) -> Iterator[Lab]:
    inventory = for_instance(load_spec())
    config.load_kube_config(str(paths().admin_kubeconfig))
    lab = Lab(inventory, client.CoreV1Api(), client.SchedulingV1Api())
    if not _serves_gpus(lab.core):
        r = run_playbook("site.yml", inventory, timeout=1500)
        assert r.rc == 0, r.describe()
    yield lab
    lab.play()  # leave the lab as its inventory declares


def test_the_role_applies_the_declaration_and_a_second_run_changes_nothing(lab: Lab) -> None:
    lab.play()
    assert lab.hard() == {"requests.nvidia.com/gpu": "2", "requests.nvidia.com/mig-1g.5gb": "2"}
    lr = lab.core.read_namespaced_limit_range(quotas.LIMIT_RANGE_NAME, NS)
    assert lr.spec.limits[0].max == {"nvidia.com/gpu": "2"}
    assert lr.spec.limits[0].default == {"nvidia.com/gpu": "0"}
    pc = lab.scheduling.read_priority_class("gpu-training")
    assert (pc.value, pc.preemption_policy, bool(pc.global_default)) == (
        100000, "PreemptLowerPriority", False)
    again = lab.play()
    assert again.changed_count(HOST) == 0, again.describe()


def test_check_mode_shows_a_changed_quota_and_changes_nothing(lab: Lab) -> None:
    changed = {NS: {"requests.nvidia.com/gpu": 1, "requests.nvidia.com/mig-1g.5gb": 2}}
    r = lab.play("--check", "--diff", extra={decl.QUOTAS: changed})
    assert APPLY in r.changed.get(HOST, []), r.describe()
    diffs = json.dumps([i.get("diff") for i in r.results[HOST][APPLY].get("results", [])
                        if i.get("changed")])
    assert "requests.nvidia.com/gpu" in diffs, diffs
    assert lab.hard()["requests.nvidia.com/gpu"] == "2"


def test_a_removed_declaration_deletes_its_object(lab: Lab) -> None:
    r = lab.play(extra={decl.PRIORITY_CLASSES: [], decl.LIMIT_RANGES: {}})
    assert DELETE in r.changed.get(HOST, []), r.describe()
    with pytest.raises(ApiException) as gone:
        lab.scheduling.read_priority_class("gpu-training")
    assert gone.value.status == 404
    assert lab.core.list_namespaced_limit_range(NS).items == []
    assert lab.hard()  # the quota still declared stays
    back = lab.play()
    assert APPLY in back.changed.get(HOST, []), back.describe()
    assert lab.scheduling.read_priority_class("gpu-training").value == 100000


def test_a_namespace_to_be_created_and_one_missing(lab: Lab) -> None:
    """Check mode creates no namespace: the objects that would go into it are skipped and the
    namespace shows as the change; without gpukit_gpu_quota_create_namespaces a missing
    namespace stops the role naming it, before any object changes."""
    r = run_playbook("site.yml", lab.inventory, "--tags", "gpu_quotas", "--check",
                     extra_vars={decl.QUOTAS: {"team-new": {"requests.nvidia.com/gpu": 1}}})
    assert r.rc == 0, r.describe()
    items = {"{kind}/{metadata[name]}@{ns}".format(**i["item"], ns=i["item"]["metadata"].get(
        "namespace", "")): i for i in r.results[HOST][APPLY]["results"]}
    assert items["Namespace/team-new@"]["changed"] is True
    assert items[f"ResourceQuota/{quotas.QUOTA_NAME}@team-new"].get("skipped") is True
    with pytest.raises(ApiException):
        lab.core.read_namespace("team-new")
    refused = run_playbook("site.yml", lab.inventory, "--tags", "gpu_quotas", extra_vars={
        decl.CREATE_NAMESPACES: False, decl.QUOTAS: {"team-none": {"requests.nvidia.com/gpu": 1}},
        decl.PRIORITY_CLASSES: [{"name": "gpu-none", "value": 5}]})
    assert refused.rc != 0
    assert "namespaces team-none" in json.dumps(refused.failed), refused.describe()
    with pytest.raises(ApiException):
        lab.scheduling.read_priority_class("gpu-none")


def test_the_apiserver_refuses_a_pod_beyond_the_quota(lab: Lab) -> None:
    lab.play()
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "beyond-quota"},
           "spec": {"containers": [{"name": "main", "image": "busybox", "resources": {
               "limits": {"nvidia.com/mig-1g.5gb": "3"}}}]}}
    with pytest.raises(ApiException) as refused:
        lab.core.create_namespaced_pod(NS, pod, dry_run="All")
    message = json.loads(refused.value.body)["message"]
    assert refused.value.status == 403
    assert "exceeded quota: gpukit-gpu-quota" in message, message
    assert "requested: requests.nvidia.com/mig-1g.5gb=3" in message, message
    assert "limited: requests.nvidia.com/mig-1g.5gb=2" in message, message


def test_the_suites_tenancy_area_passes(lab: Lab) -> None:
    lab.play()
    proc = subprocess.run(
        # --lab: this instance's inventory, kubeconfig, images and host networking.
        [sys.executable, "-m", "pytest", "gpukit/conformance", "--lab", "-m", "tenancy", "-q",
         "-p", "no:cacheprovider"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    out = proc.stdout[-6000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, out
    assert "5 passed" in out, out
