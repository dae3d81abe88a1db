"""Switching an existing node between the device plugin and DRA (gpukit.provision.dra_switch):
which mode a node is in, when site.yml refuses to switch it in place (GPU pods on it), what a
switch clears in each direction, and the filters the roles call it through."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from nvidia_dra_fixtures import allocation, claim, gpu, group, render

from gpukit.provision import dra_switch


def _filters() -> Any:
    """The filter plugin, imported as Ansible does (ansible_collections is a namespace package:
    the checkout's collections/ joins it)."""
    collections = str(Path(__file__).resolve().parents[2] / "collections")
    if collections not in sys.path:
        sys.path.append(collections)
    return importlib.import_module("ansible_collections.gpukit.gpu.plugins.filter.allocation_switch")


filters = _filters()


def _node(allocation: str | None = None, **status: Any) -> dict[str, Any]:
    labels = {"gpukit.io/gpu.allocation": allocation} if allocation else {}
    return {"metadata": {"name": "gpu-t4", "labels": labels}, "status": status}


def _pod(name: str, *, phase: str = "Running", resources: dict[str, Any] | None = None,
         claims: tuple[str, ...] = (), init: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": resources or {}}]}
    if init:
        spec["initContainers"] = [{"name": "i", "resources": init}]
    if claims:
        spec["resourceClaims"] = [{"name": c, "resourceClaimName": c} for c in claims]
    return {"metadata": {"namespace": "team-a", "name": name}, "spec": spec,
            "status": {"phase": phase}}


def test_a_node_without_the_label_is_on_the_device_plugin() -> None:
    assert dra_switch.current_allocation(_node()) == "device-plugin"
    assert dra_switch.current_allocation(_node("dra")) == "dra"
    assert dra_switch.current_allocation(None) == "device-plugin"
    assert dra_switch.allocation_change(_node(), "dra") == "GPU allocation device-plugin -> dra"
    assert dra_switch.allocation_change(_node("dra"), "device-plugin") == \
        "GPU allocation dra -> device-plugin"
    assert dra_switch.allocation_change(_node("dra"), "dra") is None
    assert dra_switch.allocation_change(_node(), "device-plugin") is None
    assert dra_switch.allocation_change(None, "dra") is None  # not registered: nothing to leave


def test_gpu_pods_are_those_holding_nvidia_resources_or_claims() -> None:
    pods = [_pod("train", resources={"limits": {"nvidia.com/gpu": 1}}),
            _pod("mig", resources={"requests": {"nvidia.com/mig-1g.5gb": 1, "cpu": 1}}),
            _pod("claimed", claims=("gpu",)),
            _pod("init", init={"limits": {"nvidia.com/gpu": 1}}),
            _pod("web", resources={"limits": {"cpu": 1}}),
            _pod("done", phase="Succeeded", resources={"limits": {"nvidia.com/gpu": 1}}),
            _pod("other", resources={"limits": {"example.com/fpga": 1}})]
    assert dra_switch.gpu_pods(pods) == [
        "team-a/claimed (claim gpu)", "team-a/init (nvidia.com/gpu)",
        "team-a/mig (nvidia.com/mig-1g.5gb)", "team-a/train (nvidia.com/gpu)"]


def test_site_refuses_a_switch_under_gpu_pods_naming_node_modes_and_pods() -> None:
    pods = [_pod("train", resources={"limits": {"nvidia.com/gpu": 1}}), _pod("web")]
    refusal = dra_switch.switch_refusal("gpu-t4", _node(), "dra", pods)
    assert refusal == (
        "node gpu-t4: GPU allocation device-plugin -> dra refused while GPU pods run on it: "
        "team-a/train (nvidia.com/gpu). Switch it with playbooks/upgrade.yml, which drains the "
        "node first (or stop these pods and run again)")
    assert "dra -> device-plugin" in dra_switch.switch_refusal(
        "gpu-t4", _node("dra"), "device-plugin", [_pod("c", claims=("gpu",))])
    # No change, no GPU pods, or no node yet: nothing to refuse.
    assert dra_switch.switch_refusal("gpu-t4", _node("dra"), "dra", pods) == ""
    assert dra_switch.switch_refusal("gpu-t4", _node(), "dra", [_pod("web")]) == ""
    assert dra_switch.switch_refusal("gpu-t4", None, "dra", pods) == ""


def _plugin_checkpoint(*claims: tuple[str, str]) -> str:
    return json.dumps({"version": 1, "checksum": "x", "claims": {
        f"uid-{n}": {"uid": f"uid-{n}", "namespace": ns, "name": n, "devices": [],
                     "spec_file": ""} for ns, n in claims}})


def _claim(name: str, pool: str, *, reserved: bool = True, driver: str = "gpu.nvidia.com"
           ) -> dict[str, Any]:
    return {"metadata": {"namespace": "team-a", "name": name},
            "status": {"allocation": {"devices": {"results": [
                {"driver": driver, "pool": pool, "device": "gpu-0", "request": "gpu"}]}},
                "reservedFor": [{"resource": "pods", "name": "p"}] if reserved else []}}


def test_claims_left_on_a_node_leaving_dra() -> None:
    assert dra_switch.prepared_claims(_plugin_checkpoint(("team-a", "c1"), ("b", "c2"))) == [
        "b/c2", "team-a/c1"]
    assert dra_switch.prepared_claims(_plugin_checkpoint()) == []
    assert dra_switch.prepared_claims("") == []
    assert dra_switch.prepared_claims("{cut") == [
        "(unreadable /var/lib/kubelet/plugins/gpu.nvidia.com/gpukit-checkpoint.json)"]
    claims = [_claim("here", "gpu-t4"), _claim("idle", "gpu-t4", reserved=False),
              _claim("there", "gpu-a100"), _claim("nic", "gpu-t4", driver="example.com")]
    assert dra_switch.allocated_claims(claims, "gpu-t4") == ["team-a/here"]
    assert filters.allocation_switch_claims(_plugin_checkpoint(("team-a", "here")), claims,
                                            "gpu-t4") == ["team-a/here"]
    # A prepared entry counts while its claim exists (reserved or not); the entry of a claim
    # deleted while the plugin was down is stale and does not hold the node for good; without
    # the API's list every entry counts.
    left = _plugin_checkpoint(("team-a", "idle"), ("team-a", "deleted"))
    assert filters.allocation_switch_claims(left, claims, "gpu-t4") == [
        "team-a/here", "team-a/idle"]
    assert filters.allocation_switch_claims(left, None, "gpu-t4") == [
        "team-a/deleted", "team-a/idle"]
    assert filters.allocation_switch_claims("{cut", [], "gpu-t4") == [
        "(unreadable /var/lib/kubelet/plugins/gpu.nvidia.com/gpukit-checkpoint.json)"]


def test_nvidias_and_an_earlier_gpukits_checkpoint_hold_the_node_too() -> None:
    """The role passes gpukit's file and checkpoint.json beside it: NVIDIA's completed claims
    (not taken over by gpukit's plugin) and an earlier gpukit's count as gpukit's do."""
    nvidia = render({"uid-n": claim([group(gpu("uid-n", "gpu-0", "GPU-0", "gpu-t4"))],
                                    allocation("gpu-t4", ("gpu", "gpu-0")), name="idle",
                                    namespace="team-a"),
                     "uid-s": claim([], {}, name="half", state="PrepareStarted")})
    claims = [_claim("idle", "gpu-t4", reserved=False)]
    assert filters.allocation_switch_claims(["", nvidia], claims, "gpu-t4") == ["team-a/idle"]
    assert filters.allocation_switch_claims(
        [_plugin_checkpoint(("team-a", "idle")), _plugin_checkpoint(("b", "old"))], None,
        "gpu-t4") == ["b/old", "team-a/idle"]
    assert filters.allocation_switch_claims(["", nvidia.replace("gpu-0", "gpu-1")], [],
                                            "gpu-t4") == [
        "(unreadable /var/lib/kubelet/plugins/gpu.nvidia.com/checkpoint.json)"]


def test_what_a_switch_clears_in_words() -> None:
    stale = {"capacity": {"cpu": "4", "nvidia.com/gpu": "2"}, "allocatable": {"nvidia.com/gpu": "2"}}
    node = {"metadata": {"labels": {"nvidia.com/gpu.count": "2", "nvidia.com/gpu.replicas": "4",
                                    "nvidia.com/gpu.deploy.device-plugin": "false",
                                    "kubernetes.io/hostname": "gpu-t4"}}, "status": stale}
    assert dra_switch.switch_actions("dra", checkpoint=["nvidia.com/gpu"], node=node) == [
        "restart the kubelet without its device plugin checkpoint (nvidia.com/gpu)",
        "remove nvidia.com/gpu from the node's status",
        "remove the node agent's 2 labels (nvidia.com/gpu.count, ...)"]
    assert dra_switch.switch_actions("dra", node={"status": {"capacity": {"cpu": "4"}}}) == []
    slices = [{"metadata": {"name": "gpu-t4-gpu.nvidia.com-0"}}]
    assert dra_switch.switch_actions("device-plugin", slices=slices) == [
        "delete the ResourceSlices gpu-t4-gpu.nvidia.com-0"]
    assert dra_switch.switch_actions("device-plugin") == []
    assert filters.allocation_switch_actions("dra", ["nvidia.com/gpu"], node) == \
        dra_switch.switch_actions("dra", checkpoint=["nvidia.com/gpu"], node=node)
    assert filters.allocation_switch_actions("dra") == []


def test_the_node_reported_after_the_kubelet_restart() -> None:
    node = {"status": {"conditions": [
        {"type": "MemoryPressure", "lastHeartbeatTime": "2026-11-26T18:30:00Z"},
        {"type": "Ready", "status": "True", "lastHeartbeatTime": "2026-11-26T18:20:05Z"}]}}
    assert dra_switch.reported_since(node, "2026-11-26T18:20:00Z")
    assert not dra_switch.reported_since(node, "2026-11-26T18:20:05Z")
    assert not dra_switch.reported_since(node, "2026-11-26T18:21:00+00:00")
    assert dra_switch.reported_since(node, "2026-11-26T18:20:00")  # naive: UTC
    assert not dra_switch.reported_since({"status": {}}, "2026-11-26T18:20:00Z")
    assert filters.allocation_switch_reported(node, "2026-11-26T18:20:00Z")


def test_the_node_agents_labels_are_stale_on_a_dra_node_and_gpukits_own_are_not() -> None:
    labels = {"nvidia.com/gpu.count": "2", "nvidia.com/gpu.product": "Tesla-T4",
              "nvidia.com/cuda.driver-version.full": "550.1", "nvidia.com/mig-1g.5gb.count": "7",
              # node_labels' and the MIG manager's, and the user's: kept.
              "nvidia.com/gpu.deploy.device-plugin": "false", "nvidia.com/mig.config": "x",
              "nvidia.com/device-plugin.config": "t", "nvidia.com/gpu.present": "true",
              "gpukit.io/gpu.allocation": "dra", "example.com/pool": "a"}
    assert dra_switch.stale_labels(labels) == [
        "nvidia.com/cuda.driver-version.full", "nvidia.com/gpu.count",
        "nvidia.com/gpu.product", "nvidia.com/mig-1g.5gb.count"]


class _Core:
    """The calls clear_device_plugin makes, against one node."""

    def __init__(self, status: client.V1NodeStatus, labels: dict[str, str]) -> None:
        self.api_client = client.ApiClient()
        self.node = client.V1Node(metadata=client.V1ObjectMeta(name="gpu-t4", labels=labels),
                                  status=status)
        self.patches: list[Any] = []

    def read_node_status(self, name: str) -> client.V1Node:
        assert name == "gpu-t4"
        return self.node

    def patch_node_status(self, name: str, body: Any) -> None:
        self.patches.append(("status", name, body))

    def patch_node(self, name: str, body: Any) -> None:
        self.patches.append(("node", name, body))


@pytest.mark.parametrize("dry_run", [False, True])
def test_clearing_patches_only_the_nvidia_resources_and_the_agents_labels(dry_run: bool) -> None:
    core = _Core(client.V1NodeStatus(capacity={"cpu": "4", "nvidia.com/gpu": "2"},
                                     allocatable={"cpu": "4", "nvidia.com/gpu": "2"}),
                 {"nvidia.com/gpu.count": "2", "nvidia.com/gpu.deploy.device-plugin": "false"})
    assert dra_switch.clear_device_plugin(core, "gpu-t4", dry_run=dry_run) == {
        "resources": ["nvidia.com/gpu"], "labels": ["nvidia.com/gpu.count"]}
    assert core.patches == ([] if dry_run else [
        ("status", "gpu-t4", [{"op": "remove", "path": "/status/capacity/nvidia.com~1gpu"},
                              {"op": "remove", "path": "/status/allocatable/nvidia.com~1gpu"}]),
        ("node", "gpu-t4", {"metadata": {"labels": {"nvidia.com/gpu.count": None}}})])
    clean = _Core(client.V1NodeStatus(capacity={"cpu": "4"}, allocatable={"cpu": "4"}),
                  {"gpukit.io/gpu.allocation": "dra"})
    assert dra_switch.clear_device_plugin(clean, "gpu-t4") == {"resources": [], "labels": []}
    assert clean.patches == []


def test_the_filters_take_what_k8s_info_returns() -> None:
    assert filters.allocation_change({}, "dra") == []
    assert filters.allocation_change(_node(), "dra") == ["GPU allocation device-plugin -> dra"]
    pods = [_pod("train", resources={"limits": {"nvidia.com/gpu": 1}})]
    assert "team-a/train" in filters.allocation_switch_refusal([_node()], pods, "dra", "gpu-t4")
    assert filters.allocation_switch_refusal([], pods, "dra", "gpu-t4") == ""
    assert filters.allocation_switch_checkpoint("") == []


def test_a_quarantined_entry_does_not_hold_the_node_a_live_claim_does(tmp_path: Path) -> None:
    """The DRA plugin moves a stale entry (claim deleted, device gone, unreadable) to its
    quarantine file beside the checkpoint: the switch reads the checkpoint's claims only, so
    the entry no longer refuses it, also without the API's list; a live claim still does."""
    from gpukit.plugin.dra.checkpoint import QUARANTINE_FILE, Checkpoint, PreparedClaim

    cp = Checkpoint(tmp_path / "gpukit-checkpoint.json")
    cp.put(PreparedClaim("uid-live", "team-a", "here", (), "a.json"))
    cp.put(PreparedClaim("uid-gone", "team-a", "deleted", (), "b.json"))
    assert cp.quarantine("uid-gone", "the claim is gone from the API")
    assert (tmp_path / QUARANTINE_FILE).is_file()
    text = cp.path.read_text()
    claims = [_claim("here", "gpu-t4")]
    assert filters.allocation_switch_claims([text, ""], claims, "gpu-t4") == ["team-a/here"]
    assert filters.allocation_switch_claims([text, ""], None, "gpu-t4") == ["team-a/here"]
    cp.remove("uid-live")
    assert filters.allocation_switch_claims([cp.path.read_text(), ""], None, "gpu-t4") == []
