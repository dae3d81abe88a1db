"""Make the lab match an inventory, as `site.yml` will (a stand-in until the roles and the MIG
manager do it): node labels, MIG layouts on the mock GPUs, the node agent with the named configs.

Also the knobs the failure tests turn: relabel a node, re-lay MIG, inject an XID, stop the agent,
and watch the node until its resources show the change (bounded, no blind sleeps).
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import time
import tomllib
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from kubernetes import watch

from gpukit import inventory as inv
from gpukit.agent_manifests import AgentDeployment, declarations_map
from gpukit.conformance import expect, runtime_path
from gpukit.contracts.node_declaration import CONDITION_TYPE, NodeDeclaration
from gpukit.k8s import connect, objects, waits
from gpukit.k8s.nodes import ready, reported_after
from gpukit.lab import agent, cluster, nodes
from gpukit.lab import nvml as mock
from gpukit.lab.config import LabSpec
from gpukit.lab.controlplane import paths
from gpukit.lab.packages import build_repo
from gpukit.mig.placement import pack
from gpukit.provision import quotas, runtime, toolkit_config

REPO = Path(__file__).resolve().parents[2]

# Configs the failure tests switch nodes to (by label), deployed next to the inventory's.
# As the lab inventory's configs: devices as volume mounts (a strategy the hardened runtime
# serves) and as DeviceSpecs (what the lab's plain runc gives containers).
PLUGIN = {"passDeviceSpecs": True, "deviceListStrategy": "volume-mounts"}
EXTRA_CONFIGS: dict[str, dict[str, Any]] = {
    "time-sliced-2": {
        "version": "v1", "flags": {"migStrategy": "none", "plugin": PLUGIN},
        "sharing": {"timeSlicing": {"failRequestsGreaterThanOne": True, "resources": [
            {"name": "nvidia.com/gpu", "replicas": 2}]}},
    },
    "mig-single": {
        "version": "v1", "flags": {"migStrategy": "single", "plugin": PLUGIN},
    },
    # A plugin that hands the same GPU out twice (two IDs per GPU) where nothing is declared
    # shared: containers end up on one GPU.
    "mig-mixed-overlap": {
        "version": "v1", "flags": {"migStrategy": "mixed", "plugin": PLUGIN},
        "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}},
    },
}
# The agent never forgets an XID here: recovery is an agent restart (deterministic for tests).
AGENT_ENV = {"GPUKIT_RECOVERY_SECONDS": "never"}

_MIG_SCRIPT = r"""
import ctypes, json, sys
import pynvml as n
from gpukit.contracts import mig_profiles
from gpukit.lab.nvml.control import MockControl
layout = json.loads(sys.argv[1])  # {index: [[profile, start], ...] or null}
ctl = MockControl()
state = {g["index"]: g for g in ctl.status()["gpus"]}
n.nvmlInit()
changed = []
for key, placed in sorted(layout.items(), key=lambda kv: int(kv[0])):
    idx = int(key)
    mig = state[idx].get("mig") or {}
    have = sorted((gi["profile"], gi["placement"]["start"]) for gi in mig.get("gpu_instances", []))
    want = sorted((p, s) for p, s in placed or [])
    if bool(mig.get("current")) == (placed is not None) and have == want:
        continue
    changed.append(idx)
    h = n.nvmlDeviceGetHandleByIndex(idx)
    if mig.get("current"):
        ctl.reset(idx)  # destroys its MIG instances, as nvidia-smi -r does
    mode = 1 if placed is not None else 0
    cur, pend = n.nvmlDeviceGetMigMode(h)
    if cur != mode or pend != mode:
        n.nvmlDeviceSetMigMode(h, mode)
        ctl.reset(idx)
    table = mig_profiles.for_product(n.nvmlDeviceGetName(h))
    for name, start in placed or []:
        p = table.gpu_instance_profile(name)
        where = n.c_nvmlGpuInstancePlacement_t()
        where.start, where.size = start, p.memory_slices
        gi = n.nvmlDeviceCreateGpuInstanceWithPlacement(h, p.driver_id, ctypes.byref(where))
        n.nvmlGpuInstanceCreateComputeInstance(
            gi, p.compute_instance_profile(p.compute_slices).profile_id)
n.nvmlShutdown()
print(json.dumps(changed))
"""


def core() -> Any:
    return connect.core(paths().admin_kubeconfig)


def gpu_env(lab: LabSpec, node: str) -> dict[str, str]:
    root = nodes.root(lab.node(node))
    return mock.env(root / "etc/gpukit-lab/nvml/profile.yaml", root / "var/lib/gpukit-lab/nvml")


def mig_plan(decl: inv.NodeDecl, gpus: list[inv.GpuMig] | None = None
             ) -> dict[str, list[tuple[str, int]] | None]:
    table = decl.gpu.mig_table
    plan: dict[str, list[tuple[str, int]] | None] = {}
    for g in gpus if gpus is not None else decl.mig_gpus:
        if not g.mig_enabled:
            plan[str(g.index)] = None
            continue
        assert table is not None
        # The MIG manager's placement search: the lab lays MIG out where the node would.
        placed = pack(table, Counter(g.profiles))
        plan[str(g.index)] = [(s.profile, s.start) for s in placed]
    return plan


def apply_mig(lab: LabSpec, node: str, plan: Mapping[str, Any]) -> list[int]:
    """Lay out MIG on the node's mock GPUs (only GPUs that differ); returns those changed."""
    r = subprocess.run([sys.executable, "-c", _MIG_SCRIPT, json.dumps(plan)],
                       env=gpu_env(lab, node), capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"{node}: applying MIG layout failed: {r.stderr}")
    changed: list[int] = json.loads(r.stdout.strip().splitlines()[-1])
    return changed


def mock_cli(lab: LabSpec, node: str, *args: str) -> None:
    root = nodes.root(lab.node(node))
    subprocess.run(
        [sys.executable, "-m", "gpukit.lab.nvml",
         "--profile", str(root / "etc/gpukit-lab/nvml/profile.yaml"),
         "--state-dir", str(root / "var/lib/gpukit-lab/nvml"), *args],
        check=True, capture_output=True, text=True, timeout=30,
    )


def set_labels(node: str, labels: Mapping[str, str | None]) -> None:
    core().patch_node(node, {"metadata": {"labels": dict(labels)}})


def deployment(fleet: inv.GpuInventory) -> AgentDeployment:
    configs: dict[str, dict[str, Any]] = {}
    for decl in fleet.nodes:
        configs.update({k: dict(v) for k, v in decl.plugin_configs.items()})
    configs.update(EXTRA_CONFIGS)
    d = agent.lab_deployment(configs, "default" if "default" in configs else None, **AGENT_ENV)
    # What each node must serve, as the device_plugin role renders it: the suite checks the
    # agent's served-vs-declared condition agrees with what it finds.
    declarations = {decl.node_name: NodeDeclaration(
        decl.node_name, expect.expected_resources(decl), decl.plugin_config_name or "").as_dict()
        for decl in fleet.nodes if not decl.dra}
    # Who may scrape, as the role renders gpukit_metrics_auth (cluster-wide: one DaemonSet).
    auth = fleet.nodes[0].metrics.auth if fleet.nodes else d.metrics_auth
    return replace(d, declarations=declarations, metrics_auth=auth)


def declare(fleet: inv.GpuInventory, node: str, timeout: float = 150) -> None:
    """The nodes' declarations for `fleet`, as a site.yml re-run after an inventory edit
    renders them; returns once `node`'s agent says it serves its (new) declaration (the
    kubelet refreshes the ConfigMap volume within about a minute)."""
    objects.apply(connect.api_client(paths().admin_kubeconfig),
                  [declarations_map(deployment(fleet))], field_manager="gpukit-lab")

    def serves(o: Any) -> bool:
        return any(c.type == CONDITION_TYPE and c.status == "False"
                   for c in (o.status.conditions or []))

    wait_node(node, serves, f"condition {CONDITION_TYPE} False", timeout)


RUNTIME_CLASS = "nvidia"
CONTAINERD = "etc/containerd/config.toml"
TOOLKIT_CONFIG = "etc/nvidia-container-runtime/config.toml"


def configure_runtime(lab: LabSpec, node: str, timeout: float = 120,
                      set_as_default: bool = False) -> None:
    """The lab's nvidia-container-toolkit package and containerd's `nvidia` runtime (the
    default where the inventory says so), as role container_toolkit installs and configures
    them (the suite checks the handler everywhere); nothing when the node has both."""
    spec = lab.node(node)
    conf = nodes.root(spec) / CONTAINERD
    text = conf.read_text()
    installed = (nodes.root(spec) / runtime.DEFAULT_BINARY.lstrip("/")).exists()
    edit = runtime.configure_containerd(
        text, runtime.RuntimeSettings(set_as_default=set_as_default), "/" + CONTAINERD,
        new_version=runtime.config_version(tomllib.loads(text), "/" + CONTAINERD))
    if not installed:
        build_repo()
        r = cluster.node_exec(spec, ["sh", "-c", "dpkg -i /opt/gpukit-lab/apt/"
                                     "nvidia-container-toolkit_*.deb"], timeout=timeout)
        assert r.returncode == 0, f"{node}: toolkit install: {r.stdout}{r.stderr}"
    # NVIDIA's hardening, as the role writes it: the package's own config reads the device
    # plugin's volume-mounts marker as a device name, and the runtime then fails the create.
    toolkit = nodes.root(spec) / TOOLKIT_CONFIG
    hardened = toolkit_config.plan(toolkit.read_text(), toolkit_config.ToolkitSettings(),
                                   "/" + TOOLKIT_CONFIG)
    if hardened.changed:
        toolkit.write_text(hardened.after or "")
    if edit.changed:
        conf.write_text(edit.after or text)
        r = cluster.node_exec(spec, ["systemctl", "restart", "containerd"], timeout=timeout)
        assert r.returncode == 0, f"{node}: containerd restart: {r.stdout}{r.stderr}"
        wait_node(node, lambda o: ready(o)[0], "Ready after the containerd restart", timeout)


def runtime_class() -> None:
    """RuntimeClass `nvidia` (handler nvidia), as role container_toolkit creates it."""
    objects.apply(connect.api_client(paths().admin_kubeconfig), [
        {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
         "metadata": {"name": RUNTIME_CLASS}, "handler": "nvidia"}],
        field_manager="gpukit-container-toolkit")


def provision(lab: LabSpec, fleet: inv.GpuInventory, timeout: float = 120) -> None:
    """Labels, MIG layouts, the runtime, the agent; returns once every node advertises what is
    declared."""
    runtime_class()
    declared = runtime_path.declared(fleet.source.split(","),
                                     {n.host: n.node_name for n in fleet.nodes})
    for decl in fleet.nodes:
        configure_runtime(lab, decl.node_name, set_as_default=declared[decl.node_name].default)
    for decl in fleet.nodes:
        if decl.mig_declared:
            apply_mig(lab, decl.node_name, mig_plan(decl))
        wanted: dict[str, str | None] = {
            inv.DEVICE_PLUGIN_CONFIG_LABEL: None, inv.MIG_CONFIG_LABEL: None}
        wanted.update({**decl.labels, **decl.selection_labels()})
        set_labels(decl.node_name, wanted)
    d = deployment(fleet)
    agent.apply(lab, d)
    agent.wait_rolled_out(lab, d)
    # The declared quotas, LimitRanges and PriorityClasses, as site.yml's gpu_quotas applies them
    # (the suite's tenancy area reads them).
    objects.apply(connect.api_client(paths().admin_kubeconfig), quotas.objects(fleet.tenancy))
    # A restarted plugin re-registers, and the node object shows it only at the kubelet's next
    # status report: wait for a report made after the rollout, showing the declared resources.
    since = dt.datetime.now(dt.UTC).replace(microsecond=0)
    for decl in fleet.nodes:
        want = {k: v for k, v in expect.expected_resources(decl).items() if v > 0}

        def settled(o: Any, w: dict[str, int] = want) -> bool:
            return reported_after(o, since) and advertised(o) == w

        wait_node(decl.node_name, settled, f"allocatable {want} reported after {since}", timeout)


def unprovision(lab: LabSpec, fleet: inv.GpuInventory) -> None:
    """Back to a bare lab: no node agent, no selection labels, no tenancy objects (their
    namespaces stay: a terminating one would refuse the next provision's objects), MIG off."""
    agent.remove(lab, deployment(fleet))
    objects.delete(connect.api_client(paths().admin_kubeconfig),
                   [o for o in quotas.objects(fleet.tenancy) if o["kind"] != "Namespace"])
    for decl in fleet.nodes:
        labels: dict[str, str | None] = {k: None for k in decl.labels}
        labels.update({inv.DEVICE_PLUGIN_CONFIG_LABEL: None, inv.MIG_CONFIG_LABEL: None})
        set_labels(decl.node_name, labels)
        if decl.mig_declared:
            apply_mig(lab, decl.node_name, {str(g.index): None for g in decl.mig_gpus})


def advertised(node_obj: Any) -> dict[str, int]:
    alloc = node_obj.status.allocatable or {}
    return {k: int(str(v)) for k, v in sorted(alloc.items())
            if k.startswith("nvidia.com/") and int(str(v)) > 0}


def wait_node(node: str, done: Callable[[Any], bool], what: str, timeout: float) -> Any:
    """Watch the node until `done(node)` (bounded)."""
    api = core()
    deadline = time.monotonic() + timeout
    obj = api.read_node(node)
    while not done(obj):
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"node {node}: {what} not reached in {timeout:.0f}s "
                               f"(allocatable {advertised(obj)})")
        w = watch.Watch()
        for ev in w.stream(api.list_node, field_selector=f"metadata.name={node}",
                           resource_version=obj.metadata.resource_version,
                           timeout_seconds=max(1, int(left))):
            obj = ev["object"]
            if done(obj):
                w.stop()
                break
        else:
            obj = api.read_node(node)
    return obj


def wait_resources(node: str, resources: Mapping[str, int], timeout: float = 90) -> None:
    want = {k: v for k, v in resources.items() if v > 0}
    wait_node(node, lambda o: advertised(o) == want, f"allocatable {want}", timeout)


def restart_agent_on(node: str, timeout: float = 60) -> None:
    api = core()
    pods = api.list_namespaced_pod("gpukit-system", field_selector=f"spec.nodeName={node}",
                                   label_selector="app.kubernetes.io/name=gpukit-node-agent")
    for pod in pods.items:
        api.delete_namespaced_pod(pod.metadata.name, "gpukit-system", grace_period_seconds=1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        w = watch.Watch()
        listing = api.list_namespaced_pod("gpukit-system", field_selector=f"spec.nodeName={node}")
        old = {p.metadata.name for p in pods.items}
        if any(p.metadata.name not in old and p.status.phase == "Running"
               for p in listing.items):
            return
        for ev in w.stream(api.list_namespaced_pod, "gpukit-system",
                           field_selector=f"spec.nodeName={node}",
                           resource_version=listing.metadata.resource_version,
                           timeout_seconds=max(1, int(deadline - time.monotonic()))):
            p = ev["object"]
            if p.metadata.name not in old and p.status.phase == "Running":
                w.stop()
                return
    raise TimeoutError(f"node {node}: the node agent did not come back in {timeout:.0f}s")



def wait_gone_namespace(name: str, timeout: float) -> bool:
    api = core()
    return waits.gone(api.list_namespace, (), f"metadata.name={name}", timeout)
