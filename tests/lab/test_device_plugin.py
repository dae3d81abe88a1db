"""The device plugin served by the real kubelet on the lab's nodes.

The node agent runs as its DaemonSet (unprivileged, read-only root); the kubelet
is the judge: capacity, admission, Allocate into real containers, health.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client
from labtools import MIG_CREATE, MIG_MODE, agent_http, created_pods, node_pynvml, wait_for

from gpukit.agent_manifests import APP as AGENT_APP
from gpukit.agent_manifests import AgentDeployment
from gpukit.k8s import connect, waits
from gpukit.k8s.nodes import reported_after
from gpukit.lab import agent, cluster, images, nodes
from gpukit.lab.config import LabSpec, NodeSpec, load_spec
from gpukit.lab.controlplane import paths

pytestmark = pytest.mark.lab

CONFIGS: dict[str, dict[str, Any]] = {
    "default": {
        "version": "v1",
        "flags": {"migStrategy": "none", "plugin": {"passDeviceSpecs": True}},
    },
    "ts": {
        "version": "v1",
        "flags": {"plugin": {"passDeviceSpecs": True}},
        "sharing": {
            "timeSlicing": {
                "failRequestsGreaterThanOne": True,
                "resources": [{"name": "nvidia.com/gpu", "replicas": 4}],
            }
        },
    },
    "mixed": {
        "version": "v1",
        "flags": {"migStrategy": "mixed", "plugin": {"passDeviceSpecs": True}},
    },
    # Health checks off: selected by label to prove a reload stops the monitor (issue 14).
    "nohealth": {
        "version": "v1",
        "flags": {"migStrategy": "none", "plugin": {"passDeviceSpecs": True}},
        "gpukit": {"health": {"disabled": True}},
    },
    # An empty entry (the ConfigMap carries "{}"): invalid, never taken as defaults.
    "empty": {},
}
CONFIG_LABEL = "nvidia.com/device-plugin.config"
NS = "default"


@pytest.fixture(scope="module")
def core(lab_cluster: object) -> client.CoreV1Api:
    return connect.core(paths().admin_kubeconfig)


def node_of(spec: LabSpec, name: str) -> NodeSpec:
    return spec.node(name)


def resources(core: client.CoreV1Api, node: str, field: str = "allocatable") -> dict[str, int]:
    return resources_of(core.read_node(node), field)


def resources_of(n: client.V1Node, field: str = "allocatable") -> dict[str, int]:
    values = getattr(n.status, field) or {}
    return {k: int(v) for k, v in values.items() if k.startswith("nvidia.com/")}


def set_config(core: client.CoreV1Api, node: str, name: str | None) -> None:
    core.patch_node(node, {"metadata": {"labels": {CONFIG_LABEL: name}}})


def nvml_cli(node: str, *args: str) -> str:
    return nodes.nvml_cli(load_spec().node(node), *args)


def gpu_uuids(node: str) -> list[str]:
    return nodes.gpu_uuids(load_spec().node(node))


@pytest.fixture(scope="module")
def deployed(core: client.CoreV1Api) -> Iterator[AgentDeployment]:
    spec = load_spec()
    d = agent.lab_deployment(
        CONFIGS,
        default_config="default",
        GPUKIT_RECOVERY_SECONDS="20",
        GPUKIT_HEALTH_PROBE_INTERVAL_SECONDS="1",
        GPUKIT_RESCAN_INTERVAL_SECONDS="2",
    )
    set_config(core, "gpu-t4", "ts")
    try:
        agent.apply(spec, d)
        agent.wait_rolled_out(spec, d, timeout=120)
        # Started is not registered: the agent may take a while to start on a loaded machine.
        for node, want in (("gpu-a100", 8), ("gpu-t4", 8)):
            wait_for(f"{node}: {want} nvidia.com/gpu",
                     lambda n=node, w=want: resources(core, n).get("nvidia.com/gpu") == w,
                     timeout=120, explain=lambda n=node: agent.diagnose(spec, n))  # fmt: skip
        yield d
    finally:
        # Also after a failed start: the next module must not find this deployment or label.
        agent.remove(spec, d)
        set_config(core, "gpu-t4", None)


def gpu_pod(name: str, node: str, count: int, resource: str = "nvidia.com/gpu") -> client.V1Pod:
    script = ('echo "NVD=$NVIDIA_VISIBLE_DEVICES"; echo "DEV=$(ls /dev | grep nvidia | tr "\\n" " ")"; '
              'echo "CAPS=$(ls /dev/nvidia-caps 2>/dev/null | tr "\\n" " ")"; exec sleep 3600')
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels={"gpukit-test": "device-plugin"}),
        spec=client.V1PodSpec(
            node_selector={"kubernetes.io/hostname": node},
            restart_policy="Never",
            termination_grace_period_seconds=0,
            containers=[
                client.V1Container(
                    name="c",
                    image=images.SHELL,
                    command=["sh", "-c", script],
                    resources=client.V1ResourceRequirements(limits={resource: str(count)}),
                )
            ],
        ),
    )


def pod_report(core: client.CoreV1Api, name: str) -> tuple[list[str], set[str]]:
    def logged() -> str | None:
        out = core.read_namespaced_pod_log(name, NS)
        return out if "DEV=" in out else None

    out = wait_for(f"{name} to log its devices", logged, timeout=30)
    nvd = re.search(r"NVD=(.*)", out)
    dev = re.search(r"DEV=(.*)", out)
    assert nvd and dev, out
    return [x for x in nvd.group(1).split(",") if x], set(dev.group(1).split())


@pytest.fixture
def pods(core: client.CoreV1Api) -> Iterator[list[str]]:
    yield from created_pods(core, NS)


def start(
    core: client.CoreV1Api, pods: list[str], node: str, count: int, resource: str = "nvidia.com/gpu"
) -> str:
    name = f"gpu-{node}-{uuid.uuid4().hex[:6]}"
    core.create_namespaced_pod(NS, gpu_pod(name, node, count, resource))
    pods.append(name)
    return name


def running(core: client.CoreV1Api, name: str, timeout: float = 60) -> Any:
    return waits.pod_phase(core, NS, name, {"Running", "Failed", "Succeeded"}, timeout)


def test_capacity_and_labels_follow_hardware_and_named_config(
    core: client.CoreV1Api, deployed: AgentDeployment
) -> None:
    assert resources(core, "gpu-a100", "capacity")["nvidia.com/gpu"] == 8
    assert resources(core, "gpu-t4", "capacity")["nvidia.com/gpu"] == 2 * 4
    labels = core.read_node("gpu-t4").metadata.labels
    assert labels["nvidia.com/gpu.product"] == "Tesla-T4-SHARED"
    assert labels["nvidia.com/gpu.replicas"] == "4"
    assert labels["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    labels = core.read_node("gpu-a100").metadata.labels
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB"
    assert labels["nvidia.com/gpu.count"] == "8"
    assert labels["nvidia.com/mig.capable"] == "true"


def test_pods_get_disjoint_gpus_and_see_only_their_device_nodes(
    core: client.CoreV1Api, deployed: AgentDeployment, pods: list[str]
) -> None:
    uuids = gpu_uuids("gpu-a100")
    names = [start(core, pods, "gpu-a100", 2) for _ in range(4)]
    seen: list[str] = []
    for name in names:
        assert running(core, name).status.phase == "Running"
        ids, devs = pod_report(core, name)
        assert len(ids) == 2, ids
        seen += ids
        # The control nodes the node has (its driver loads nvidia-modeset, as a real
        # node's does) come with every GPU, as NVIDIA's plugin passes them.
        want = {f"nvidia{uuids.index(u)}" for u in ids} | {
            "nvidiactl",
            "nvidia-uvm",
            "nvidia-uvm-tools",
            "nvidia-modeset",
        }
        assert devs == want, f"{name}: sees {sorted(devs)}, assigned {ids}"
    assert sorted(seen) == sorted(uuids), "every GPU exactly once"

    extra = start(core, pods, "gpu-a100", 1)

    def unschedulable() -> str | None:
        pod = core.read_namespaced_pod(extra, NS)
        for c in pod.status.conditions or []:
            if (
                c.type == "PodScheduled"
                and c.status == "False"
                and "Insufficient nvidia.com/gpu" in (c.message or "")
            ):
                return str(c.message)
        return None

    wait_for("the 9th GPU request to be unschedulable", unschedulable, timeout=30)
    core.delete_namespaced_pod(names[0], NS, grace_period_seconds=0)
    assert running(core, extra, timeout=90).status.phase == "Running"
    ids, _ = pod_report(core, extra)
    freed, _ = pod_report(core, names[1])
    assert len(ids) == 1 and ids[0] not in freed


def test_a_pod_without_a_gpu_request_sees_no_gpu(
    core: client.CoreV1Api, deployed: AgentDeployment, pods: list[str]
) -> None:
    name = start(core, pods, "gpu-a100", 0)
    assert running(core, name).status.phase == "Running"
    ids, devs = pod_report(core, name)
    assert ids == [] and devs == set()


def test_time_sliced_replicas_spread_and_reject_more_than_one(
    core: client.CoreV1Api, deployed: AgentDeployment, pods: list[str]
) -> None:
    two = start(core, pods, "gpu-t4", 2)
    pod = running(core, two)
    assert pod.status.phase == "Failed"
    assert pod.status.reason == "UnexpectedAdmissionError", pod.status
    assert "request for 'nvidia.com/gpu: 2' too large" in (pod.status.message or "")

    names = [start(core, pods, "gpu-t4", 1) for _ in range(8)]
    per_gpu: dict[str, int] = {}
    for name in names:
        assert running(core, name).status.phase == "Running"
        ids, _ = pod_report(core, name)
        assert len(ids) == 1
        per_gpu[ids[0]] = per_gpu.get(ids[0], 0) + 1
    assert per_gpu == {u: 4 for u in gpu_uuids("gpu-t4")}


def _metrics(node: str) -> str:
    status, body = agent_http(node, "/metrics")
    assert status == 200, body
    return body


def test_critical_xid_takes_a_gpu_out_and_it_comes_back(
    core: client.CoreV1Api, deployed: AgentDeployment
) -> None:
    nvml_cli("gpu-a100", "inject-xid", "--gpu", "3", "--xid", "13")  # application error: ignored
    wait_for(
        "XID 13 counted",
        lambda: re.search(
            r'gpukit_plugin_xid_events_total\{critical="false".*xid="13"', _metrics("gpu-a100")
        ),
    )
    assert resources(core, "gpu-a100")["nvidia.com/gpu"] == 8
    nvml_cli("gpu-a100", "inject-xid", "--gpu", "3", "--xid", "79")  # fallen off the bus
    wait_for(
        "GPU 3 unhealthy", lambda: resources(core, "gpu-a100")["nvidia.com/gpu"] == 7, timeout=30
    )
    wait_for(
        "GPU 3 healthy again",
        lambda: resources(core, "gpu-a100")["nvidia.com/gpu"] == 8,
        timeout=60,
    )


def test_a_lost_gpu_is_unhealthy_without_bringing_the_plugin_down(
    core: client.CoreV1Api, deployed: AgentDeployment
) -> None:
    pods_before = {p.metadata.name: p.status.container_statuses[0].restart_count
                   for p in core.list_namespaced_pod(deployed.namespace).items}  # fmt: skip
    nvml_cli("gpu-a100", "lose", "--gpu", "5")
    try:
        wait_for(
            "GPU 5 unhealthy",
            lambda: resources(core, "gpu-a100")["nvidia.com/gpu"] == 7,
            timeout=30,
        )
    finally:
        nvml_cli("gpu-a100", "restore", "--gpu", "5")
    wait_for("GPU 5 back", lambda: resources(core, "gpu-a100")["nvidia.com/gpu"] == 8, timeout=60)
    after = {p.metadata.name: p.status.container_statuses[0].restart_count
             for p in core.list_namespaced_pod(deployed.namespace).items}  # fmt: skip
    assert after == pods_before, "the plugin must not restart for a lost GPU"


def _registrations(node: str) -> float:
    total = 0.0
    for line in _metrics(node).splitlines():
        if line.startswith("gpukit_plugin_registrations_total{") and 'result="ok"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_the_plugin_registers_again_when_the_kubelet_restarts(
    core: client.CoreV1Api, deployed: AgentDeployment, pods: list[str]
) -> None:
    node = load_spec().node("gpu-t4")
    before = _registrations("gpu-t4")
    assert before >= 1
    since = datetime.now(UTC).replace(microsecond=0)
    r = cluster.node_exec(node, ["systemctl", "restart", "kubelet"])
    assert r.returncode == 0, r.stderr
    wait_for("the plugin to register again", lambda: _registrations("gpu-t4") > before, timeout=60)
    # A report from the restarted kubelet: the node object still shows the old one's 8 until
    # then, and a pod admitted before the plugin's devices are back fails (by design).
    wait_for(
        "gpu-t4 replicas served again",
        lambda: reported_after(n := core.read_node("gpu-t4"), since)
        and resources_of(n).get("nvidia.com/gpu") == 8,
        timeout=60, explain=lambda: agent.diagnose(load_spec(), "gpu-t4"),
    )
    # Right after its restart the kubelet still counts the devices of pods deleted before it
    # (its checkpoint) as in use, until its pod sources are ready: a pod admitted then is
    # rejected (UnexpectedAdmissionError, "Available: 0"), as a user's Job would see and retry.
    rejected = []
    for _ in range(4):
        name = start(core, pods, "gpu-t4", 1)
        pod = running(core, name, timeout=90)
        if pod.status.phase == "Running" or pod.status.reason != "UnexpectedAdmissionError":
            break
        rejected.append(pod.status.message)
        time.sleep(5)
    assert pod.status.phase == "Running", (
        f"{pod.status.reason}: {pod.status.message} (earlier: {rejected})\n"
        f"{agent.diagnose(load_spec(), 'gpu-t4')}")
    ids, _ = pod_report(core, name)
    assert len(ids) == 1 and ids[0] in gpu_uuids("gpu-t4"), ids


# What the agent's container mounts on a lab node, all of it: the kubelet's device-plugins
# dir, the driver's /dev and NVML library dir (driver root /), its configs, state, CDI dir, the
# mock NVML's profile and state, the ServiceAccount token. Never the node's root.
AGENT_MOUNTS = {
    "/var/lib/kubelet/device-plugins", "/driver-root/dev", "/driver-root/usr/lib/x86_64-linux-gnu",
    "/etc/gpukit/configs", "/run/gpukit", "/tmp", "/var/run/cdi", "/etc/gpukit-lab/nvml",
    "/var/lib/gpukit-lab/nvml", "/var/run/secrets/kubernetes.io/serviceaccount",
    "/var/lib/gpukit/agent", "/host/sys", "/host-proc/proc/driver",
    "/var/lib/kubelet/pod-resources",  # read-only: which pod holds which GPU (GPU metrics)
    "/run/nvidia/mps",  # MPS daemons asked of gpukit's MPS control container, their pipes
    "/etc/gpukit/declarations",  # what the node must serve (served vs declared)
}  # fmt: skip
# Mounts every container gets from the runtime (not host paths the agent asked for).
RUNTIME_MOUNTS = {"/", "/dev", "/dev/pts", "/dev/mqueue", "/dev/shm", "/dev/termination-log",
                  "/etc/hosts", "/etc/hostname", "/etc/resolv.conf"}  # fmt: skip

# Run in the agent's container: who it is, what is mounted, and whether any file it can read
# has the content of one of the node's kubelet credentials (argv[1]: {size: [sha256]}).
LOCKED_DOWN_PROBE = r"""
import hashlib, json, os, stat, sys
secrets, expected, tries = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3:]
status = dict(l.split(":", 1) for l in open("/proc/self/status") if ":" in l)
found = []
for top, dirs, files in os.walk("/"):
    if top == "/":
        dirs[:] = [d for d in dirs if d not in ("proc", "sys")]
    for f in files:
        path = os.path.join(top, f)
        try:
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode) and str(st.st_size) in secrets:
                with open(path, "rb") as fh:
                    if hashlib.sha256(fh.read()).hexdigest() in secrets[str(st.st_size)]:
                        found.append(path)
        except OSError:
            pass
reads = {}
for path in tries:
    try:
        open(path, "rb").read(1)
        reads[path] = "READ"
    except OSError as e:
        reads[path] = type(e).__name__
print(json.dumps({
    "uid": os.getuid(), "cap_eff": status["CapEff"].strip(), "cap_bnd": status["CapBnd"].strip(),
    "mounts": sorted({l.split()[4] for l in open("/proc/self/mountinfo")}),
    "expected": sorted(os.path.realpath(p) for p in expected),
    "driver_root": sorted(os.listdir("/driver-root")), "found": found, "reads": reads,
}))
"""


def test_plugin_socket_and_pod_are_locked_down(
    core: client.CoreV1Api, deployed: AgentDeployment
) -> None:
    node = "gpu-a100"
    root = nodes.root(load_spec().node(node))
    plugins = root / "var/lib/kubelet/device-plugins"
    sock = plugins / "gpukit-gpu.sock"
    st = sock.stat()
    assert (st.st_mode & 0o777, st.st_uid) == (0o600, 0)
    # Why the agent stays uid 0: only root may create its socket here and connect to the
    # kubelet's (connect needs write permission on the socket; see gpukit/plugin/README.md).
    # (The kubelet makes the dir 0750 when it is missing; the lab's node image has it 0755.)
    pst = plugins.stat()
    assert pst.st_uid == 0 and not pst.st_mode & 0o022, oct(pst.st_mode)
    kst = (plugins / "kubelet.sock").stat()
    assert kst.st_uid == 0 and not kst.st_mode & 0o002, oct(kst.st_mode)
    pod = next(p for p in core.list_namespaced_pod(deployed.namespace).items
               if p.spec.node_name == node)  # fmt: skip
    c = pod.spec.containers[0]
    sc = c.security_context
    assert sc.privileged is False and sc.read_only_root_filesystem is True
    assert sc.capabilities.drop == ["ALL"] and sc.allow_privilege_escalation is False
    assert sc.capabilities.add is None and sc.run_as_user == 0
    assert {m.mount_path for m in c.volume_mounts} == AGENT_MOUNTS

    # The node's kubelet credentials exist, and nothing the agent can read holds one of them.
    creds = [root / "etc/kubernetes/kubelet.conf", root / "var/lib/kubelet/config.yaml",
             *(root / "etc/kubernetes/pki").glob("*.key"),
             *(root / "var/lib/kubelet/pki").glob("*.key")]  # fmt: skip
    assert len(creds) > 3, creds
    secrets: dict[str, list[str]] = {}
    for f in creds:
        data = f.read_bytes()
        secrets.setdefault(str(len(data)), []).append(hashlib.sha256(data).hexdigest())
    tries = [f"{prefix}/{f.relative_to(root)}" for f in creds for prefix in ("", "/driver-root")]
    tries += ["/driver-root/var/lib/kubelet/kubeconfig", "/driver-root/etc/shadow"]
    out = cluster.kubectl(
        load_spec(), "-n", deployed.namespace, "exec", pod.metadata.name, "--", "python3", "-c",
        LOCKED_DOWN_PROBE, json.dumps(secrets), json.dumps(sorted(AGENT_MOUNTS)), *tries,
    )  # fmt: skip
    seen = json.loads(out)
    assert seen["found"] == [], f"kubelet credentials readable in the agent's pod: {seen['found']}"
    assert set(seen["reads"].values()) == {"FileNotFoundError"}, seen["reads"]
    # uid 0 without a single capability, bounding set included.
    assert (seen["uid"], int(seen["cap_eff"], 16), int(seen["cap_bnd"], 16)) == (0, 0, 0), seen
    # Exactly the expected host mounts (plus what the runtime mounts under /driver-root/dev
    # with the node's /dev: its pts, shm, mqueue, and the node's sysfs submounts under
    # /host/sys); /driver-root holds only dev and the library.
    mounts = {m for m in seen["mounts"] if m not in RUNTIME_MOUNTS and not m.startswith(
        ("/proc", "/sys", "/driver-root/dev/", "/host/sys/"))}  # fmt: skip
    assert mounts == set(seen["expected"]), sorted(mounts ^ set(seen["expected"]))
    assert seen["driver_root"] == ["dev", "usr"]


def _agent_pod(core: client.CoreV1Api, d: AgentDeployment, node: str) -> str:
    for p in core.list_namespaced_pod(d.namespace).items:
        if p.spec.node_name == node:
            return str(p.metadata.name)
    raise AssertionError(f"no agent pod on {node}")


def _patch_from_agent(
    core: client.CoreV1Api, d: AgentDeployment, on: str, target: str, patch: dict[str, Any]
) -> str:
    """Patch node `target` with the agent's own credentials, from its pod on node `on`."""
    code = textwrap.dedent(f"""
        from kubernetes import client, config
        config.load_incluster_config()
        try:
            client.CoreV1Api().patch_node({target!r}, {patch!r})
            print("ALLOWED")
        except client.ApiException as e:
            print("DENIED", e.status, e.body)
    """)
    spec = load_spec()
    return cluster.kubectl(
        spec, "-n", d.namespace, "exec", _agent_pod(core, d, on), "--", "python3", "-c", code
    )


def _label(key: str, value: str | None = "x") -> dict[str, Any]:
    return {"metadata": {"labels": {key: value}}}


PROBE = "nvidia.com/probe"


def _undo_probes(core: client.CoreV1Api, node: str) -> None:
    """Take off whatever a probe patch that should have been refused left on the node."""
    n = core.read_node(node)
    ops: list[dict[str, Any]] = []
    if PROBE in (n.metadata.annotations or {}):
        ops.append({"op": "remove", "path": "/metadata/annotations/nvidia.com~1probe"})
    if PROBE in (n.metadata.finalizers or []):
        ops.append({"op": "replace", "path": "/metadata/finalizers",
                    "value": [f for f in n.metadata.finalizers if f != PROBE]})
    if any(t.key == PROBE for t in n.spec.taints or []):
        ops.append({"op": "replace", "path": "/spec/taints",
                    "value": [client.ApiClient().sanitize_for_serialization(t)
                              for t in n.spec.taints if t.key != PROBE]})
    if ops:
        core.patch_node(node, ops)
    labels = n.metadata.labels or {}
    for key in ("example.com/probe", PROBE):
        if key in labels:
            core.patch_node(node, _label(key, None))
    if labels.get("kubernetes.io/hostname") != node:
        core.patch_node(node, _label("kubernetes.io/hostname", node))


def test_the_agent_may_label_only_its_own_node(
    core: client.CoreV1Api, deployed: AgentDeployment
) -> None:
    """The admission policy lets through only changes to nvidia.com/ labels of the agent's own
    node: another node, other labels, annotations (nvidia.com/ ones too), finalizers, taints
    are refused by the API server, each with the policy's message."""
    def refused(patch: dict[str, Any], why: str, target: str = "gpu-a100") -> None:
        out = _patch_from_agent(core, deployed, "gpu-a100", target, patch)
        assert out.startswith("DENIED") and why in out, f"{patch}: {out}"

    hostname = "kubernetes.io/hostname"
    try:
        refused(_label(PROBE), "only the node its pod runs on", target="gpu-t4")
        refused(_label("example.com/probe"), "only nvidia.com/ labels")
        refused(_label(hostname, None), "only nvidia.com/ labels")  # removing one
        refused(_label(hostname, "elsewhere"), "only nvidia.com/ labels")  # changing one
        refused({"metadata": {"annotations": {PROBE: "x"}}}, "may not change a node's annotations")
        refused({"metadata": {"finalizers": [PROBE]}}, "may not change a node's finalizers")
        refused({"spec": {"taints": [{"key": PROBE, "effect": "NoSchedule"}]}},
                "may not change a node's spec")
        refused({"spec": {"unschedulable": True}}, "may not change a node's spec")
        own = _patch_from_agent(core, deployed, "gpu-a100", "gpu-a100", _label(PROBE))
        assert own.startswith("ALLOWED"), own
        gone = _patch_from_agent(core, deployed, "gpu-a100", "gpu-a100", _label(PROBE, None))
        assert gone.startswith("ALLOWED"), gone
    finally:
        _undo_probes(core, "gpu-a100")
        _undo_probes(core, "gpu-t4")
        if core.read_node("gpu-a100").spec.unschedulable:
            core.patch_node("gpu-a100", {"spec": {"unschedulable": None}})


def _ready(pod: client.V1Pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def _agent_pods(core: client.CoreV1Api, d: AgentDeployment) -> dict[str, client.V1Pod]:
    """The agent's pods by node, leaving out those being deleted."""
    return {p.spec.node_name: p for p in core.list_namespaced_pod(d.namespace).items
            if p.metadata.deletion_timestamp is None}  # fmt: skip


NODE_STATUS_PERIOD = 4.0  # the lab kubelets' nodeStatusUpdateFrequency (gpukit/lab/nodes.py)


def test_the_agent_pod_is_ready_only_once_registered(
    core: client.CoreV1Api, deployed: AgentDeployment
) -> None:
    """The DaemonSet's readinessProbe asks the agent's /readyz: an agent that cannot register
    with the kubelet runs but never turns Ready, so a rollout stops at it; once registered it
    is Ready and its node advertises the GPUs."""
    spec = load_spec()
    want = {"gpu-a100": 8, "gpu-t4": 8}
    before = _agent_pods(core, deployed)
    for node, count in want.items():
        pod = before[node]
        probe = pod.spec.containers[0].readiness_probe
        assert probe is not None and probe.http_get.path == "/readyz", probe
        assert _ready(pod), f"{node}: the agent serves its GPUs but its pod is not Ready"
        assert resources(core, node).get("nvidia.com/gpu") == count
        status, body = agent_http(node, "/readyz")
        assert status == 200 and "registered: nvidia.com/gpu" in body, body

    # An agent whose kubelet dir holds no kubelet.sock: it serves, but never registers.
    stray = replace(deployed, env={**deployed.env, "GPUKIT_KUBELET_DIR": "/tmp"})

    def stray_pod() -> client.V1Pod | None:
        for p in _agent_pods(core, deployed).values():
            env = {e.name: e.value for e in p.spec.containers[0].env or []}
            if env.get("GPUKIT_KUBELET_DIR") == "/tmp" and p.status.phase == "Running":
                return p
        return None

    try:
        agent.apply(spec, stray)
        pod = wait_for("an agent pod that cannot register to run", stray_pod, timeout=120)
        node = pod.spec.node_name
        other = next(n for n in want if n != node)

        def unregistered() -> str | None:
            status, body = agent_http(node, "/readyz")
            return body if status == 503 and "not registered with the kubelet" in body else None

        wait_for(f"{node}: /readyz to say the agent is not registered", unregistered, timeout=60)
        for _ in range(20):  # four probe periods: Running, and never Ready
            p = core.read_namespaced_pod(pod.metadata.name, deployed.namespace)
            assert p.status.phase == "Running" and not _ready(p), p.status
            time.sleep(1)
        wait_for(f"{node}: no allocatable GPUs without a registered agent",
                 lambda: resources(core, node).get("nvidia.com/gpu", 0) == 0, timeout=30)
        # The rollout waits for a Ready pod: the other node keeps its agent.
        assert _agent_pods(core, deployed)[other].metadata.uid == before[other].metadata.uid
    finally:
        agent.apply(spec, deployed)

    # Registered again: Ready, and the node advertises its GPUs. Readiness follows the
    # registration; the node's status follows it at the kubelet's next status update.
    ready_at: float | None = None
    advertised_at: float | None = None
    deadline = time.monotonic() + 120
    while (ready_at is None or advertised_at is None) and time.monotonic() < deadline:
        p = _agent_pods(core, deployed).get(node)
        fresh = p is not None and p.metadata.uid != pod.metadata.uid
        if ready_at is None and fresh and _ready(p):
            ready_at = time.monotonic()
            assert _registrations(node) >= 1, "Ready before its agent registered"
        if advertised_at is None and fresh and resources(core, node).get("nvidia.com/gpu") == want[node]:
            advertised_at = time.monotonic()
        time.sleep(0.25)
    assert ready_at is not None, agent.diagnose(spec, node)
    assert advertised_at is not None, agent.diagnose(spec, node)
    assert advertised_at - ready_at <= NODE_STATUS_PERIOD + 2, (
        f"{node}: GPUs advertised {advertised_at - ready_at:.1f}s after the agent was Ready")
    agent.wait_rolled_out(spec, deployed, timeout=120)


@pytest.fixture
def mig_gpu0(core: client.CoreV1Api, deployed: AgentDeployment) -> Iterator[None]:
    node_pynvml("gpu-a100", MIG_MODE, "create")
    nvml_cli("gpu-a100", "reset", "--gpu", "0")
    node_pynvml("gpu-a100", MIG_CREATE)
    yield
    set_config(core, "gpu-a100", None)
    nvml_cli("gpu-a100", "reset", "--gpu", "0")  # a GPU reset destroys its MIG instances
    node_pynvml("gpu-a100", MIG_MODE, "destroy")
    nvml_cli("gpu-a100", "reset", "--gpu", "0")
    wait_for(
        "gpu-a100 back to 8 whole GPUs",
        lambda: resources(core, "gpu-a100").get("nvidia.com/gpu") == 8,
    )


def test_mixed_strategy_serves_mig_devices_of_the_right_parent(
    core: client.CoreV1Api, deployed: AgentDeployment, mig_gpu0: None, pods: list[str]
) -> None:
    set_config(core, "gpu-a100", "mixed")
    wait_for(
        "mig-3g.20gb resources",
        lambda: (
            resources(core, "gpu-a100").get("nvidia.com/mig-3g.20gb") == 2
            and resources(core, "gpu-a100").get("nvidia.com/gpu") == 7
        ),
        timeout=60,
    )
    labels = core.read_node("gpu-a100").metadata.labels
    assert labels["nvidia.com/mig.strategy"] == "mixed"
    assert labels["nvidia.com/mig-3g.20gb.count"] == "2"
    name = start(core, pods, "gpu-a100", 1, "nvidia.com/mig-3g.20gb")
    assert running(core, name).status.phase == "Running"
    ids, devs = pod_report(core, name)
    assert len(ids) == 1 and ids[0].startswith("MIG-"), ids
    assert "nvidia0" in devs and not ({f"nvidia{i}" for i in range(1, 8)} & devs), devs
    status = json.loads(nvml_cli("gpu-a100", "status"))
    mig_uuids = json.dumps(status["gpus"][0]["mig"])
    assert ids[0] in mig_uuids, "the MIG UUID must belong to GPU 0"
    # Its MIG capability nodes too, those the driver lists for its GPU and compute instance
    # (the stand-in driver's /proc/driver/nvidia/capabilities, read by the agent), no others.
    caps = wait_for(f"{name} to list /dev/nvidia-caps",
                    lambda: re.search(r"CAPS=(.*)", core.read_namespaced_pod_log(name, NS)))
    cap_dir = (nodes.root(load_spec().node("gpu-a100"))
               / "var/lib/gpukit-lab/nvml/proc-driver/nvidia/capabilities/gpu0/mig")
    minors = {f"nvidia-cap{m}" for f in cap_dir.glob("gi*/**/access")
              for m in re.findall(r"DeviceFileMinor: (\d+)", f.read_text())}
    seen = set(caps.group(1).split())
    assert len(seen) == 2 and seen <= minors, (seen, sorted(minors))


STATE_LABEL = "nvidia.com/device-plugin.config.state"


def node_labels(core: client.CoreV1Api, node: str) -> dict[str, str]:
    return dict(core.read_node(node).metadata.labels or {})


def test_gfd_machine_mode_and_vgpu_labels_come_from_the_nodes_driver_surface(
    core: client.CoreV1Api, deployed: AgentDeployment
) -> None:
    """What GFD reads on a real node (PCI class, DMI product name, PCI config space), read
    from the lab's stand-in entries of each node (issue 14 point 11)."""
    for node, machine in (("gpu-a100", "DGXA100-920-23687-2530-000"),
                          ("gpu-t4", "PowerEdge-R740")):
        want = {"nvidia.com/gpu.mode": "compute", "nvidia.com/gpu.machine": machine,
                "nvidia.com/vgpu.present": "false"}
        wait_for(f"{node}: {want}", lambda n=node, w=want: w.items() <= node_labels(
            core, n).items(), timeout=30, explain=lambda n=node: str(node_labels(core, n)))


def test_a_hand_edited_label_comes_back_and_other_labels_stay(
    core: client.CoreV1Api, deployed: AgentDeployment
) -> None:
    node, key = "gpu-t4", "nvidia.com/gpu.product"
    want = wait_for(f"{node}: {key}", lambda: node_labels(core, node).get(key), timeout=30)
    core.patch_node(node, {"metadata": {"labels": {key: "hand-edited", "gpukit-test/keep": "x"}}})
    try:
        # The agent's watch of its node sees the edit: seconds, not the 60 s re-assert.
        start_t = time.monotonic()
        wait_for(f"{node}: {key} restored to {want}",
                 lambda: node_labels(core, node).get(key) == want, timeout=30, every=0.2)
        assert time.monotonic() - start_t < 15
        assert node_labels(core, node)["gpukit-test/keep"] == "x"  # not the agent's label
    finally:
        core.patch_node(node, {"metadata": {"labels": {"gpukit-test/keep": None}}})


# A ConfigMap binaryData entry (gzip magic and NULs), mounted as its raw bytes (issue 30).
BINARY_ENTRY = base64.b64encode(b"\x1f\x8b\x08\x00" + bytes(64)).decode()


def _refused_events(core: client.CoreV1Api, node: str) -> list[str]:
    events = core.list_namespaced_event(
        "default", field_selector=f"involvedObject.name={node},reason=DevicePluginConfigRefused")
    return [e.message or "" for e in events.items]


@pytest.mark.parametrize(("bad", "reason"), [
    ("no-such-config", "'no-such-config' names no config"),
    ("empty", "the config is empty"),
    ("binary", "the file is binary, not text"),
])
def test_an_agent_restarted_into_bad_input_keeps_the_nodes_gpus(
    core: client.CoreV1Api, deployed: AgentDeployment, bad: str, reason: str
) -> None:
    """Issue 14 points 1 and 2: the node label names a config that does not exist, or an empty
    entry; the running agent keeps its config (time-slicing stays at 8) and says so; a
    restarted one serves the last good config instead of crash-looping with the node at 0.
    Issue 30: a binaryData entry (not UTF-8) once crash-looped the restarted agent."""
    spec, node = load_spec(), "gpu-t4"
    configs = f"{AGENT_APP}-configs"
    wait_for(f"{node}: 8 GPUs under ts", lambda: resources(core, node).get("nvidia.com/gpu") == 8)
    if bad == "binary":
        core.patch_namespaced_config_map(configs, deployed.namespace,
                                          {"binaryData": {bad: BINARY_ENTRY}})
    set_config(core, node, bad)
    try:
        wait_for(f"{node}: {STATE_LABEL}=failed",
                 lambda: node_labels(core, node).get(STATE_LABEL) == "failed", timeout=60)
        assert resources(core, node).get("nvidia.com/gpu") == 8
        if bad != "binary":  # the running agent may see the entry only at the next volume sync
            assert any(reason in m for m in _refused_events(core, node)), \
                _refused_events(core, node)
        old = _agent_pod(core, deployed, node)
        core.delete_namespaced_pod(old, deployed.namespace, grace_period_seconds=0)

        def new_pod_ready() -> Any:
            for p in core.list_namespaced_pod(deployed.namespace).items:
                if p.spec.node_name == node and p.metadata.name != old and any(
                        c.type == "Ready" and c.status == "True"
                        for c in (p.status.conditions or [])):
                    return p
            return None

        pod = wait_for("a new agent pod Ready (registered)", new_pod_ready, timeout=120,
                       explain=lambda: agent.diagnose(spec, node))
        wait_for(f"{node}: 8 GPUs again", lambda: resources(core, node).get("nvidia.com/gpu") == 8,
                 timeout=60)
        time.sleep(5)  # a crash-looping agent would have exited by now
        pod = core.read_namespaced_pod(pod.metadata.name, deployed.namespace)
        assert pod.status.container_statuses[0].restart_count == 0
        assert node_labels(core, node).get(STATE_LABEL) == "failed"
        assert resources(core, node).get("nvidia.com/gpu") == 8
        assert any(reason in m and "serving the last good config 'ts'" in m
                   for m in _refused_events(core, node)), _refused_events(core, node)
    finally:
        set_config(core, node, "ts")
        if bad == "binary":
            core.patch_namespaced_config_map(configs, deployed.namespace,
                                              {"binaryData": {bad: None}})
    wait_for(f"{node}: {STATE_LABEL}=success",
             lambda: node_labels(core, node).get(STATE_LABEL) == "success", timeout=60)


def _agent_log(core: client.CoreV1Api, d: AgentDeployment, node: str) -> str:
    return str(core.read_namespaced_pod_log(_agent_pod(core, d, node), d.namespace))


def _xid_total(node: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in _metrics(node).splitlines()
               if line.startswith("gpukit_plugin_xid_events_total{"))


def test_a_reload_that_disables_health_stops_the_monitor_and_one_that_enables_it_starts_it(
    core: client.CoreV1Api, deployed: AgentDeployment
) -> None:
    """Issue 14 point 3: a config reload applies the health settings too. Under `nohealth` a
    critical XID neither takes the GPU out nor is even counted (no monitor runs); back on the
    default config the same XID takes the GPU out again."""
    node = "gpu-a100"
    set_config(core, node, "nohealth")
    try:
        wait_for(f"{node}: the health monitor stopped under nohealth",
                 lambda: node_labels(core, node).get(STATE_LABEL) == "success"
                 and "health monitor stopped" in _agent_log(core, deployed, node),
                 timeout=60, explain=lambda: agent.diagnose(load_spec(), node))
        before = _xid_total(node)
        nvml_cli(node, "inject-xid", "--gpu", "2", "--xid", "79")
        for _ in range(16):  # the probe interval is 1 s: four times what the monitor needs
            assert resources(core, node)["nvidia.com/gpu"] == 8, "a stopped monitor took a GPU out"
            time.sleep(0.5)
        assert _xid_total(node) == before, "XIDs are watched although health checks are off"
    finally:
        set_config(core, node, None)
    wait_for(f"{node}: the health monitor started again on the default config",
             lambda: "health monitor started" in _agent_log(core, deployed, node).rsplit(
                 "health monitor stopped", 1)[-1], timeout=60,
             explain=lambda: agent.diagnose(load_spec(), node))

    # A new monitor watches events from the moment its thread registers its event set (as
    # NVML's sets do): an XID raised before that is not its to see, so raise one until seen.
    def taken_out() -> bool:
        if resources(core, node)["nvidia.com/gpu"] == 7:
            return True
        nvml_cli(node, "inject-xid", "--gpu", "2", "--xid", "79")
        return False

    wait_for("GPU 2 unhealthy under a restarted monitor", taken_out, timeout=30, every=2)
    wait_for("GPU 2 healthy again", lambda: resources(core, node)["nvidia.com/gpu"] == 8,
             timeout=60)


STORM = """
import json, sys, time
from gpukit.lab.nvml.control import MockControl
profile, state, rate, seconds, gpus = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
ctl = MockControl(profile=profile, state_dir=state)
sent, t0 = 0, time.monotonic()
while (now := time.monotonic() - t0) < seconds:
    due = int(now * rate)
    while sent < due:
        ctl.inject_xid(sent % gpus, 13 if sent % 2 else 31)
        sent += 1
    time.sleep(0.002)
print(json.dumps({"sent": sent, "seconds": time.monotonic() - t0}))
"""


def test_an_xid_storm_is_counted_in_full_and_logged_in_little(
    core: client.CoreV1Api, deployed: AgentDeployment
) -> None:
    """Issue 14 point 5: 1000 XID/s for 60 s over the node's 8 GPUs (application XIDs 13 and
    31, which take no GPU out): the agent counts every event in its metric and logs under
    100 KB for the whole storm (one line per device and XID, then periodic summaries)."""
    spec, node = load_spec(), "gpu-a100"
    pod = _agent_pod(core, deployed, node)
    log_before = len(core.read_namespaced_pod_log(pod, deployed.namespace).encode())
    counted_before = _xid_total(node)
    r = nodes.root(spec.node(node))
    proc = subprocess.run(
        [sys.executable, "-c", STORM, str(r / "etc/gpukit-lab/nvml/profile.yaml"),
         str(r / "var/lib/gpukit-lab/nvml"), "1000", "60", "8"],
        capture_output=True, text=True, timeout=180, check=True)
    storm = json.loads(proc.stdout)
    assert storm["sent"] >= 59_000, storm
    wait_for(f"all {storm['sent']} XIDs counted",
             lambda: _xid_total(node) - counted_before == storm["sent"], timeout=60,
             explain=lambda: f"counted {_xid_total(node) - counted_before:.0f}")
    assert _agent_pod(core, deployed, node) == pod  # the same agent, never restarted
    logged = len(core.read_namespaced_pod_log(pod, deployed.namespace).encode()) - log_before
    print(f"XID storm: {storm['sent']} events in {storm['seconds']:.1f}s, agent log +{logged} B")
    assert logged < 100_000, f"the storm grew the agent's log by {logged} bytes"
    assert resources(core, node)["nvidia.com/gpu"] == 8


def test_a_mig_apply_killed_mid_change_leaves_a_node_that_serves_at_once(
    core: client.CoreV1Api, deployed: AgentDeployment
) -> None:
    """Issue 14 point 6: the MIG manager pauses the agent (its GPUs out) while it changes a
    GPU; killed with SIGKILL in the middle (here while it waits for the GPU reset), its pause
    is void at the agent's next tick: the node serves all its GPUs again within seconds, not
    after the pause expires. The manager runs outside the node's PID namespace, as a process
    whose PID the agent cannot see: the pause file's lock says it is gone."""
    import os
    import signal

    from gpukit.lab import nvml

    spec, node = load_spec(), "gpu-a100"
    init = cluster.init_proc(spec.node(node))
    assert init is not None
    pause = f"/proc/{init.pid}/root/run/gpukit/plugin.pause"
    r = nodes.root(spec.node(node))
    env = nvml.env(r / "etc/gpukit-lab/nvml/profile.yaml", r / "var/lib/gpukit-lab/nvml")
    layout = {"killed": [{"devices": [0], "mig-enabled": True, "mig-devices": {"3g.20gb": 2}},
                         {"devices": [1, 2, 3, 4, 5, 6, 7], "mig-enabled": False}]}
    apply = subprocess.Popen(
        [sys.executable, "-m", "gpukit.plugin.mig", "apply", "--configs-json", json.dumps(layout),
         "--selected", "killed", "--pause-file", pause, "--reset-command", "sleep 600",
         "--log-level", "INFO"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    try:
        wait_for("the apply to pause GPU 0 (7 GPUs allocatable)",
                 lambda: resources(core, node)["nvidia.com/gpu"] < 8 or apply.poll() is not None,
                 timeout=60)
        assert apply.poll() is None, apply.communicate()[0]
        assert os.path.exists(pause)
        os.killpg(apply.pid, signal.SIGKILL)  # the apply and its reset command
        apply.wait(timeout=10)
        killed_at = time.monotonic()
        wait_for(f"{node}: 8 GPUs again after the kill",
                 lambda: resources(core, node)["nvidia.com/gpu"] == 8, timeout=60,
                 explain=lambda: agent.diagnose(spec, node))
        took = time.monotonic() - killed_at
        print(f"served again {took:.1f}s after the kill")
        assert took < 30, f"{took:.0f}s after the kill (the pause's own expiry is 15 min)"
    finally:
        if apply.poll() is None:
            os.killpg(apply.pid, signal.SIGKILL)
            apply.wait(timeout=10)
        # GPU 0's MIG mode change is pending until a reset: undo it.
        node_pynvml(node, MIG_MODE, "destroy")
        nvml_cli(node, "reset", "--gpu", "0")
