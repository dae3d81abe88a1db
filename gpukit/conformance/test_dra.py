"""DRA: on every node the inventory declares on DRA (`gpukit_gpu_allocation: dra`), the
ResourceSlices of driver gpu.nvidia.com publish exactly the declared GPUs or MIG layout with
NVIDIA's names and attributes, the node keeps no nvidia.com/ extended resources, and claims
are served and isolated: disjoint devices, a container sees exactly its claimed device, a pod
without a claim sees none, two containers on one claim see the same device, CEL selectors by
productName and memory pick the node's devices, each device's PCIe root is the one the
node's sysfs shows for its PCI address (a MIG device its GPU's), an unsatisfiable claim
stays Pending with the scheduler's reason; on a node declared shared (`gpukit_dra_shares: N`)
N pods' claims share one device and one more waits; device taints are NVIDIA's health taints
and a lost GPU's device carries gpu-lost. Nodes not on DRA are skipped by name.

Claims are written as for NVIDIA's DRA driver (DeviceClasses gpu.nvidia.com, mig.nvidia.com),
in the run's namespace (deleted with it)."""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpukit import inventory as inv
from gpukit.conformance import expect
from gpukit.conformance.checks import Check
from gpukit.conformance.cluster import PodState, pod_manifest
from gpukit.conformance.common import check_declaration_condition, need_decl
from gpukit.contracts import node_declaration as nd
from gpukit.contracts.cncf_ai_conformance import SECURE_ACCELERATOR_ACCESS
from gpukit.contracts.dra import (
    GPU_CLASS,
    MIG_CLASS,
    PCI_BUS_ID_ATTRIBUTE,
    PCIE_ROOT_ATTRIBUTE,
    SHARES_CAPACITY,
    TAINT_GPU_LOST,
    TAINT_XID,
    parse_device_name,
)
from gpukit.contracts.label_names import RESOURCE_PREFIX

pytestmark = [pytest.mark.dra, pytest.mark.applies_to("dra")]

DRIVER = expect.DRA_DRIVER
# What a container sees: its GPU device nodes (not the control nodes nvidiactl, nvidia-uvm...).
LIST_GPUS = ('echo "DEV=$(ls /dev | grep -E "^nvidia[0-9]+$" | tr "\\n" " ")"; '
             "exec sleep 3600")


# -- what the node publishes ----------------------------------------------------------------


def _need_dra(suite: Any, node: str, check: Check) -> inv.NodeDecl:
    decl = need_decl(suite, node)
    if not decl.dra:
        check.skip(f"not on DRA (gpukit_gpu_allocation: {decl.gpu_allocation})")
    return decl


def node_slices(suite: Any, node: str) -> list[dict[str, Any]]:
    """The node's ResourceSlices of NVIDIA's driver name, from the area's one list of
    ResourceSlices (plain JSON)."""
    slices: list[dict[str, Any]] = suite.listed_slices(node, DRIVER)
    return slices


def live_node_slices(api_client: Any, node: str) -> list[dict[str, Any]]:
    """The node's ResourceSlices of NVIDIA's driver name as the API has them now."""
    resp = client.ResourceV1Api(api_client).list_resource_slice(
        field_selector=f"spec.nodeName={node},spec.driver={DRIVER}", _preload_content=False)
    items: list[dict[str, Any]] = json.loads(resp.data)["items"]
    return items


def slice_devices(slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The devices of the pool's newest generation (older generations are being replaced)."""
    newest = max((s["spec"]["pool"]["generation"] for s in slices), default=0)
    return [d for s in slices if s["spec"]["pool"]["generation"] == newest
            for d in s["spec"].get("devices") or []]


def _key(device: dict[str, Any]) -> tuple[str, int, str]:
    """(type, GPU index or parent index, profile) of a published device."""
    attrs = device.get("attributes") or {}
    kind = (attrs.get("type") or {}).get("string", "")
    where = attrs.get("parentIndex" if kind == "mig" else "index") or {}
    return kind, int(where.get("int", -1)), (attrs.get("profile") or {}).get("string", "")


def _expected_key(d: expect.ExpectedDraDevice) -> tuple[str, int, str]:
    return d.type, d.gpu_index, d.profile or ""


def _describe(key: tuple[str, int, str]) -> str:
    kind, index, profile = key
    return f"GPU {index}" if kind == "gpu" else f"MIG {profile} on GPU {index}"


def test_slices_equal_the_declaration(gpukit_suite: Any, node: str, check: Check) -> None:
    """One pool named after the node; its devices are the declared GPUs, or the MIG devices of
    the declared layout, named and described as NVIDIA's driver does."""
    decl = _need_dra(gpukit_suite, node, check)
    slices = node_slices(gpukit_suite, node)
    check.equal("ResourceSlice pools", [node], sorted({s["spec"]["pool"]["name"] for s in slices}),
                DRIVER)
    want = expect.expected_dra_devices(decl)
    got = slice_devices(slices)
    check.equal("devices", sorted(Counter(_describe(_expected_key(d)) for d in want).items()),
                sorted(Counter(_describe(_key(d)) for d in got).items()), DRIVER)
    by_key: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    for d in got:
        by_key.setdefault(_key(d), []).append(d)
    for w in want:
        candidates = by_key.get(_expected_key(w)) or []
        if not candidates:
            continue  # counted above
        device = candidates.pop(0)
        what = f"{device['name']} ({w.describe()})"
        check.true(f"{what} name", bool(re.fullmatch(w.name_pattern, device["name"])),
                   w.name_pattern, device["name"], DRIVER)
        attrs = device.get("attributes") or {}
        check.subset(f"{what} attribute", w.attributes(), attrs, DRIVER)
        check.true(f"{what} attribute uuid", "uuid" in attrs, "present",
                   attrs.get("uuid", "absent"), DRIVER)
        capacity = {k: v.get("value") for k, v in (device.get("capacity") or {}).items()}
        check.subset(f"{what} capacity", w.capacity(), capacity, DRIVER)
    check.verify()


_BUS_ID = re.compile(r"^([0-9a-f]{4}):([0-9a-f]{2}):[0-9a-f]{2}\.[0-9a-f]$")
_PCIE_ROOT = re.compile(r"^pci([0-9a-f]{4}):([0-9a-f]{2})$")


def sysfs_pcie_root(host: Any, bus_id: str) -> str | None:
    """The root complex the node's sysfs shows for `bus_id`: its /sys/bus/pci/devices entry
    is the kernel's link to /sys/devices/pci<domain>:<bus>/.../<bus id>; None where it is not
    (then no attribute is due)."""
    out = host.run(f"readlink -m /sys/bus/pci/devices/{bus_id}; "
                   f"test -L /sys/bus/pci/devices/{bus_id}")
    parts = str(out.stdout).strip().split("/")
    if out.rc != 0 or len(parts) < 5 or parts[1:3] != ["sys", "devices"] or parts[-1] != bus_id:
        return None
    return parts[3] if _PCIE_ROOT.match(parts[3]) else None


def test_devices_carry_the_pcie_root_of_their_pci_address(gpukit_suite: Any, node: str,
                                                          check: Check) -> None:
    """resource.kubernetes.io/pcieRoot (Kubernetes' standard attribute, what users match to
    put a GPU and a NIC under one root complex): on every device with a PCI address it is
    `pci<domain>:<bus>` of that address's domain and a bus not above it, the same for every
    MIG device of one GPU; with host access, exactly what the node's sysfs shows for the
    address (and absent where sysfs shows none)."""
    _need_dra(gpukit_suite, node, check)
    devices = slice_devices(node_slices(gpukit_suite, node))
    host = gpukit_suite.host(node) if gpukit_suite.options.host_access else None
    from_sysfs: dict[str, str | None] = {}
    by_parent: dict[str, set[str | None]] = {}
    for device in devices:
        attrs = device.get("attributes") or {}
        bus_id = str((attrs.get(PCI_BUS_ID_ATTRIBUTE) or {}).get("string") or "")
        root = (attrs.get(PCIE_ROOT_ATTRIBUTE) or {}).get("string")
        what = f"{device['name']} {PCIE_ROOT_ATTRIBUTE}"
        parent = str((attrs.get("parentUUID") or attrs.get("uuid") or {}).get("string") or "")
        by_parent.setdefault(parent, set()).add(root)
        bus = _BUS_ID.match(bus_id)
        if root is not None:
            form = _PCIE_ROOT.match(str(root))
            ok = bool(form and bus and form[1] == bus[1] and int(form[2], 16) <= int(bus[2], 16))
            check.true(what, ok, f"pci<domain>:<bus> of {bus_id or 'its PCI address'}'s domain, "
                       "at or above its bus", root, DRIVER)
        if host is not None and bus:
            if bus_id not in from_sysfs:
                from_sysfs[bus_id] = sysfs_pcie_root(host, bus_id)
            check.equal(f"{what} (the node's /sys/bus/pci/devices/{bus_id})",
                        from_sysfs[bus_id] or "absent", root or "absent", DRIVER)
    for parent, roots in sorted(by_parent.items()):
        check.true(f"{PCIE_ROOT_ATTRIBUTE} of GPU {parent}'s devices", len(roots) == 1,
                   "one value", sorted(map(str, roots)), DRIVER)
    if not check.rows:
        check.true("devices with a PCI address", False, "at least one", "none", DRIVER)
    check.verify()


def test_the_dra_plugin_s_declaration_condition_agrees(gpukit_suite: Any, node: str,
                                                       check: Check) -> None:
    """On a DRA node the DRA plugin reports served vs declared as the agent does elsewhere:
    its condition GpuDeclarationMismatch is True exactly while the devices it publishes
    untainted (by kind: whole GPUs, MIG devices per profile) differ from the declaration,
    False otherwise."""
    decl = _need_dra(gpukit_suite, node, check)
    declared = nd.dra_counts({"type": d.type, "profile": d.profile}
                             for d in expect.expected_dra_devices(decl))
    served: Counter[str] = Counter()
    for d in slice_devices(node_slices(gpukit_suite, node)):
        if any(t.get("effect") in ("NoSchedule", "NoExecute") for t in d.get("taints") or []):
            continue
        attrs = d.get("attributes") or {}
        served[nd.dra_kind(str((attrs.get("type") or {}).get("string") or ""),
                           str((attrs.get("profile") or {}).get("string") or "") or None)] += 1
    check_declaration_condition(
        check, gpukit_suite.listed_node(node), dict(served) != declared,
        f"published {dict(sorted(served.items()))}, declared {declared}", "DRA plugin")
    check.verify()


def test_no_extended_resources_on_a_dra_node(gpukit_suite: Any, node: str, check: Check
                                             ) -> None:
    """No nvidia.com/ extended resource in the node's capacity or allocatable: a stale
    nvidia.com/gpu count (a device plugin served the node before) would let the scheduler
    place pods the kubelet cannot give a GPU."""
    _need_dra(gpukit_suite, node, check)
    status = gpukit_suite.listed_node(node).status
    for field in ("capacity", "allocatable"):
        stale = sorted(r for r in (getattr(status, field) or {}) if r.startswith(RESOURCE_PREFIX))
        check.equal(f"nvidia.com/ resources in {field}", [], stale)
    check.verify()


# -- claims and pods ------------------------------------------------------------------------


class Claims:
    """The test's ResourceClaims and pods on one node, in the run's namespace."""

    def __init__(self, suite: Any, node: str) -> None:
        self.suite, self.node = suite, node
        self.ns: str = suite.namespace
        self.resource = client.ResourceV1Api(suite.kube.api_client)
        self.pods: list[str] = []
        self.claims: list[str] = []

    def claim(self, role: str, device_class: str, count: int = 1, selector: str | None = None,
              shares: int | None = None) -> str:
        """`shares`: the device's shares the claim takes (a node declared shared); a claim
        taking all of them has its devices to itself."""
        name: str = self.suite.pod_name(f"dra-{role}", self.node)
        exactly: dict[str, Any] = {"deviceClassName": device_class, "allocationMode":
                                   "ExactCount", "count": count}
        if selector:
            exactly["selectors"] = [{"cel": {"expression": selector}}]
        if shares:
            exactly["capacity"] = {"requests": {SHARES_CAPACITY: str(shares)}}
        self.resource.create_namespaced_resource_claim(self.ns, {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}})
        self.claims.append(name)
        return name

    def pod(self, role: str, claim: str | None, containers: int = 1) -> str:
        name: str = self.suite.pod_name(f"dra-{role}", self.node)
        o = self.suite.options
        body = pod_manifest(name, run_id=self.suite.kube.run_id, role=f"dra-{role}",
                            node=self.node, image=o.shell_image, command=["sh", "-c", LIST_GPUS],
                            host_network=o.host_network)
        spec = body["spec"]
        first = spec["containers"][0]
        spec["containers"] = [{**first, "name": f"c{i}"} for i in range(containers)]
        if claim:
            spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim}]
            for c in spec["containers"]:
                c["resources"] = {"claims": [{"name": "gpu"}]}
        self.suite.kube.create_pod(self.ns, body)
        self.pods.append(name)
        return name

    def wait(self, names: list[str]) -> dict[str, PodState]:
        states: dict[str, PodState] = self.suite.kube.wait_pods(
            self.ns, names, self.suite.options.pod_timeout, node=self.node)
        return states

    def seen(self, pod: str, container: str = "c0") -> list[str]:
        """The GPU device nodes the container sees."""
        out = self.suite.kube.exec(self.ns, pod, ["sh", "-c", "ls /dev | grep -E "
                                                  "'^nvidia[0-9]+$' || true"],
                                   container=container).stdout
        return sorted(out.split())

    def results(self, claim: str) -> list[dict[str, Any]]:
        """The claim's allocation results of NVIDIA's driver name (its status)."""
        resp = self.resource.read_namespaced_resource_claim(claim, self.ns,
                                                            _preload_content=False)
        status = json.loads(resp.data).get("status") or {}
        results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
        return [r for r in results if r.get("driver") == DRIVER]

    def allocated(self, claim: str) -> list[str]:
        """The devices the scheduler allocated to the claim (its status)."""
        return sorted(r["device"] for r in self.results(claim))

    def close(self) -> None:
        self.suite.kube.delete_pods(self.ns, self.pods, self.suite.options.pod_timeout,
                                    node=self.node)
        for name in self.claims:
            try:
                self.resource.delete_namespaced_resource_claim(name, self.ns)
            except ApiException as exc:
                if exc.status != 404:
                    raise


@pytest.fixture
def claims(gpukit_suite: Any, node: str) -> Iterator[Claims]:
    made = Claims(gpukit_suite, node)
    try:
        yield made
    finally:
        made.close()


def _device_node(device: str) -> str:
    parsed = parse_device_name(device)
    return f"nvidia{parsed.minor}" if parsed else f"<no minor in {device}>"


def _one_class(decl: inv.NodeDecl) -> str:
    """The class of a device the node has: a whole GPU where one is left, else a MIG device."""
    kinds = {d.type for d in expect.expected_dra_devices(decl)}
    return GPU_CLASS if "gpu" in kinds else MIG_CLASS


def _running(check: Check, claims: Claims, states: dict[str, PodState], pods: dict[str, str]
             ) -> bool:
    ok = True
    for pod, claim in pods.items():
        ok &= check.equal(f"pod {pod} (claim {claim}) state", "Running", str(states[pod]),
                          DRIVER)
    return ok


@pytest.mark.cncf(SECURE_ACCELERATOR_ACCESS)
def test_claims_get_disjoint_devices_and_see_only_them(gpukit_suite: Any, node: str,
                                                       check: Check, claims: Claims) -> None:
    """Two claims of one device each: disjoint devices; each container sees exactly the device
    node of its claim's device (positive); a pod without a claim sees none (negative)."""
    decl = _need_dra(gpukit_suite, node, check)
    if len(expect.expected_dra_devices(decl)) < 2:
        check.skip("fewer than two devices declared")
    cls = _one_class(decl)
    if cls == MIG_CLASS:
        check.skip("no whole GPU declared (MIG devices of one parent share its device node)")
    # On a node declared shared each claim takes all of a device's shares: a device to itself.
    a, b = (claims.claim("a", cls, shares=decl.dra_shares),
            claims.claim("b", cls, shares=decl.dra_shares))
    pods = {claims.pod("a", a): a, claims.pod("b", b): b}
    bare = claims.pod("none", None)
    states = claims.wait([*pods, bare])
    if _running(check, claims, states, pods):
        devices = {c: claims.allocated(c) for c in pods.values()}
        check.equal("claims' devices overlap", [], sorted(set(devices[a]) & set(devices[b])),
                    DRIVER)
        for pod, claim in pods.items():
            want = sorted(_device_node(d) for d in devices[claim])
            check.equal(f"pod {pod} (claim {claim}, devices {devices[claim]}) sees", want,
                        claims.seen(pod), DRIVER)
    if check.equal(f"pod {bare} (no claim) state", "Running", str(states[bare])):
        check.equal(f"pod {bare} (no claim) sees", [], claims.seen(bare))
    check.verify()


@pytest.mark.cncf(SECURE_ACCELERATOR_ACCESS)
def test_two_containers_on_one_claim_see_the_same_device(gpukit_suite: Any, node: str,
                                                         check: Check, claims: Claims) -> None:
    decl = _need_dra(gpukit_suite, node, check)
    claim = claims.claim("shared", _one_class(decl))
    pod = claims.pod("shared", claim, containers=2)
    states = claims.wait([pod])
    if _running(check, claims, states, {pod: claim}):
        devices = claims.allocated(claim)
        want = sorted({_device_node(d) for d in devices})
        for container in ("c0", "c1"):
            check.equal(f"pod {pod} container {container} (claim {claim}, devices {devices}) "
                        "sees", want, claims.seen(pod, container), DRIVER)
    check.verify()


def test_cel_selectors_by_product_and_memory(gpukit_suite: Any, node: str, check: Check,
                                             claims: Claims) -> None:
    """A claim selecting the declared product and at least its memory is allocated a device of
    this node; one selecting a product the node lacks is not."""
    decl = _need_dra(gpukit_suite, node, check)
    devices = expect.expected_dra_devices(decl)
    if not devices:
        check.skip("no devices declared")
    first = devices[0]
    cls = GPU_CLASS if first.type == "gpu" else MIG_CLASS
    attr, cap = f'device.attributes["{DRIVER}"]', f'device.capacity["{DRIVER}"]'
    selector = f'{attr}.productName == "{decl.gpu.product}"'
    if first.capacity().get("memory"):
        selector += f' && {cap}.memory.compareTo(quantity("{first.capacity()["memory"]}")) >= 0'
    good = claims.claim("cel", cls, selector=selector)
    pod = claims.pod("cel", good)
    states = claims.wait([pod])
    if _running(check, claims, states, {pod: good}):
        got = claims.allocated(good)
        check.equal(f"claim {good} ({selector}) devices", 1, len(got), DRIVER)
    check.verify()


def test_an_unsatisfiable_claim_stays_pending(gpukit_suite: Any, node: str, check: Check,
                                              claims: Claims) -> None:
    """A claim for one device more than the node has keeps its pod Pending, Unschedulable, with
    the scheduler's reason."""
    decl = _need_dra(gpukit_suite, node, check)
    cls = _one_class(decl)
    kind = "gpu" if cls == GPU_CLASS else "mig"
    count = sum(1 for d in expect.expected_dra_devices(decl) if d.type == kind) + 1
    claim = claims.claim("too-many", cls, count=count, shares=decl.dra_shares)
    pod = claims.pod("too-many", claim)
    state = claims.wait([pod])[pod]  # the scheduler's verdict: PodScheduled False
    phase = state.pod.status.phase if state.pod is not None and state.pod.status else None
    check.equal(f"pod {pod} (claim {claim}: {count} x {cls}) phase", "Pending", phase, DRIVER)
    check.true(f"pod {pod} (claim {claim}) scheduler reason",
               state.state == "Unschedulable" and "claim" in state.message.lower(),
               "Unschedulable naming the claim", str(state), DRIVER)
    check.equal(f"claim {claim} devices", [], claims.allocated(claim), DRIVER)
    check.verify()


# -- sharing and health ----------------------------------------------------------------------


def _held_devices(claims: Claims, node: str) -> set[str]:
    """The node's devices some ResourceClaim (any namespace) is allocated."""
    resp = claims.resource.list_resource_claim_for_all_namespaces(_preload_content=False)
    held = set()
    for c in json.loads(resp.data).get("items") or []:
        status = c.get("status") or {}
        for r in ((status.get("allocation") or {}).get("devices") or {}).get("results") or []:
            if r.get("driver") == DRIVER and r.get("pool") == node:
                held.add(str(r.get("device")))
    return held


def _free_device(suite: Any, node: str, claims: Claims) -> dict[str, Any] | None:
    """An untainted device of the node that no claim holds, waiting up to the pod timeout for
    the claims of earlier checks to be deallocated (their pods' deletion releases them)."""
    deadline = time.monotonic() + suite.options.pod_timeout
    while True:
        held = _held_devices(claims, node)
        devices = slice_devices(live_node_slices(suite.kube.api_client, node))
        free = next((d for d in devices if not d.get("taints") and d["name"] not in held), None)
        if free is not None or time.monotonic() >= deadline:
            return free
        time.sleep(1)


def test_claims_of_several_pods_share_one_device_and_one_more_waits(
        gpukit_suite: Any, node: str, check: Check, claims: Claims) -> None:
    """A node declared shared (`gpukit_dra_shares: N`): N claims selecting one device (by its
    UUID) all get it, each with its own shareID, and their N pods run at once; the claim of
    an (N+1)th pod cannot be allocated and that pod stays Pending with the scheduler's
    reason."""
    decl = _need_dra(gpukit_suite, node, check)
    n = decl.dra_shares or 0
    if not n:
        check.skip("devices not declared shared (gpukit_dra_shares)")
    device = _free_device(gpukit_suite, node, claims)
    if not check.true("untainted devices no claim holds", device is not None, "at least one",
                      "none", DRIVER):
        check.verify()
    assert device is not None
    check.true(f"{device['name']} allowMultipleAllocations", bool(device.get(
        "allowMultipleAllocations")), True, device.get("allowMultipleAllocations"), DRIVER)
    uuid = ((device.get("attributes") or {}).get("uuid") or {}).get("string", "")
    kind = ((device.get("attributes") or {}).get("type") or {}).get("string", "")
    cls = MIG_CLASS if kind == "mig" else GPU_CLASS
    selector = f'device.attributes["{DRIVER}"].uuid == "{uuid}"'
    made = [claims.claim(f"share{i}", cls, selector=selector) for i in range(n + 1)]
    # One pod after the other, the extra one last: pods created together race for the shares
    # (one the scheduler still counts for an earlier check's claim went to the extra pod).
    pods: dict[str, str] = {}
    states: dict[str, PodState] = {}
    for i, c in enumerate(made[:n]):
        pod = claims.pod(f"share{i}", c)
        pods[pod] = c
        states.update(claims.wait([pod]))
    if _running(check, claims, states, pods):
        results = {c: claims.results(c) for c in made[:n]}
        check.equal(f"devices of claims {', '.join(made[:n])}", [[device["name"]]] * n,
                    [sorted(r["device"] for r in rs) for rs in results.values()], DRIVER)
        share_ids = sorted(str(r.get("shareID")) for rs in results.values() for r in rs)
        check.equal(f"distinct shareIDs of claims {', '.join(made[:n])} on {device['name']}",
                    n, len(set(share_ids) - {"None"}), DRIVER)
    extra = claims.pod(f"share{n}", made[n])
    state = claims.wait([extra])[extra]
    phase = state.pod.status.phase if state.pod is not None and state.pod.status else None
    check.equal(f"pod {extra} (claim {made[n]}, {device['name']}'s {n} shares taken) phase",
                "Pending", phase, DRIVER)
    check.true(f"pod {extra} (claim {made[n]}) scheduler reason",
               state.state == "Unschedulable" and "claim" in state.message.lower(),
               "Unschedulable naming the claim", str(state), DRIVER)
    check.verify()


TAINT_KEYS = (TAINT_XID, TAINT_GPU_LOST)


def test_device_taints_match_health(gpukit_suite: Any, node: str, check: Check) -> None:
    """Every taint the node's devices carry is one of NVIDIA's health taints, NoSchedule
    (`gpu.nvidia.com/xid` with an XID number as value, `gpu.nvidia.com/gpu-lost`); with host
    access, a device carries gpu-lost exactly when NVML on the node cannot query its GPU."""
    _need_dra(gpukit_suite, node, check)
    devices = slice_devices(node_slices(gpukit_suite, node))
    probe = gpukit_suite.probe(node) if gpukit_suite.options.host_access else None
    lost = {g.index for g in probe.gpus if g.error} if probe is not None else None
    for device in devices:
        attrs = device.get("attributes") or {}
        index = (attrs.get("parentIndex") or attrs.get("index") or {}).get("int")
        taints = device.get("taints") or []
        for t in taints:
            what = f"{device['name']} taint {t.get('key')}={t.get('value', '')}"
            check.true(f"{what} key", t.get("key") in TAINT_KEYS, " or ".join(TAINT_KEYS),
                       t.get("key"), DRIVER)
            check.equal(f"{what} effect", "NoSchedule", t.get("effect"), DRIVER)
            if t.get("key") == TAINT_XID:
                check.true(f"{what} value", str(t.get("value", "")).isdigit(), "an XID number",
                           t.get("value"), DRIVER)
        if lost is not None:
            check.equal(f"{device['name']} (GPU {index}) tainted {TAINT_GPU_LOST}",
                        index in lost, any(t.get("key") == TAINT_GPU_LOST for t in taints),
                        DRIVER)
    check.verify()
