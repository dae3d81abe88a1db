"""DRA on the real kubelet: gpukit's DRA plugin (driver gpu.nvidia.com) on both lab nodes, no
device plugin, claims written as for NVIDIA's driver.

The DRA plugin runs as its DaemonSet (gpukit.agent_manifests.dra_manifests); the scheduler
allocates from its ResourceSlices, the kubelet calls NodePrepareResources and containerd
injects the claim's CDI devices. Proven here: slices equal the node's GPUs (MIG devices after
a MIG layout change on gpu-a100) with NVIDIA's attributes; a pod with a claim sees exactly its
device, one without sees none; two containers and two pods on one claim see the same device;
two claims get disjoint devices; on a GPU shared through consumable capacity, two pods' claims
run at once, a third waits for a share and each claim is prepared and unprepared on its own;
CEL selectors by productName and memory pick the right nodes'
devices; an unsatisfiable claim stays Pending with the scheduler's reason; a critical XID taints the
device (NVIDIA's taint keys) so a new claim avoids it, and recovery clears the taint; an unchanged pod
asking for nvidia.com/gpu is served through the DeviceClass's extended resource; an agent
restart between prepare and unprepare neither loses nor prepares again; the own-slices
admission policy refuses another node's slice; the plugin serves the node agent's GPU metrics
and /readyz (a DRA node runs no agent): series for every GPU and MIG device, a claim's device
carrying its pod; the MIG manager's CLI changes a layout on a DRA node while no claim holds the
GPU (the slices follow) and refuses, naming the claim, while one does; the kubelet shows a
claim's device health (the plugin's DRA health stream) in its pod's status; the plugin says
whether its node serves its declaration (the node condition GpuDeclarationMismatch False naming
the declared counts) and a lost GPU raises the condition, an Event and the gauge within seconds,
all cleared on recovery; a GPU declared for dynamic MIG publishes its counter set and
placements, a claim for a MIG profile gets its instance carved at prepare (the MIG manager
skipping that GPU) and destroyed after. Every failure names node, claim, expected and observed.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import labtools
import nvidia_dra_fixtures
import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from labtools import (
    MIG_MODE,
    NO_TOOLKIT_VARS,
    agent_http,
    clear_declaration_condition,
    declaration_condition,
    declaration_events,
    node_pynvml,
    wait_for,
)
from metadata_reader import read
from prometheus_client.parser import text_string_to_metric_families

from gpukit import agent_manifests
from gpukit.agent_manifests import DRA_APP, MPS_APP, AgentDeployment
from gpukit.contracts import node_declaration as nd
from gpukit.contracts.dra import PCIE_ROOT_ATTRIBUTE
from gpukit.k8s import connect, objects, waits
from gpukit.k8s.nodes import reported_after
from gpukit.k8s.objects import delete_if_there
from gpukit.lab import agent, cluster, images, nodes
from gpukit.lab import driver_surface as ds
from gpukit.lab.config import load_spec, state_dir
from gpukit.lab.controlplane import paths
from gpukit.lab.nvml import workload
from gpukit.plugin.dra.checkpoint import Checkpoint
from gpukit.provision import dra_switch

pytestmark = pytest.mark.lab

NS = "default"
DRIVER = "gpu.nvidia.com"
A100, T4 = "gpu-a100", "gpu-t4"
RECOVERY_S = 15
REPO = Path(__file__).resolve().parents[2]
CONTROL = {"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"}
SCRIPT = ('echo "DEV=$(ls /dev | grep nvidia | tr "\\n" " ")"; '
          'echo "CAPS=$(ls /dev/nvidia-caps 2>/dev/null | tr "\\n" " ")"; '
          'echo "ENV=$(env | grep -E "^(NVIDIA_VISIBLE_DEVICES|GPUKIT_DRA)" | sort | tr "\\n" " ")"; '
          "exec sleep 3600")


# -- fixtures ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def api(lab_cluster: object) -> Any:
    return connect.api_client(paths().admin_kubeconfig)


@pytest.fixture(scope="module")
def core(api: Any) -> client.CoreV1Api:
    return client.CoreV1Api(api)


@pytest.fixture(scope="module")
def resource(api: Any) -> client.ResourceV1Api:
    return client.ResourceV1Api(api)


def dra_objects(d: AgentDeployment) -> list[dict[str, Any]]:
    """The DRA plugin's objects, with the nodes' declarations (its served-vs-declared
    watchdog) and the MPS control DaemonSet."""
    mps = [agent_manifests.mps_daemonset(d)] if d.dra_mps else []
    return [agent_manifests.namespace(d), agent_manifests.declarations_map(d),
            *agent_manifests.dra_manifests(d), *mps]


GPU_KIND = nd.dra_kind("gpu")


def declared(node: str) -> nd.NodeDeclaration:
    """What a lab node must publish: every GPU whole (the lab's GPUs, MIG off at the start)."""
    return nd.NodeDeclaration(node, dra_devices={GPU_KIND: len(nodes.gpu_uuids(
        load_spec().node(node)))})


KUBELET_DP_CHECKPOINT = dra_switch.KUBELET_DEVICE_PLUGIN_CHECKPOINT


def leave_the_device_plugin(core: client.CoreV1Api, node: str) -> None:
    """Move a node that served nvidia.com/gpu through a device plugin (an earlier module's
    agent, gone now, its GPU pods too) to DRA, as the kubelet needs it:
    - its device manager checkpoint still holds the plugin's allocations, pods long gone:
      while it does, the kubelet takes nvidia.com/gpu for a device plugin resource and fails
      a pod DRA serves through the extended resource ("endpoint not found in cache for a
      registered resource"), across kubelet restarts too: cleared with the kubelet stopped;
    - the node's status still lists nvidia.com/gpu (the kubelet no longer manages it once
      the checkpoint is gone): the scheduler would place such a pod through the extended
      resource's old count and the container would get no GPU. Removed from the status, as
      Kubernetes documents removing an extended resource."""
    if dra_switch.checkpoint_holds_device_plugin_resources(
            node_sh(node, f"cat {KUBELET_DP_CHECKPOINT} 2>/dev/null")):
        since = datetime.now(UTC)
        node_sh(node, f"systemctl stop kubelet && rm -f {KUBELET_DP_CHECKPOINT} && "
                      "systemctl start kubelet")
        wait_for(f"node {node}: the kubelet back after clearing its device plugin checkpoint",
                 lambda: reported_after(core.read_node(node), since), timeout=90)

    def status() -> dict[str, Any]:
        s = core.read_node(node).status
        return {"capacity": s.capacity or {}, "allocatable": s.allocatable or {}}

    patch = dra_switch.status_patch(status())
    if patch:
        core.patch_node_status(node, patch)
    wait_for(f"node {node}: no nvidia.com/ resources in its status",
             lambda: not dra_switch.stale_resources(status()), timeout=30)


@pytest.fixture(scope="module")
def deployed(api: Any, core: client.CoreV1Api, resource: client.ResourceV1Api
             ) -> Iterator[AgentDeployment]:
    for node in (A100, T4):
        leave_the_device_plugin(core, node)
    d = replace(agent.lab_deployment({}, GPUKIT_RECOVERY_SECONDS=str(RECOVERY_S),
                                     GPUKIT_HEALTH_PROBE_INTERVAL_SECONDS="1"), dra=True,
                dra_mps=True, declarations={n: declared(n).as_dict() for n in (A100, T4)})
    docs = dra_objects(d)
    for node in (A100, T4):  # a condition an earlier module left would answer for the plugin
        clear_declaration_condition(core, node)
    try:
        objects.apply(api, docs, field_manager="gpukit-lab")
        waits.daemonset_rolled_out(api, d.namespace, DRA_APP, 180)
        for node in (A100, T4):
            wait_for(f"node {node}: the kubelet registered the DRA plugin",
                     lambda n=node: "the kubelet registered DRA driver" in plugin_log(n),
                     timeout=120, explain=lambda n=node: diagnose(n))
        yield d
    finally:
        objects.delete(api, docs, wait=120)
        for node in (A100, T4):  # the plugin is gone: nobody would keep it true
            clear_declaration_condition(core, node)


@pytest.fixture
def cleanup(core: client.CoreV1Api, resource: client.ResourceV1Api) -> Iterator[list[str]]:
    """Names of pods and claims the test made; deleted afterwards."""
    made: list[str] = []
    yield made
    for name in made:
        for delete in (core.delete_namespaced_pod, resource.delete_namespaced_resource_claim):
            delete_if_there(delete, name, NS, grace_period_seconds=0)
    for name in made:
        wait_for(f"pod {name} gone", lambda n=name: not _exists(core.read_namespaced_pod, n),
                 timeout=90)


def _exists(read: Any, name: str) -> bool:
    try:
        read(name, NS)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


# -- helpers -------------------------------------------------------------------------------


def diagnose(node: str) -> str:
    core = connect.core(paths().admin_kubeconfig)
    out = []
    for p in core.list_namespaced_pod("gpukit-system",
                                      field_selector=f"spec.nodeName={node}").items:
        try:
            log = core.read_namespaced_pod_log(p.metadata.name, "gpukit-system", tail_lines=30)
        except ApiException as exc:
            log = str(exc)
        out.append(f"--- {p.metadata.name} {p.status.phase}\n{log}")
    r = cluster.node_exec(load_spec().node(node), ["journalctl", "-u", "kubelet", "--no-pager",
                                                   "-n", "300"])  # fmt: skip
    lines = [ln for ln in r.stdout.splitlines() if "dra" in ln.lower() or "claim" in ln.lower()]
    out.append("--- kubelet (DRA lines)\n" + "\n".join(lines[-25:]))
    return "\n".join(out)


def plugin_log(node: str) -> str:
    core = connect.core(paths().admin_kubeconfig)
    out = ""
    for name in agent.agent_pods(node):
        if name.startswith(DRA_APP):
            try:
                out += core.read_namespaced_pod_log(name, "gpukit-system")
            except ApiException:
                pass
    return out


def node_sh(node: str, command: str) -> str:
    r = cluster.node_exec(load_spec().node(node), ["sh", "-c", command])
    return r.stdout.strip()


def slices(resource: client.ResourceV1Api, node: str) -> list[dict[str, Any]]:
    resp = resource.list_resource_slice(field_selector=f"spec.nodeName={node},spec.driver={DRIVER}",
                                        _preload_content=False)
    items: list[dict[str, Any]] = json.loads(resp.data)["items"]
    return items


def slice_devices(resource: client.ResourceV1Api, node: str) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in slices(resource, node) for d in s["spec"].get("devices") or []}


def claim_doc(name: str, cls: str = "gpu.nvidia.com", count: int = 1,
              selectors: list[str] | None = None,
              config: dict[str, Any] | None = None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": cls, "allocationMode": "ExactCount",
                               "count": count}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    spec: dict[str, Any] = {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}
    if config:
        spec["devices"]["config"] = [{"requests": ["gpu"], "opaque": {
            "driver": DRIVER, "parameters": config}}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NS}, "spec": spec}


def pod_doc(name: str, node: str | None, claims: dict[str, str], containers: int = 1,
            limits: dict[str, str] | None = None) -> dict[str, Any]:
    """`claims`: pod claim name -> ResourceClaim name; every container uses every claim."""
    spec: dict[str, Any] = {
        "restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
        "containers": [{"name": f"c{i}", "image": images.SHELL, "command": ["sh", "-c", SCRIPT],
                        "resources": {"claims": [{"name": c} for c in claims],
                                      **({"limits": limits} if limits else {})}}
                       for i in range(containers)],
        "resourceClaims": [{"name": c, "resourceClaimName": rc} for c, rc in claims.items()],
    }
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "labels": {"gpukit-test": "dra"}},
            "spec": spec}


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def create_claim(resource: client.ResourceV1Api, made: list[str], doc: dict[str, Any]) -> str:
    resource.create_namespaced_resource_claim(NS, doc)
    made.append(doc["metadata"]["name"])
    return str(doc["metadata"]["name"])


def run_pod(core: client.CoreV1Api, made: list[str], doc: dict[str, Any],
            timeout: float = 120) -> client.V1Pod:
    core.create_namespaced_pod(NS, doc)
    made.append(doc["metadata"]["name"])
    name = doc["metadata"]["name"]
    try:
        pod = waits.pod_phase(core, NS, name, {"Running", "Failed", "Succeeded"}, timeout)
    except TimeoutError as exc:
        pod = core.read_namespaced_pod(name, NS)
        pytest.fail(f"pod {name} (node {pod.spec.node_name}): expected Running, observed "
                    f"{pod.status.phase} {conditions(pod)}: {exc}\n"
                    f"{diagnose(pod.spec.node_name or A100)}")
    assert pod.status.phase == "Running", (
        f"pod {name} (node {pod.spec.node_name}): expected Running, observed {pod.status.phase}")
    return pod


def conditions(pod: client.V1Pod) -> str:
    return "; ".join(f"{c.type}={c.status} {c.reason or ''} {c.message or ''}"
                     for c in pod.status.conditions or [])


def seen(core: client.CoreV1Api, pod: str, container: str = "c0") -> dict[str, set[str]]:
    """What the container printed: its /dev/nvidia* entries, caps nodes and env."""
    def read() -> str:
        try:
            return str(core.read_namespaced_pod_log(pod, NS, container=container))
        except ApiException:
            return ""
    text = wait_for(f"pod {pod} container {container} output", lambda: "ENV=" in read() and read(),
                    timeout=60)
    out: dict[str, set[str]] = {}
    for key in ("DEV", "CAPS", "ENV"):
        m = re.search(rf"^{key}=(.*)$", text, re.M)
        out[key] = set(m.group(1).split()) if m else set()
    return out


def allocated(resource: client.ResourceV1Api, claim: str) -> list[dict[str, Any]]:
    resp = resource.read_namespaced_resource_claim(claim, NS, _preload_content=False)
    doc = json.loads(resp.data)
    results: list[dict[str, Any]] = (((doc.get("status") or {}).get("allocation") or {})
                                     .get("devices") or {}).get("results") or []
    return results


def minor_of(resource: client.ResourceV1Api, node: str, device: str) -> int:
    d = slice_devices(resource, node)[device]
    key = "minor" if "minor" in d["attributes"] else "parentIndex"
    return int(d["attributes"][key]["int"])


def gpu_nodes(node_devs: set[str]) -> set[str]:
    return {d for d in node_devs if re.fullmatch(r"nvidia\d+", d)}


PLUGIN_DIR = f"/var/lib/kubelet/plugins/{DRIVER}"
CDI_SPEC = "/var/run/cdi/k8s.gpu.nvidia.com-claim_{uid}.{ext}"


def checkpoint(node: str) -> dict[str, Any]:
    """The claims gpukit's DRA checkpoint holds on the node."""
    text = node_sh(node, f"cat {PLUGIN_DIR}/gpukit-checkpoint.json 2>/dev/null")
    claims: dict[str, Any] = json.loads(text)["claims"] if text else {}
    return claims


Sample = tuple[str, dict[str, str], float]


def plugin_metrics(node: str, name: str = "DCGM_FI_DEV_FB_USED") -> list[Sample]:
    """The DRA plugin's series `name` on `node` (its /metrics on the node's loopback)."""
    status, body = agent_http(node, "/metrics")
    assert status == 200, f"node {node}: DRA plugin /metrics expected 200, observed " \
        f"{status} {body[:300]}"
    return [(x.name, dict(x.labels), x.value) for f in text_string_to_metric_families(body)
            for x in f.samples if x.name == name]


def held_by(node: str, pod: str) -> list[dict[str, str]]:
    return [labels for _, labels, _ in plugin_metrics(node) if labels.get("pod") == pod]


def cdi_spec_mtime(node: str, uid: str, ext: str = "json") -> str:
    """The claim's CDI spec's modification time on the node ("" when there is none): /var/run
    is the node's own tmpfs, read inside it. `ext` yaml: NVIDIA's plugin's spec."""
    return node_sh(node, f"stat -c %y {CDI_SPEC.format(uid=uid, ext=ext)} 2>/dev/null")


# -- tests -----------------------------------------------------------------------------------


def test_slices_equal_the_nodes_gpus_with_nvidias_attributes(
        deployed: AgentDeployment, resource: client.ResourceV1Api) -> None:
    for node, product, memory in ((A100, "NVIDIA A100-SXM4-40GB", "40Gi"),
                                  (T4, "Tesla T4", "15Gi")):
        uuids = nodes.gpu_uuids(load_spec().node(node))
        expected = {f"gpu-{i}" for i in range(len(uuids))}
        devs = wait_for(f"node {node}: devices {sorted(expected)} published",
                        lambda n=node, e=expected: set(slice_devices(resource, n)) == e
                        and slice_devices(resource, n), timeout=60,
                        explain=lambda n=node: f"observed {sorted(slice_devices(resource, n))}")
        assert set(devs) == expected, f"node {node}: expected devices {sorted(expected)}, " \
            f"observed {sorted(devs)}"
        # The node's PCI sysfs as the lab lays it out (links into /sys/devices/pci<d>:<b>/...).
        profile = ds.load_profile(nodes.root(load_spec().node(node))
                                  / "etc/gpukit-lab/nvml/profile.yaml")
        roots = {bus_id: path.split("/")[0] for bus_id, path in ds.pci_paths(profile)[0].items()}
        for i, u in enumerate(uuids):
            attrs = devs[f"gpu-{i}"]["attributes"]
            got = {k: next(iter(v.values())) for k, v in attrs.items()}
            root = roots[profile.gpus[i].bus_id]
            assert got.get(PCIE_ROOT_ATTRIBUTE) == root, (
                f"node {node}, device gpu-{i}: attribute {PCIE_ROOT_ATTRIBUTE} expected {root!r}"
                f" (its sysfs link), observed {got.get(PCIE_ROOT_ATTRIBUTE)!r}")
            for key, want in (("type", "gpu"), ("uuid", u), ("productName", product)):
                assert got.get(key) == want, (f"node {node}, device gpu-{i}: attribute {key} "
                                              f"expected {want!r}, observed {got.get(key)!r}")
            for key in ("architecture", "cudaComputeCapability", "driverVersion",
                        "cudaDriverVersion", "resource.kubernetes.io/pciBusID"):
                assert key in got, f"node {node}, device gpu-{i}: attribute {key} missing " \
                    f"(observed {sorted(got)})"
            cap = devs[f"gpu-{i}"]["capacity"]["memory"]["value"]
            # The profiles' memory_mib: 40960 (A100-SXM4-40GB), 15360 (T4).
            assert cap == memory, f"node {node}, device gpu-{i}: capacity memory expected " \
                f"{memory}, observed {cap}"
        pools = {(s["spec"]["pool"]["name"], s["spec"]["pool"]["generation"],
                  s["spec"]["nodeName"]) for s in slices(resource, node)}
        assert len(pools) == 1 and next(iter(pools))[0] == node == next(iter(pools))[2], \
            f"node {node}: expected one pool named after the node, observed {pools}"


def test_a_stale_slice_of_the_node_is_deleted_and_a_wiped_one_written_again(
        deployed: AgentDeployment, resource: client.ResourceV1Api) -> None:
    stale = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
             "metadata": {"name": f"{T4}-{DRIVER}-stale"},
             "spec": {"driver": DRIVER, "nodeName": T4, "devices": [],
                      "pool": {"name": T4, "generation": 1, "resourceSliceCount": 1}}}
    resource.create_resource_slice(stale)
    wait_for(f"node {T4}: the stale slice {stale['metadata']['name']} deleted by the plugin",
             lambda: [s["metadata"]["name"] for s in slices(resource, T4)] ==
             [f"{T4}-{DRIVER}-0"], timeout=30,
             explain=lambda: str([s["metadata"]["name"] for s in slices(resource, T4)]))
    resource.delete_resource_slice(f"{T4}-{DRIVER}-0")  # as the kubelet wipes a driver's
    wait_for(f"node {T4}: its slice written again after a wipe",
             lambda: set(slice_devices(resource, T4)) == {"gpu-0", "gpu-1"}, timeout=30)


# What a claim's container shows of the driver NVIDIA's CDI spec gives: nvidia-smi -L's exit
# status and lines, and where libcuda.so (the link nvidia-cdi-hook create-symlinks makes) leads.
DRIVER_SCRIPT = ('smi=$(nvidia-smi -L 2>&1); echo "SMI_RC=$?"; '
                 'echo "SMI=$(echo "$smi" | tr "\\n" ";")"; '
                 'lib=/usr/lib/x86_64-linux-gnu/libcuda.so; '
                 'echo "LIBCUDA=$(readlink -f $lib) $(test -f $lib && echo resolves)"; '
                 # The claim's device metadata files (KEP-5304), each line of each.
                 'for f in $(find /var/run/kubernetes.io/dra-device-attributes -type f); do '
                 'echo "METAFILE=$f"; sed "s/^/METALINE=/" "$f"; done; ' + SCRIPT)
# The lab's GPUs are the mock NVML's profile and state on the node: what a real container
# reaches through the kernel (/dev), the lab's reaches through these (the paths it looks at).
MOCK_KERNEL = (("nvml-profile", "/etc/gpukit-lab/nvml", True),
               ("nvml-state", "/var/lib/gpukit-lab/nvml", False))


def printed(core: client.CoreV1Api, pod: str, key: str, container: str = "c0") -> str:
    """The line `key=...` the container printed, as printed."""
    text = core.read_namespaced_pod_log(pod, NS, container=container)
    m = re.search(rf"^{key}=(.*)$", text, re.M)
    return m.group(1) if m else ""


def test_a_pod_with_a_claim_sees_exactly_its_device_and_one_without_sees_none(
        deployed: AgentDeployment, core: client.CoreV1Api, resource: client.ResourceV1Api,
        cleanup: list[str]) -> None:
    """With the driver and the toolkit's nvidia-cdi-hook on the node, as site.yml installs
    them, the claim's container also gets what NVIDIA's DRA driver gives it: the driver's
    nvidia-smi, which runs there and lists the claim's GPU, and libcuda.so linked to the
    driver's library by the spec's hooks (in an image with a C library, as CUDA images are)."""
    archive = images.build_cuda_probe(state_dir() / "shared" / "images")
    node_sh(T4, f"ctr -n k8s.io images import /opt/gpukit-lab/images/{archive.name}")
    with labtools.driver_userspace(T4), labtools.cdi_hook(T4):
        claim = create_claim(resource, cleanup, claim_doc(unique("one")))
        pod = unique("claimed")
        doc = pod_doc(pod, T4, {"gpu": claim})
        c0 = doc["spec"]["containers"][0]
        c0.update(image=images.CUDA_PROBE, imagePullPolicy="Never",
                  command=["sh", "-c", DRIVER_SCRIPT],
                  volumeMounts=[{"name": n, "mountPath": path, "readOnly": ro}
                                for n, path, ro in MOCK_KERNEL])
        doc["spec"]["volumes"] = [{"name": n, "hostPath": {"path": path, "type": "Directory"}}
                                  for n, path, _ in MOCK_KERNEL]
        run_pod(core, cleanup, doc)
        results = allocated(resource, claim)
        assert [r["pool"] for r in results] == [T4], f"claim {claim}: expected one device in " \
            f"pool {T4}, observed {results}"
        want = {f"nvidia{minor_of(resource, T4, results[0]['device'])}"}
        got = seen(core, pod)
        assert gpu_nodes(got["DEV"]) == want, (f"node {T4}, claim {claim}: expected GPU nodes "
                                               f"{want}, observed {sorted(got['DEV'])}")
        assert CONTROL & got["DEV"], f"node {T4}, claim {claim}: no control nodes in {got['DEV']}"
        gpu = slice_devices(resource, T4)[results[0]["device"]]["attributes"]["uuid"]["string"]
        smi = (printed(core, pod, "SMI_RC"), printed(core, pod, "SMI"))
        assert smi[0] == "0" and f"(UUID: {gpu})" in smi[1], (
            f"node {T4}, claim {claim}: expected nvidia-smi -L to run in the container and list "
            f"{gpu}, observed exit {smi[0]!r}: {smi[1]!r}\n{diagnose(T4)}")
        libcuda = printed(core, pod, "LIBCUDA")
        assert re.fullmatch(r"/usr/lib/x86_64-linux-gnu/libcuda\.so\.[0-9.]+ resolves",
                            libcuda), (f"node {T4}, claim {claim}: expected libcuda.so to lead "
                                       f"to the driver's libcuda.so.<version>, observed "
                                       f"{libcuda!r}")
        assert_device_metadata(core, pod, claim, slice_devices(resource, T4)[results[0]["device"]])
    bare = unique("bare")
    run_pod(core, cleanup, pod_doc(bare, T4, {}))
    none = seen(core, bare)["DEV"]
    assert none == set(), f"node {T4}, pod {bare} without a claim: expected no /dev/nvidia*, " \
        f"observed {sorted(none)}"


def assert_device_metadata(core: client.CoreV1Api, pod: str, claim: str,
                           device: Mapping[str, Any]) -> None:
    """The claim's one metadata file at the path a workload reads (KEP-5304), decoded and
    validated by k8s.io/dynamic-resource-allocation's reader: the device and its attributes
    as the node's ResourceSlice publishes them."""
    log = core.read_namespaced_pod_log(pod, NS, container="c0")
    files = re.findall(r"^METAFILE=(.*)$", log, re.M)
    want = f"/var/run/kubernetes.io/dra-device-attributes/resourceclaims/{claim}/gpu/" \
        f"{DRIVER}-metadata.json"
    assert files == [want], f"node {T4}, pod {pod}: expected the metadata file {want}, " \
        f"observed {files}"
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        f.write("".join(line + "\n" for line in re.findall(r"^METALINE=(.*)$", log, re.M)))
        f.flush()
        [seen] = read(Path(f.name))
    assert "error" not in seen and "invalid" not in seen, f"node {T4}, pod {pod}: {seen}"
    [request] = seen["metadata"]["requests"]
    [dev] = request["devices"]
    assert (dev["driver"], dev["pool"], dev["name"], dev["attributes"]) == (
        DRIVER, T4, device["name"], device["attributes"]), (
        f"node {T4}, pod {pod}: expected {device['name']} with its published attributes, "
        f"observed {dev}")


def test_two_containers_and_two_pods_on_one_claim_see_the_same_device(
        deployed: AgentDeployment, core: client.CoreV1Api, resource: client.ResourceV1Api,
        cleanup: list[str]) -> None:
    claim = create_claim(resource, cleanup, claim_doc(unique("shared")))
    first, second = unique("shared-a"), unique("shared-b")
    run_pod(core, cleanup, pod_doc(first, None, {"gpu": claim}, containers=2))
    run_pod(core, cleanup, pod_doc(second, None, {"gpu": claim}))
    views = {(p, c): gpu_nodes(seen(core, p, c)["DEV"])
             for p, c in ((first, "c0"), (first, "c1"), (second, "c0"))}
    node = allocated(resource, claim)[0]["pool"]
    assert len({frozenset(v) for v in views.values()}) == 1 and \
        len(next(iter(views.values()))) == 1, (
            f"node {node}, claim {claim}: expected one and the same GPU in every container, "
            f"observed {views}")


def test_two_claims_get_disjoint_devices(
        deployed: AgentDeployment, core: client.CoreV1Api, resource: client.ResourceV1Api,
        cleanup: list[str]) -> None:
    a = create_claim(resource, cleanup, claim_doc(unique("disj-a")))
    b = create_claim(resource, cleanup, claim_doc(unique("disj-b")))
    pa, pb = unique("disj-a"), unique("disj-b")
    run_pod(core, cleanup, pod_doc(pa, T4, {"gpu": a}))
    run_pod(core, cleanup, pod_doc(pb, T4, {"gpu": b}))
    da = {r["device"] for r in allocated(resource, a)}
    db = {r["device"] for r in allocated(resource, b)}
    assert da and db and not da & db, f"node {T4}, claims {a}, {b}: expected disjoint " \
        f"devices, observed {da} and {db}"
    sa, sb = gpu_nodes(seen(core, pa)["DEV"]), gpu_nodes(seen(core, pb)["DEV"])
    assert len(sa) == len(sb) == 1 and not sa & sb, f"node {T4}, claims {a}, {b}: " \
        f"expected different GPU nodes, observed {sa} and {sb}"


SHARES_LABEL = "gpukit.io/dra.shares"


def device_shares(resource: client.ResourceV1Api, node: str, device: str) -> str | None:
    d = slice_devices(resource, node).get(device) or {}
    return ((d.get("capacity") or {}).get("shares") or {}).get("value") if \
        d.get("allowMultipleAllocations") else None


@contextlib.contextmanager
def shared_devices(core: client.CoreV1Api, resource: client.ResourceV1Api, shares: int,
                   *names: str) -> Iterator[int]:
    """`names` labelled as role node_labels labels a node declared `gpukit_dra_shares`; each
    node's first device published with `shares` before, unshared again after (the label
    removed), so the next test sees devices for one claim each."""
    first = {node: min(slice_devices(resource, node)) for node in names}
    for node in names:
        core.patch_node(node, {"metadata": {"labels": {SHARES_LABEL: str(shares)}}})
    try:
        for node, device in first.items():
            wait_for(f"node {node}: {device} published with {shares} shares",
                     lambda n=node, d=device: device_shares(resource, n, d) == str(shares),
                     timeout=60, explain=lambda n=node, d=device:
                     f"observed {slice_devices(resource, n).get(d)}\n{diagnose(n)}")
        yield shares
    finally:
        for node in names:
            core.patch_node(node, {"metadata": {"labels": {SHARES_LABEL: None}}})
        for node, device in first.items():
            wait_for(f"node {node}: {device} published unshared again",
                     lambda n=node, d=device: device_shares(resource, n, d) is None, timeout=60)


@pytest.fixture
def shared_t4(deployed: AgentDeployment, core: client.CoreV1Api,
              resource: client.ResourceV1Api) -> Iterator[int]:
    with shared_devices(core, resource, 2, T4) as shares:
        yield shares


def test_claims_of_several_pods_share_one_gpu_and_one_more_waits_for_a_share(
        shared_t4: int, core: client.CoreV1Api, resource: client.ResourceV1Api,
        cleanup: list[str]) -> None:
    """Consumable capacity (KEP-5075) on the real 1.37 scheduler and kubelet: gpu-0 of gpu-t4
    shared by 2 claims. Two pods' claims (CEL: index 0) both get gpu-0 with their own shareID
    and one share each, run at once and see the same GPU; each claim has its own CDI spec and
    checkpoint entry. A third claim's pod stays Pending with the scheduler's reason; once the
    first pod and claim are gone, that claim alone is unprepared (the second's spec and entry
    stay) and the third pod runs on the freed share."""
    n = shared_t4
    on_gpu0 = ["device.attributes['gpu.nvidia.com'].index == 0"]
    claims = [create_claim(resource, cleanup, claim_doc(unique(f"share{i}"), selectors=on_gpu0))
              for i in range(n + 1)]
    pods = [unique(f"share{i}") for i in range(n + 1)]
    for pod, claim in zip(pods[:n], claims[:n], strict=True):
        run_pod(core, cleanup, pod_doc(pod, T4, {"gpu": claim}))
    results = [allocated(resource, c) for c in claims[:n]]
    assert [[r["device"] for r in rs] for rs in results] == [["gpu-0"]] * n, (
        f"node {T4}, claims {claims[:n]}: expected gpu-0 for each, observed {results}")
    share_ids = {rs[0].get("shareID") for rs in results}
    assert None not in share_ids and len(share_ids) == n, (
        f"node {T4}, claims {claims[:n]}: expected {n} distinct shareIDs, observed {results}")
    assert all(rs[0].get("consumedCapacity", {}).get("shares") == "1" for rs in results), (
        f"node {T4}: expected one share consumed per claim, observed {results}")
    views = [gpu_nodes(seen(core, p)["DEV"]) for p in pods[:n]]
    phases = [core.read_namespaced_pod(p, NS).status.phase for p in pods[:n]]
    assert views == [{"nvidia0"}] * n and phases == ["Running"] * n, (
        f"node {T4}: expected {n} pods running at once on /dev/nvidia0, observed "
        f"{dict(zip(pods, zip(phases, views, strict=False), strict=False))}")
    uids = [resource.read_namespaced_resource_claim(c, NS).metadata.uid for c in claims]
    held = checkpoint(T4)
    assert [(held[u]["devices"][0]["device"], held[u]["devices"][0]["share_ids"])
            for u in uids[:n] if u in held] == [("gpu-0", [r[0]["shareID"]]) for r in results], (
        f"node {T4}: expected a checkpoint entry with its share per claim, observed {held}")
    assert all(cdi_spec_mtime(T4, u) for u in uids[:n]), f"node {T4}: a claim's CDI spec missing"

    core.create_namespaced_pod(NS, pod_doc(pods[n], T4, {"gpu": claims[n]}))
    cleanup.append(pods[n])
    reason = wait_for(f"pod {pods[n]}: unschedulable while gpu-0's {n} shares are taken",
                      lambda: "PodScheduled=False" in conditions(
                          core.read_namespaced_pod(pods[n], NS)) and conditions(
                          core.read_namespaced_pod(pods[n], NS)), timeout=60)
    assert core.read_namespaced_pod(pods[n], NS).status.phase == "Pending", \
        f"node {T4}, pod {pods[n]}: expected Pending, observed {reason}"

    core.delete_namespaced_pod(pods[0], NS, grace_period_seconds=0)
    wait_for(f"node {T4}: claim {claims[0]} unprepared, {claims[1]} still prepared",
             lambda: uids[0] not in checkpoint(T4) and not cdi_spec_mtime(T4, uids[0]),
             timeout=90, explain=lambda: f"observed {checkpoint(T4)}")
    assert uids[1] in checkpoint(T4) and cdi_spec_mtime(T4, uids[1]), (
        f"node {T4}: claim {claims[1]} lost its entry or spec when {claims[0]} was unprepared")
    resource.delete_namespaced_resource_claim(claims[0], NS)
    pod = waits.pod_phase(core, NS, pods[n], {"Running", "Failed"}, 120)
    assert pod.status.phase == "Running" and [r["device"] for r in allocated(
        resource, claims[n])] == ["gpu-0"], (
        f"node {T4}, pod {pods[n]}: expected Running on gpu-0's freed share, observed "
        f"{pod.status.phase} {conditions(pod)}")


def test_cel_selectors_by_product_and_memory_pick_the_right_devices(
        deployed: AgentDeployment, core: client.CoreV1Api, resource: client.ResourceV1Api,
        cleanup: list[str]) -> None:
    attrs = f"device.attributes['{DRIVER}']"
    cases = {
        T4: [f"{attrs}.productName == 'Tesla T4'"],
        A100: [f"device.capacity['{DRIVER}'].memory.compareTo(quantity('30Gi')) >= 0"],
    }
    for node, selectors in cases.items():
        claim = create_claim(resource, cleanup, claim_doc(unique("cel"), selectors=selectors))
        run_pod(core, cleanup, pod_doc(unique("cel"), None, {"gpu": claim}))
        pools = {r["pool"] for r in allocated(resource, claim)}
        assert pools == {node}, f"claim {claim} ({selectors[0]}): expected a device of " \
            f"node {node}, observed pools {pools}"


def test_an_unsatisfiable_claim_stays_pending_with_the_schedulers_reason(
        deployed: AgentDeployment, core: client.CoreV1Api, resource: client.ResourceV1Api,
        cleanup: list[str]) -> None:
    claim = create_claim(resource, cleanup, claim_doc(unique("none"), count=3, selectors=[
        f"device.attributes['{DRIVER}'].productName == 'Tesla T4'"]))
    name = unique("pending")
    core.create_namespaced_pod(NS, pod_doc(name, None, {"gpu": claim}))
    cleanup.append(name)

    def reason() -> str:
        pod = core.read_namespaced_pod(name, NS)
        for c in pod.status.conditions or []:
            if c.type == "PodScheduled" and c.status == "False" and c.message:
                return str(c.message)
        return ""

    message = wait_for(f"claim {claim}: the scheduler's reason on pod {name}", reason,
                       timeout=60)
    assert "claim" in message.lower(), f"claim {claim} (3 T4s, 2 exist): expected the " \
        f"scheduler to name the claim it cannot allocate, observed {message!r}"
    pod = core.read_namespaced_pod(name, NS)
    assert pod.status.phase == "Pending" and not allocated(resource, claim), (
        f"claim {claim}: expected Pending and unallocated, observed {pod.status.phase}, "
        f"{allocated(resource, claim)}")


def test_an_unchanged_pod_asking_for_nvidia_gpu_is_served_by_dra(
        deployed: AgentDeployment, core: client.CoreV1Api, resource: client.ResourceV1Api,
        cleanup: list[str]) -> None:
    name = unique("extended")
    pod = run_pod(core, cleanup, pod_doc(name, T4, {}, limits={"nvidia.com/gpu": "1"}))
    devs = gpu_nodes(seen(core, name)["DEV"])
    status = pod.status.extended_resource_claim_status
    claim = status.resource_claim_name if status else None
    assert claim and len(devs) == 1, (
        f"node {T4}, pod {name} (nvidia.com/gpu: 1): expected a claim made for it and one GPU "
        f"node, observed claim {claim}, nodes {devs}")


def restart_plugin(core: client.CoreV1Api, node: str) -> None:
    """The node's DRA plugin pod deleted; back when its successor runs and is registered."""
    plugin_pods = [p for p in agent.agent_pods(node) if p.startswith(DRA_APP)]
    for p in plugin_pods:
        core.delete_namespaced_pod(p, "gpukit-system")
    wait_for(f"node {node}: the old DRA plugin pod gone", lambda: not set(plugin_pods) & set(
        agent.agent_pods(node)), timeout=120)
    new = wait_for(f"node {node}: a new DRA plugin pod running", lambda: [
        p.metadata.name for p in core.list_namespaced_pod(
            "gpukit-system", field_selector=f"spec.nodeName={node}").items
        if p.metadata.name.startswith(DRA_APP) and p.status.phase == "Running"], timeout=120)

    def registered() -> bool:
        try:
            log = core.read_namespaced_pod_log(new[0], "gpukit-system")
        except ApiException:
            return False
        return "the kubelet registered DRA driver" in log

    wait_for(f"node {node}: the new DRA plugin registered", registered, timeout=60,
             explain=lambda: diagnose(node))


def as_nvidias(resource: client.ResourceV1Api, node: str, claim: str, uid: str) -> str:
    """The claim's checkpoint.json as NVIDIA's DRA plugin writes it (its v2, this boot) for the
    device it was allocated."""
    doc = json.loads(resource.read_namespaced_resource_claim(claim, NS,
                                                             _preload_content=False).data)
    (result,) = doc["status"]["allocation"]["devices"]["results"]
    device = slice_devices(resource, node)[result["device"]]
    status = {"allocation": {"devices": {"results": [result]}}}
    entry = nvidia_dra_fixtures.claim([nvidia_dra_fixtures.group(nvidia_dra_fixtures.gpu(
        uid, result["device"], device["attributes"]["uuid"]["string"], node,
        requests=[result["request"]]))], status, name=claim, namespace=NS)
    return str(nvidia_dra_fixtures.render({uid: entry},
                                          node_sh(node, "cat /proc/sys/kernel/random/boot_id")))


def test_an_agent_restart_between_prepare_and_unprepare_loses_nothing(
        deployed: AgentDeployment, core: client.CoreV1Api, resource: client.ResourceV1Api,
        cleanup: list[str]) -> None:
    """A prepared claim outlives two plugin restarts: the first on a node upgraded from an
    earlier gpukit (its checkpoint.json in gpukit's format: moved to gpukit-checkpoint.json,
    the claim kept), the second on a node NVIDIA's DRA driver served (the claim in NVIDIA's
    checkpoint.json and CDI spec: taken over, said in the log and an Event, NVIDIA's file
    renamed); the spec untouched by both, removed with the pod."""
    claim = create_claim(resource, cleanup, claim_doc(unique("restart")))
    pod = unique("restart")
    run_pod(core, cleanup, pod_doc(pod, T4, {"gpu": claim}))
    uid = resource.read_namespaced_resource_claim(claim, NS).metadata.uid
    before = cdi_spec_mtime(T4, uid)
    assert uid in checkpoint(T4) and before, f"node {T4}, claim {claim}: expected a " \
        f"checkpoint entry and its CDI spec, observed entries {sorted(checkpoint(T4))}, " \
        f"spec time {before!r}"
    node_sh(T4, f"mv {PLUGIN_DIR}/gpukit-checkpoint.json {PLUGIN_DIR}/checkpoint.json")
    restart_plugin(core, T4)
    running = core.read_namespaced_pod(pod, NS)
    assert running.status.phase == "Running", f"node {T4}, claim {claim}: pod {pod} " \
        f"expected Running after the agent restart, observed {running.status.phase}"
    entries = [u for u in checkpoint(T4) if u == uid]
    after = cdi_spec_mtime(T4, uid)
    left = node_sh(T4, f"ls {PLUGIN_DIR}")
    assert entries == [uid] and after == before and "checkpoint.json" not in left.split(), (
        f"node {T4}, claim {claim}: expected one checkpoint entry moved from an earlier "
        f"gpukit's checkpoint.json and the spec untouched, observed {entries}, spec time "
        f"{before!r} -> {after!r}, files {left.split()}")
    # The claim as NVIDIA's DRA driver leaves it: in its checkpoint with its CDI spec, not in
    # gpukit's (the files through the node's root, as a host process sees them; /var/run is a
    # link to the node's own /run: moved inside the node).
    init = cluster.init_proc(load_spec().node(T4))
    assert init is not None, f"node {T4}: not running"
    root = Path(f"/proc/{init.pid}/root")
    (root / PLUGIN_DIR.lstrip("/") / "checkpoint.json").write_text(
        as_nvidias(resource, T4, claim, uid))
    Checkpoint(root / PLUGIN_DIR.lstrip("/") / "gpukit-checkpoint.json").remove(uid)
    node_sh(T4, f"mv {CDI_SPEC.format(uid=uid, ext='json')} {CDI_SPEC.format(uid=uid, ext='yaml')}")
    restart_plugin(core, T4)
    taken = cdi_spec_mtime(T4, uid, "yaml")
    events = core.list_namespaced_event("default", field_selector=f"involvedObject.name={T4},"
                                                                  "reason=NvidiaClaimsTakenOver")
    assert uid in checkpoint(T4) and taken == before and f"{NS}/{claim} (uid {uid}" in \
        plugin_log(T4) and "checkpoint.json.taken-over-by-gpukit" in node_sh(
            T4, f"ls {PLUGIN_DIR}").split() and events.items, (
        f"node {T4}, claim {claim}: expected NVIDIA's claim taken over (in gpukit's "
        f"checkpoint, NVIDIA's spec untouched, its file renamed, an Event), observed entries "
        f"{sorted(checkpoint(T4))}, spec time {before!r} -> {taken!r}, files "
        f"{node_sh(T4, f'ls {PLUGIN_DIR}').split()}, events {len(events.items)}\n"
        f"{diagnose(T4)}")
    core.delete_namespaced_pod(pod, NS, grace_period_seconds=0)
    wait_for(f"node {T4}, claim {claim}: CDI spec and checkpoint entry gone after the pod",
             lambda: not cdi_spec_mtime(T4, uid, "yaml") and uid not in checkpoint(T4),
             timeout=90, explain=lambda: f"spec time {cdi_spec_mtime(T4, uid, 'yaml')!r}, "
                                         f"checkpoint: {sorted(checkpoint(T4))}\n{diagnose(T4)}")
    node_sh(T4, f"rm -f {PLUGIN_DIR}/checkpoint.json.taken-over-by-gpukit")


def test_specs_lost_while_the_plugin_was_down_are_back_and_the_claim_shows_its_device(
        deployed: AgentDeployment, core: client.CoreV1Api, resource: client.ResourceV1Api,
        cleanup: list[str]) -> None:
    """A prepared claim's status.devices names its device with the device's UUID (server-side
    apply under the plugin's own RBAC, the API server's granular status authorization); its
    CDI spec, removed as a reboot empties /var/run/cdi, is back, the same, once the restarted
    plugin is registered, and a container of the pod started after that gets its GPU."""
    claim = create_claim(resource, cleanup, claim_doc(unique("restore")))
    pod = unique("restore")
    run_pod(core, cleanup, pod_doc(pod, T4, {"gpu": claim}))
    doc = json.loads(resource.read_namespaced_resource_claim(claim, NS,
                                                             _preload_content=False).data)
    uid = doc["metadata"]["uid"]
    (result,) = doc["status"]["allocation"]["devices"]["results"]
    uuid_ = slice_devices(resource, T4)[result["device"]]["attributes"]["uuid"]["string"]
    entries = [(e["driver"], e["pool"], e["device"], e.get("data", {}).get("uuid"))
               for e in doc["status"].get("devices") or []]
    assert entries == [(DRIVER, T4, result["device"], uuid_)], (
        f"node {T4}, claim {claim}: expected status.devices with device {result['device']} "
        f"({uuid_}), observed {entries}\n{diagnose(T4)}")
    spec = CDI_SPEC.format(uid=uid, ext="json")
    before = node_sh(T4, f"cat {spec}")
    assert before, f"node {T4}, claim {claim}: expected its CDI spec {spec}, found none"
    node_sh(T4, f"rm -f {spec}")
    restart_plugin(core, T4)
    after = node_sh(T4, f"cat {spec} 2>/dev/null")
    assert after == before and "CDI spec" in plugin_log(T4), (
        f"node {T4}, claim {claim}: expected its CDI spec rewritten as it was before the "
        f"plugin registered, observed {after[:300]!r}\n{diagnose(T4)}")
    second = unique("restore")
    out = run_pod(core, cleanup, pod_doc(second, T4, {"gpu": claim}))
    assert out.status.phase == "Running", f"node {T4}, claim {claim}: pod {second} expected " \
        f"Running on the restored spec, observed {out.status.phase}"


def test_nvidias_time_slicing_config_reaches_the_container_and_a_bad_one_names_the_field(
        deployed: AgentDeployment, core: client.CoreV1Api, resource: client.ResourceV1Api,
        cleanup: list[str]) -> None:
    def config(interval: str) -> dict[str, Any]:
        return {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
                "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}}}

    good = create_claim(resource, cleanup, claim_doc(unique("ts"), config=config("Long")))
    pod = unique("ts")
    run_pod(core, cleanup, pod_doc(pod, T4, {"gpu": good}))
    env = seen(core, pod)["ENV"]
    want = {"GPUKIT_DRA_SHARING_STRATEGY=TimeSlicing", "GPUKIT_DRA_TIMESLICE_INTERVAL=Long"}
    assert want <= env, f"node {T4}, claim {good}: expected {sorted(want)} in the " \
        f"container's environment, observed {sorted(env)}"
    bad = create_claim(resource, cleanup, claim_doc(unique("ts-bad"), config=config("Fast")))
    pod = unique("ts-bad")
    core.create_namespaced_pod(NS, pod_doc(pod, T4, {"gpu": bad}))
    cleanup.append(pod)

    def prepare_error() -> str:
        events = core.list_namespaced_event(NS, field_selector=f"involvedObject.name={pod}")
        return " ".join(e.message or "" for e in events.items
                        if "timeSlicingConfig" in (e.message or ""))

    message = wait_for(f"node {T4}, claim {bad}: the prepare error on pod {pod}",
                       prepare_error, timeout=90, explain=lambda: diagnose(T4))
    assert "timeSlicingConfig.interval: 'Fast' is not one of Default, Short, Medium, Long" in \
        message and bad in message, f"node {T4}, claim {bad}: expected the field and value " \
        f"named, observed {message!r}"
    assert core.read_namespaced_pod(pod, NS).status.phase == "Pending"


def test_nvidias_mps_config_serves_a_claim_through_its_own_daemon_within_its_limit(
        deployed: AgentDeployment, core: client.CoreV1Api, resource: client.ResourceV1Api,
        cleanup: list[str]) -> None:
    """A GpuConfig sharing with MPS (as NVIDIA's DRA driver documents it): gpukit's MPS control
    container runs the claim's daemon with the GPU in EXCLUSIVE_PROCESS, the claim's
    containers are its clients, one asking for more than the pinned memory limit fails as on
    MPS (out of memory); the claim gone, so are the daemon and the compute mode."""
    with labtools.driver_userspace(T4):  # the MPS tools
        _mps_claim(deployed, core, resource, cleanup)


def _mps_claim(deployed: AgentDeployment, core: client.CoreV1Api,
               resource: client.ResourceV1Api, cleanup: list[str]) -> None:
    archive = workload.build_image(state_dir() / "shared" / "images")
    node_sh(T4, f"ctr -n k8s.io images import /opt/gpukit-lab/images/{archive.name}")
    wait_for("gpukit's MPS control pod on both DRA nodes",
             lambda: labtools.phases_by_node(core, deployed.namespace, MPS_APP)
             == {A100: "Running", T4: "Running"}, timeout=120)
    config = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
              "sharing": {"strategy": "MPS", "mpsConfig": {
                  "defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "4Gi"}}}
    claim = create_claim(resource, cleanup, claim_doc(unique("mps"), config=config))
    pod = unique("mps")
    volume = workload.pod_volume("/var/lib/gpukit-lab/nvml")
    doc = pod_doc(pod, T4, {"gpu": claim})
    doc["spec"]["volumes"] = [volume]
    doc["spec"]["containers"] = [
        {"name": name, "image": workload.IMAGE, "imagePullPolicy": "Never",
         "args": workload.args(mem, 20), "volumeMounts": [workload.pod_mount()],
         "resources": {"claims": [{"name": "gpu"}]}}
        for name, mem in (("within", 2000), ("over", 5000))]
    run_pod(core, cleanup, doc)
    (result,) = allocated(resource, claim)
    gpu = slice_devices(resource, T4)[result["device"]]["attributes"]["uuid"]["string"]
    uid = resource.read_namespaced_resource_claim(claim, NS).metadata.uid

    def over_failed() -> Any:
        statuses = core.read_namespaced_pod(pod, NS).status.container_statuses or []
        return next((c.state.terminated for c in statuses
                     if c.name == "over" and c.state.terminated), None)

    done = wait_for(f"node {T4}, claim {claim}: container 'over' ended", over_failed,
                    timeout=60, explain=lambda: diagnose(T4))
    assert done.exit_code == 4, f"node {T4}, claim {claim}: expected the container asking " \
        f"5000 MiB over a 4Gi limit to fail with exit 4 (out of memory), observed {done}"
    view = labtools.mps_view(T4)[gpu]
    assert view["mode"] == 3 and len(view["procs"]) == 1 and len(view["clients"]) == 1, \
        f"node {T4}, claim {claim}, GPU {gpu}: expected EXCLUSIVE_PROCESS, the MPS server and " \
        f"one client, observed {view}"
    assert f"claim-{uid}" in node_sh(T4, "ls /run/nvidia/mps")
    core.delete_namespaced_pod(pod, NS, grace_period_seconds=1)
    resource.delete_namespaced_resource_claim(claim, NS)
    wait_for(f"node {T4}: the daemon of claim {claim} gone",
             lambda: f"claim-{uid}" not in node_sh(T4, "ls /run/nvidia/mps"), timeout=90,
             explain=lambda: diagnose(T4))
    assert labtools.mps_view(T4)[gpu]["mode"] == 0


def device_taints(resource: client.ResourceV1Api, node: str, device: str
                  ) -> list[tuple[str, str, str]]:
    d = slice_devices(resource, node).get(device) or {}
    return [(t["key"], t.get("value", ""), t["effect"]) for t in d.get("taints") or []]


def test_a_critical_xid_taints_the_gpu_a_new_claim_avoids_it_and_recovery_clears_it(
        deployed: AgentDeployment, core: client.CoreV1Api, resource: client.ResourceV1Api,
        cleanup: list[str]) -> None:
    """XID 79 on gpu-1 of gpu-t4 (the mock's inject-xid): the device stays published with the
    taint gpu.nvidia.com/xid=79:NoSchedule; a new claim that only gpu-1 satisfies stays
    unschedulable while it is there; the taint goes once the device recovers (RECOVERY_S after
    the last XID) and that claim's pod then runs on gpu-1."""
    node, gpu = T4, 1
    lab_node = load_spec().node(node)
    device = f"gpu-{gpu}"
    xid79 = [("gpu.nvidia.com/xid", "79", "NoSchedule")]

    def inject() -> None:
        nodes.nvml_cli(lab_node, "inject-xid", "--gpu", str(gpu), "--xid", "79")

    def tainted() -> bool:
        if device_taints(resource, node, device) == xid79:
            return True
        inject()  # the monitor sees events raised after it registered: raise until one is seen
        return False

    wait_for(f"node {node}: {device} tainted {xid79} after XID 79", tainted, timeout=60,
             every=2, explain=lambda: f"observed {slice_devices(resource, node).get(device)}\n"
                                      f"{diagnose(node)}")
    assert device in slice_devices(resource, node), f"node {node}: {device} withdrawn, " \
        "expected it published with its taint"
    claim = create_claim(resource, cleanup, claim_doc(
        unique("taint"), selectors=[f"device.attributes['gpu.nvidia.com'].index == {gpu}"]))
    pod = unique("taint")
    core.create_namespaced_pod(NS, pod_doc(pod, node, {"gpu": claim}))
    cleanup.append(pod)

    def unschedulable() -> str | bool:
        seen_now = conditions(core.read_namespaced_pod(pod, NS))
        if "PodScheduled=False" in seen_now:
            return seen_now
        inject()  # keep the taint until the scheduler has tried
        return False

    reason = wait_for(f"pod {pod}: unschedulable while {device} is tainted", unschedulable,
                      timeout=90, every=2)
    assert not allocated(resource, claim), f"node {node}, claim {claim}: expected no " \
        f"allocation while {device} is tainted, observed {allocated(resource, claim)} ({reason})"
    wait_for(f"node {node}: {device}'s taint removed {RECOVERY_S} s after the last XID",
             lambda: device_taints(resource, node, device) == [], timeout=RECOVERY_S + 45,
             explain=lambda: f"observed {device_taints(resource, node, device)}")
    ran = waits.pod_phase(core, NS, pod, {"Running", "Failed"}, 120)
    assert ran.status.phase == "Running" and [r["device"] for r in allocated(resource, claim)] \
        == [device], f"node {node}, pod {pod}: expected Running on the recovered {device}, " \
        f"observed {ran.status.phase} {conditions(ran)} {allocated(resource, claim)}"


def device_health(core: client.CoreV1Api, pod: str, device: str) -> list[str]:
    """The health the kubelet shows for `device` in the pod's containers' status
    (allocatedResourcesStatus, from the plugin's DRA health stream; the resource ID is the
    device's CDI device, `k8s.gpu.nvidia.com/claim=<uid>-<device>`, else driver/pool/device)."""
    doc = json.loads(core.read_namespaced_pod(pod, NS, _preload_content=False).data)
    return [r.get("health", "") for c in doc["status"].get("containerStatuses") or []
            for s in c.get("allocatedResourcesStatus") or []
            for r in s.get("resources") or []
            if str(r.get("resourceID", "")).endswith((f"/{device}", f"-{device}"))]


def test_a_claims_device_health_reaches_its_pods_status(
        deployed: AgentDeployment, core: client.CoreV1Api, resource: client.ResourceV1Api,
        cleanup: list[str]) -> None:
    """The plugin serves the kubelet's DRA health stream (dra-health v1, watched with default
    feature gates since 1.36): the device a pod's claim holds shows Healthy in the pod's
    status, Unhealthy after a critical XID on it, and Healthy again once it recovered."""
    node = T4
    claim = create_claim(resource, cleanup, claim_doc(unique("health")))
    pod = unique("health")
    run_pod(core, cleanup, pod_doc(pod, node, {"gpu": claim}))
    (result,) = allocated(resource, claim)
    device = result["device"]
    index = slice_devices(resource, node)[device]["attributes"]["index"]["int"]
    wait_for(f"node {node}, pod {pod}: {device} Healthy in its status",
             lambda: device_health(core, pod, device) == ["Healthy"], timeout=60,
             explain=lambda: f"observed {device_health(core, pod, device)}\n{diagnose(node)}")

    def unhealthy() -> bool:
        if "Unhealthy" in device_health(core, pod, device):
            return True
        nodes.nvml_cli(load_spec().node(node), "inject-xid", "--gpu", str(index), "--xid", "79")
        return False

    wait_for(f"node {node}, pod {pod}: {device} Unhealthy in its status after XID 79",
             unhealthy, timeout=60, every=2,
             explain=lambda: f"observed {device_health(core, pod, device)}\n{diagnose(node)}")
    wait_for(f"node {node}, pod {pod}: {device} Healthy again {RECOVERY_S} s after the XID",
             lambda: device_health(core, pod, device) == ["Healthy"], timeout=RECOVERY_S + 60,
             explain=lambda: f"observed {device_health(core, pod, device)}")


def test_the_policy_refuses_another_nodes_slice(deployed: AgentDeployment,
                                                 core: client.CoreV1Api) -> None:
    pods = [p for p in agent.agent_pods(T4) if p.startswith(DRA_APP)]
    assert pods, f"node {T4}: no DRA plugin pod"
    code = ("from kubernetes import client, config\n"
            "config.load_incluster_config()\n"
            "api = client.ResourceV1Api()\n"
            f"body = {{'apiVersion': 'resource.k8s.io/v1', 'kind': 'ResourceSlice',"
            f" 'metadata': {{'name': 'intruder'}}, 'spec': {{'driver': '{DRIVER}',"
            f" 'nodeName': '{A100}', 'pool': {{'name': '{A100}', 'generation': 1,"
            f" 'resourceSliceCount': 1}}, 'devices': []}}}}\n"
            "try:\n    api.create_resource_slice(body); print('CREATED')\n"
            "except client.exceptions.ApiException as e:\n    print('STATUS', e.status, e.body)\n"
            "try:\n"
            f"    api.delete_resource_slice('{A100}-{DRIVER}-0'); print('DELETED')\n"
            "except client.exceptions.ApiException as e:\n"
            "    print('DELETE STATUS', e.status, e.body)\n")
    kubectl = str(cluster.kubernetes_bindir(load_spec()) / "kubectl")
    r = subprocess.run([kubectl, f"--kubeconfig={paths().admin_kubeconfig}", "-n",
                        "gpukit-system", "exec", pods[0], "--", "python3", "-c", code],
                       capture_output=True, text=True, timeout=60)
    assert "DELETE STATUS 403" in r.stdout and "only its own node's" in r.stdout, (
        f"node {T4}'s DRA plugin deleting {A100}'s slice: expected 403 from the own-slices "
        f"policy, observed {r.stdout}{r.stderr}")
    assert "STATUS 403" in r.stdout and "only ResourceSlices of its own node" in r.stdout, (
        f"node {T4}'s DRA plugin writing a slice of {A100}: expected 403 from the own-slices "
        f"policy, observed {r.stdout}{r.stderr}")


def test_the_conformance_suites_dra_area_passes(deployed: AgentDeployment,
                                                core: client.CoreV1Api,
                                                resource: client.ResourceV1Api,
                                                tmp_path: Any) -> None:
    """The suite's `dra` area (gpukit/conformance/test_dra.py) on both nodes, the lab inventory with
    every node declared on DRA and shared by 2 claims a device (as a play's -e would:
    --host-vars; the nodes labelled as node_labels labels them) and gpu-a100's MIG layout left
    out (its GPUs are whole until the next test): every check passes, none skipped."""
    shared = {"gpukit_gpu_allocation": "dra", "gpukit_dra_shares": 2}
    shared.update(NO_TOOLKIT_VARS)
    host_vars = {A100: {**shared, "gpukit_mig_config": None}, T4: shared}
    junit = tmp_path / "junit.xml"
    with shared_devices(core, resource, 2, A100, T4):
        r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                            str(REPO / "gpukit" / "conformance"), "--lab", "-m", "dra",
                            "--host-vars", json.dumps(host_vars), f"--junitxml={junit}", "-q"],
                           capture_output=True, text=True, timeout=900, cwd=REPO)
    tail = r.stdout[-4000:] + r.stderr[-2000:]
    assert r.returncode == 0, f"conformance -m dra: expected exit 0, observed {r.returncode}\n{tail}"
    cases = re.findall(r"<testcase [^>]*name=\"([^\"]+)\"[^>]*>(.*?)</testcase>|"
                       r"<testcase [^>]*name=\"([^\"]+)\"[^>]*/>", junit.read_text(), re.S)
    names = [a or c for a, _, c in cases]
    skipped = [a for a, body, _ in cases if a and "<skipped" in body]
    # Every check of the area, once per node (each test of the module is one check per node).
    checks = len(re.findall(r"^def test_", (REPO / "gpukit" / "conformance" / "test_dra.py")
                            .read_text(), re.M))
    assert checks >= 9 and len(names) == 2 * checks and not skipped, (
        f"conformance -m dra: expected {checks} checks x 2 nodes, none skipped; observed {names}, "
        f"skipped {skipped}\n{tail}")


def test_the_plugin_serves_every_gpus_metrics_and_a_claims_pod_labels(
        deployed: AgentDeployment, core: client.CoreV1Api, resource: client.ResourceV1Api,
        cleanup: list[str]) -> None:
    """A DRA node runs no node agent: the DRA plugin answers its /readyz and serves its GPU
    metrics (dcgm-exporter's names) for every GPU of the node; the GPU a claim's pod holds
    carries the pod's pod, namespace and container (the kubelet's PodResources, cached 5 s),
    no other GPU does."""
    for node in (A100, T4):
        status, body = agent_http(node, "/readyz")
        assert status == 200 and body.startswith("ok: registered"), (
            f"node {node}: DRA plugin /readyz expected 200 'ok: registered...', observed "
            f"{status} {body!r}")
        uuids = set(nodes.gpu_uuids(load_spec().node(node)))
        got = {labels["UUID"] for _, labels, _ in plugin_metrics(node)}
        assert got == uuids, f"node {node}: DCGM_FI_DEV_FB_USED expected for GPUs " \
            f"{sorted(uuids)}, observed {sorted(got)}"
    claim = create_claim(resource, cleanup, claim_doc(unique("metrics")))
    pod = unique("metrics")
    run_pod(core, cleanup, pod_doc(pod, T4, {"gpu": claim}))
    (result,) = allocated(resource, claim)
    uuid = slice_devices(resource, T4)[result["device"]]["attributes"]["uuid"]["string"]
    labels = wait_for(f"node {T4}, claim {claim}: pod {pod} on {result['device']}'s series",
                      lambda: held_by(T4, pod), timeout=30,
                      explain=lambda: f"observed {plugin_metrics(T4)}")
    assert {(x["UUID"], x["namespace"], x["container"]) for x in labels} == {(uuid, NS, "c0")}, \
        f"node {T4}, claim {claim} ({result['device']}): expected the pod on {uuid} only " \
        f"(namespace {NS}, container c0), observed {labels}"
    others = [x for _, x, _ in plugin_metrics(T4) if x["UUID"] != uuid and "pod" in x]
    assert not others, f"node {T4}: expected no pod on other GPUs, observed {others}"


def declaration_gauges(node: str, kind: str = GPU_KIND) -> tuple[float | None, float | None]:
    """(gpukit_node_gpus_declared, gpukit_node_gpus_served) of `kind` on the plugin's metrics."""
    status, body = agent_http(node, "/metrics")
    assert status == 200, f"node {node}: DRA plugin /metrics expected 200, observed {status}"
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            if s.name in ("gpukit_node_gpus_declared", "gpukit_node_gpus_served") and \
                    s.labels.get("resource") == kind:
                found[s.name] = s.value
    return found.get("gpukit_node_gpus_declared"), found.get("gpukit_node_gpus_served")


def serves_declared(core: client.CoreV1Api, node: str) -> client.V1NodeCondition | None:
    """The node's condition when it is False and names the node's declared counts."""
    c = declaration_condition(core, node)
    counts = declared(node).counts()
    if c is None or not nd.serves({"status": c.status, "message": c.message}, node, counts):
        return None
    return c


def test_the_plugin_says_its_node_serves_its_declaration_and_a_lost_gpu_at_once(
        deployed: AgentDeployment, core: client.CoreV1Api,
        resource: client.ResourceV1Api) -> None:
    """Served vs declared on a DRA node (issue 30), through the plugin's own status patch
    (the agent's condition policy admits it): after setup each node's condition is False with
    reason ServesDeclaration and names its declared counts, and the gauges agree; gpu-1 of
    gpu-t4 lost (the mock's `lose`: NVML_ERROR_GPU_IS_LOST) raises the condition True with the
    declared and served counts, a Warning Event and the served gauge within seconds; restored,
    all clear: condition False again, a Normal Event, the gauges equal."""
    for node in (A100, T4):
        n = declared(node).counts()[GPU_KIND]
        c = wait_for(f"node {node}: condition {nd.CONDITION_TYPE} False naming {GPU_KIND} {n}",
                     lambda n_=node: serves_declared(core, n_), timeout=60,
                     explain=lambda n_=node: f"observed {declaration_condition(core, n_)}\n"
                                             f"{diagnose(n_)}")
        assert c.reason == nd.REASON_OK, f"node {node}: reason expected {nd.REASON_OK}, " \
            f"observed {c.reason}"
        assert declaration_gauges(node) == (n, n), f"node {node}: gauges declared/served " \
            f"expected ({n}, {n}), observed {declaration_gauges(node)}"
    lab_node, gpu, n = load_spec().node(T4), 1, declared(T4).counts()[GPU_KIND]
    cleared_before = len(declaration_events(core, T4, nd.EVENT_CLEARED))
    lost = f"node {T4}: {GPU_KIND} declared {n}, served {n - 1}"
    start = time.monotonic()
    nodes.nvml_cli(lab_node, "lose", "--gpu", str(gpu))
    try:
        c = wait_for(f"node {T4}: condition True after GPU {gpu} lost",
                     lambda: (x := declaration_condition(core, T4)) is not None
                     and x.status == "True" and x, timeout=30,
                     explain=lambda: f"observed {declaration_condition(core, T4)}\n"
                                     f"{diagnose(T4)}")
        raised = time.monotonic() - start
        assert (c.reason, c.message) == (nd.REASON_DEVICES, lost), f"node {T4}: expected " \
            f"{nd.REASON_DEVICES}: {lost!r}, observed {c.reason}: {c.message!r}"
        wait_for(f"node {T4}: Warning Event {nd.EVENT_MISMATCH}",
                 lambda: lost in declaration_events(core, T4, nd.EVENT_MISMATCH), timeout=10)
        assert declaration_gauges(T4) == (n, n - 1), f"node {T4}: gauges expected " \
            f"({n}, {n - 1}), observed {declaration_gauges(T4)}"
        assert raised < 15, f"node {T4}: the condition took {raised:.1f} s"
    finally:
        nodes.nvml_cli(lab_node, "restore", "--gpu", str(gpu))
    wait_for(f"node {T4}: condition False again naming {GPU_KIND} {n}",
             lambda: serves_declared(core, T4), timeout=60,
             explain=lambda: f"observed {declaration_condition(core, T4)}\n"
                             f"{slice_devices(resource, T4).keys()}")
    wait_for(f"node {T4}: Normal Event {nd.EVENT_CLEARED}",
             lambda: len(declaration_events(core, T4, nd.EVENT_CLEARED)) > cleared_before,
             timeout=10)
    wait_for(f"node {T4}: gauges ({n}, {n}) again", lambda: declaration_gauges(T4) == (n, n),
             timeout=10, explain=lambda: f"observed {declaration_gauges(T4)}")


# The MIG manager's layouts for gpu-a100's GPU 0 (the inventory's gpukit_mig_configs shape).
MIG_LAYOUTS = {
    "dra-3g": [{"devices": [0], "mig-enabled": True, "mig-devices": {"3g.20gb": 2}}],
    "dra-whole": [{"devices": [0], "mig-enabled": False}],
    # GPU 7 is dynamic in the dynamic MIG test: the MIG manager must skip it
    "dra-7-3g": [{"devices": [7], "mig-enabled": True, "mig-devices": {"3g.20gb": 2}}],
}


def mig_cli(node: str, selected: str) -> tuple[int, dict[str, Any]]:
    """`python -m gpukit.plugin.mig apply --json` against `node`'s GPUs (its mock NVML state)
    and its DRA plugin's checkpoint, as a host-run MIG manager sees them (the node's files
    through its init's root); no pause file: a DRA node has no device plugin to pause."""
    from gpukit.lab import nvml

    spec = load_spec()
    init = cluster.init_proc(spec.node(node))
    assert init is not None, f"node {node}: not running"
    r = nodes.root(spec.node(node))
    env = nvml.env(r / "etc/gpukit-lab/nvml/profile.yaml", r / "var/lib/gpukit-lab/nvml")
    proc = subprocess.run(
        [sys.executable, "-m", "gpukit.plugin.mig", "apply", "--configs-json",
         json.dumps(MIG_LAYOUTS), "--selected", selected, "--pause-file", "", "--json",
         "--dra-checkpoint",
         f"/proc/{init.pid}/root{PLUGIN_DIR}/gpukit-checkpoint.json"],
        env=env, capture_output=True, text=True, timeout=180)
    try:
        doc: dict[str, Any] = json.loads(proc.stdout)
    except ValueError:
        doc = {"stdout": proc.stdout, "stderr": proc.stderr[-2000:]}
    return proc.returncode, doc


def test_a_mig_layout_change_republishes_and_a_mig_claim_runs(
        deployed: AgentDeployment, core: client.CoreV1Api, resource: client.ResourceV1Api,
        cleanup: list[str]) -> None:
    """The MIG manager's CLI puts GPU 0 of gpu-a100 into two 3g.20gb while no claim holds it:
    its slice device gives way to the two MIG devices NVIDIA's driver would name, at
    placements 0 and 4, and the plugin's metrics have both GPU instances' series; a
    mig.nvidia.com claim gets one, its container its parent's node and that instance's series
    its pod. While the claim is prepared the CLI refuses to change GPU 0, naming the claim,
    and the layout stays; once the pod is gone it makes GPU 0 whole again."""
    generation = max(s["spec"]["pool"]["generation"] for s in slices(resource, A100))
    rc, doc = mig_cli(A100, "dra-3g")
    want = {"gpu-0-mig-3g20gb-9-0", "gpu-0-mig-3g20gb-9-4"} | {f"gpu-{i}" for i in range(1, 8)}
    try:
        assert rc == 0 and doc.get("changed") is True, f"node {A100}: MIG CLI apply dra-3g " \
            f"expected exit 0 and a change, observed {rc}: {doc}"
        wait_for(f"node {A100}: MIG devices {sorted(want)} published",
                 lambda: set(slice_devices(resource, A100)) == want, timeout=90,
                 explain=lambda: f"observed {sorted(slice_devices(resource, A100))}\n"
                                 f"{diagnose(A100)}")
        gens = {s["spec"]["pool"]["generation"] for s in slices(resource, A100)}
        assert gens and min(gens) > generation, f"node {A100}: expected a generation above " \
            f"{generation} after the MIG change, observed {gens}"
        mig = slice_devices(resource, A100)["gpu-0-mig-3g20gb-9-4"]
        attrs = {k: next(iter(v.values())) for k, v in mig["attributes"].items()}
        assert (attrs["type"], attrs["profile"]) == ("mig", "3g.20gb"), \
            f"node {A100}, gpu-0-mig-3g20gb-9-4: observed attributes {attrs}"
        assert mig["capacity"]["multiprocessors"]["value"] == "42" and \
            mig["capacity"]["memorySlice4"]["value"] == "1", \
            f"node {A100}, gpu-0-mig-3g20gb-9-4: observed capacity {mig['capacity']}"
        gpu0 = nodes.gpu_uuids(load_spec().node(A100))[0]

        def instances() -> list[dict[str, str]]:
            return [x for _, x, _ in plugin_metrics(A100)
                    if x["UUID"] == gpu0 and x.get("GPU_I_PROFILE") == "3g.20gb"]

        wait_for(f"node {A100}: the metrics of GPU 0's two 3g.20gb instances",
                 lambda: len({x["GPU_I_ID"] for x in instances()}) == 2, timeout=30,
                 explain=lambda: f"observed {instances()}")
        claim = create_claim(resource, cleanup, claim_doc(unique("mig"), cls="mig.nvidia.com"))
        pod = unique("mig")
        run_pod(core, cleanup, pod_doc(pod, A100, {"gpu": claim}))
        got = seen(core, pod)
        assert gpu_nodes(got["DEV"]) == {"nvidia0"}, f"node {A100}, claim {claim} (MIG): " \
            f"expected its parent's node nvidia0, observed {sorted(got['DEV'])}"
        (result,) = allocated(resource, claim)
        labels = wait_for(f"node {A100}, claim {claim}: pod {pod} on {result['device']}'s "
                          "series", lambda: held_by(A100, pod), timeout=30,
                          explain=lambda: f"observed {instances()}")
        held = {(x["UUID"], x.get("GPU_I_PROFILE"), x["namespace"], x["container"])
                for x in labels}
        assert held == {(gpu0, "3g.20gb", NS, "c0")} and len(labels) == 1 and len(
            [x for x in instances() if "pod" not in x]) == 1, (
            f"node {A100}, claim {claim} ({result['device']}): expected the pod on exactly one "
            f"of GPU 0's 3g.20gb instances, observed {labels}; instances {instances()}")
        rc, doc = mig_cli(A100, "dra-whole")
        uid = resource.read_namespaced_resource_claim(claim, NS).metadata.uid
        assert rc == 1 and f"GPU 0: claim {NS}/{claim}" in str(doc.get("msg")), (
            f"node {A100}, claim {claim} prepared on GPU 0: MIG CLI apply dra-whole expected "
            f"exit 1 naming the claim, observed {rc}: {doc}")
        assert set(slice_devices(resource, A100)) == want and uid in checkpoint(A100), (
            f"node {A100}: after the refusal expected {sorted(want)} and the claim prepared, "
            f"observed {sorted(slice_devices(resource, A100))}")
        core.delete_namespaced_pod(pod, NS, grace_period_seconds=0)
        wait_for(f"node {A100}, claim {claim}: unprepared after its pod",
                 lambda: uid not in checkpoint(A100) and not _exists(
                     core.read_namespaced_pod, pod), timeout=90)
        rc, doc = mig_cli(A100, "dra-whole")
        assert rc == 0 and doc.get("changed") is True, f"node {A100}: MIG CLI apply " \
            f"dra-whole with no claim expected exit 0 and a change, observed {rc}: {doc}"
        wait_for(f"node {A100}: 8 whole GPUs again after the CLI",
                 lambda: set(slice_devices(resource, A100)) == {f"gpu-{i}" for i in range(8)},
                 timeout=90, explain=lambda: f"observed {sorted(slice_devices(resource, A100))}")
    finally:
        for name in list(cleanup):
            try:
                core.delete_namespaced_pod(name, NS, grace_period_seconds=0)
            except ApiException:
                pass
        wait_for("MIG test pods gone", lambda: not [
            p for p in cleanup if _exists(core.read_namespaced_pod, p)], timeout=90)
        if set(slice_devices(resource, A100)) != {f"gpu-{i}" for i in range(8)}:
            nodes.nvml_cli(load_spec().node(A100), "reset", "--gpu", "0")
            node_pynvml(A100, MIG_MODE, "destroy")
            nodes.nvml_cli(load_spec().node(A100), "reset", "--gpu", "0")
        wait_for(f"node {A100}: 8 whole GPUs again",
                 lambda: set(slice_devices(resource, A100)) == {f"gpu-{i}" for i in range(8)},
                 timeout=90)


# GPU instances (profile, start) and MIG mode of GPU argv[1] on a node's mock GPUs; or, with
# argv[2] "off", MIG mode disabled (pending until the GPU is reset).
GPU_INSTANCES = """
import json, sys, pynvml as n
from gpukit.plugin.nvml.mig import PynvmlBackend
n.nvmlInit()
i = int(sys.argv[1])
if len(sys.argv) > 2:
    n.nvmlDeviceSetMigMode(n.nvmlDeviceGetHandleByIndex(i), 0)
g = PynvmlBackend().gpu(i)
print(json.dumps({"mig": g.mig_current, "gis": [[x.profile, x.start, len(x.compute_instances)]
                                                for x in g.gpu_instances]}))
"""


def gpu_instances(node: str, index: int, *args: str) -> dict[str, Any]:
    from gpukit.lab import nvml

    r = nodes.root(load_spec().node(node))
    env = nvml.env(r / "etc/gpukit-lab/nvml/profile.yaml", r / "var/lib/gpukit-lab/nvml")
    proc = subprocess.run([sys.executable, "-c", GPU_INSTANCES, str(index), *args], env=env,
                          capture_output=True, text=True, check=True, timeout=60)
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


def test_a_dynamic_mig_claim_is_carved_at_prepare_and_destroyed_after(
        api: Any, deployed: AgentDeployment, core: client.CoreV1Api,
        resource: client.ResourceV1Api, cleanup: list[str]) -> None:
    """gpu-a100's GPU 7 declared for dynamic MIG (its declaration entry's draDynamicMig, as
    the device_plugin role renders gpukit_dra_dynamic_mig; 1g.5gb only): its counter set and
    its seven 1g.5gb placements are published beside the other GPUs. A mig.nvidia.com claim
    selecting profile 1g.5gb runs a pod that sees GPU 7's node and the new instance's two
    nvidia-caps nodes; while the claim is prepared the GPU instance exists on the node (MIG
    mode enabled by prepare) and the MIG manager skips GPU 7 (a layout for it changes nothing);
    after the pod and the claim are deleted the instance is gone."""
    dynamic = {**deployed.declarations, A100: {**deployed.declarations[A100],
                                               "draDynamicMig": {"7": ["1g.5gb"]}}}
    carved = {f"gpu-7-mig-1g5gb-19-{i}" for i in range(7)}
    before = set(slice_devices(resource, A100))  # what the node publishes: back afterwards
    objects.apply(api, [agent_manifests.declarations_map(replace(deployed,
                                                                 declarations=dynamic))],
                  field_manager="gpukit-lab")
    claim, pod = unique("dyn"), unique("dyn")
    try:
        def counter_sets() -> list[str]:
            return [c["name"] for s in slices(resource, A100)
                    for c in s["spec"].get("sharedCounters") or []]

        wait_for(f"node {A100}: GPU 7's counter set and 1g.5gb placements published",
                 lambda: counter_sets() == ["gpu-7-counter-set"]
                 and carved <= set(slice_devices(resource, A100)), timeout=180,
                 explain=lambda: f"observed {counter_sets()} "
                                 f"{sorted(slice_devices(resource, A100))}\n{diagnose(A100)}")
        assert gpu_instances(A100, 7)["gis"] == [], f"node {A100}: GPU 7 carved before a claim"
        create_claim(resource, cleanup, claim_doc(claim, cls="mig.nvidia.com", selectors=[
            'device.attributes["gpu.nvidia.com"].profile == "1g.5gb"']))
        run_pod(core, cleanup, pod_doc(pod, A100, {"gpu": claim}), timeout=180)
        (result,) = allocated(resource, claim)
        assert result["device"] in carved, f"node {A100}, claim {claim}: expected one of " \
            f"GPU 7's 1g.5gb placements, observed {result}"
        start = int(result["device"].rsplit("-", 1)[1])
        got = seen(core, pod)
        minor = minor_of(resource, A100, "gpu-7")
        assert gpu_nodes(got["DEV"]) == {f"nvidia{minor}"} and len(got["CAPS"]) == 2, (
            f"node {A100}, claim {claim} ({result['device']}): expected nvidia{minor} and the "
            f"instance's two nvidia-caps nodes, observed {sorted(got['DEV'])} "
            f"{sorted(got['CAPS'])}")
        state = gpu_instances(A100, 7)
        assert state == {"mig": True, "gis": [["1g.5gb", start, 1]]}, (
            f"node {A100}, claim {claim}: expected MIG on and one 1g.5gb instance at {start} "
            f"on GPU 7, observed {state}")
        uid = resource.read_namespaced_resource_claim(claim, NS).metadata.uid
        recorded = [d.get("instance") for d in checkpoint(A100)[uid]["devices"]]
        assert [(x or {}).get("start") for x in recorded] == [start], (
            f"node {A100}, claim {claim}: expected the instance in the checkpoint, observed "
            f"{recorded}")
        rc, doc = mig_cli(A100, "dra-7-3g")
        assert rc == 0 and doc.get("changed") is False and \
            gpu_instances(A100, 7)["gis"] == [["1g.5gb", start, 1]], (
                f"node {A100}: MIG manager layout for GPU 7 expected skipped (exit 0, no "
                f"change, the claim's instance kept), observed {rc}: {doc}")
        for name in (pod, claim):
            delete_if_there(core.delete_namespaced_pod if name == pod
                            else resource.delete_namespaced_resource_claim, name, NS,
                            grace_period_seconds=0)
            wait_for(f"{name} gone", lambda n=name: not _exists(
                core.read_namespaced_pod if n == pod
                else resource.read_namespaced_resource_claim, n), timeout=90)
        wait_for(f"node {A100}, claim {claim}: unprepared and GPU 7's instance destroyed",
                 lambda: uid not in checkpoint(A100) and gpu_instances(A100, 7)["gis"] == [],
                 timeout=90, explain=lambda: f"observed {gpu_instances(A100, 7)}\n"
                                             f"{diagnose(A100)}")
    finally:
        for name in (pod, claim):
            delete_if_there(core.delete_namespaced_pod, name, NS, grace_period_seconds=0)
            delete_if_there(resource.delete_namespaced_resource_claim, name, NS,
                            grace_period_seconds=0)
        wait_for(f"pod {pod} gone", lambda: not _exists(core.read_namespaced_pod, pod),
                 timeout=90)
        objects.apply(api, [agent_manifests.declarations_map(deployed)],
                      field_manager="gpukit-lab")
        wait_for(f"node {A100}: no counter set once GPU 7 is no longer dynamic",
                 lambda: not any(s["spec"].get("sharedCounters")
                                 for s in slices(resource, A100)), timeout=180)
        if gpu_instances(A100, 7)["mig"]:  # prepare enabled MIG mode: GPU 7 whole again
            gpu_instances(A100, 7, "off")
            nodes.nvml_cli(load_spec().node(A100), "reset", "--gpu", "7")
        wait_for(f"node {A100}: its devices as before the test",
                 lambda: set(slice_devices(resource, A100)) == before, timeout=90,
                 explain=lambda: f"expected {sorted(before)}, observed "
                                 f"{sorted(slice_devices(resource, A100))}")
