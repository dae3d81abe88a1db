"""The one helper module of the lab tests (tests/lab and tests/roles): bounded waits, test pods
that are gone before a test ends, node views, the lab's inventory copied for a module, the agent's
HTTP endpoint on a node, and NVML calls against a node's mock GPUs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kubernetes import client
from labplay import PlayResult, run_playbook

from gpukit.contracts import dra
from gpukit.contracts import label_names as ln
from gpukit.contracts import node_declaration as nd
from gpukit.k8s.objects import delete_if_there
from gpukit.lab import cluster, network, nodes
from gpukit.lab.config import LabSpec, NodeSpec, load_spec

AGENT_NAMESPACE = "gpukit-system"  # the lab's agents (gpukit.agent_manifests' default)
# The lab tests deploy agents on nodes that site.yml has not provisioned: no NVIDIA toolkit, no
# RuntimeClass, containerd's default runc. The suite run on them declares that route (as
# --host-vars), not the lab inventory's (nvidia runtime, RuntimeClass nvidia).
NO_TOOLKIT_VARS = {"container_toolkit_runtime_class": "",
                   "container_toolkit_set_as_default": False}


def wait_for(what: str, check: Callable[[], Any], timeout: float = 60, every: float = 0.5,
             explain: Callable[[], str] | None = None,
             retry_on: tuple[type[BaseException], ...] = ()) -> Any:
    """Poll `check` until it returns something truthy (bounded) and return that; an exception of
    `retry_on` counts as "not yet". On timeout, fail with the last answer and `explain()`."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except retry_on as e:  # not up yet
            last = e
        else:
            if last:
                return last
        time.sleep(every)
    more = f"\n{explain()}" if explain else ""
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r}){more}")


def boots(node: NodeSpec) -> int:
    """How often the lab node has booted (its init.json); -1 while that cannot be read (the
    node is going down or coming up)."""
    try:
        return int(json.loads((nodes.node_dir(node) / "init.json").read_text())["boot"])
    except (OSError, ValueError, KeyError):
        return -1


def delete_pods(core: client.CoreV1Api, namespace: str, names: list[str],
                timeout: float = 90) -> None:
    """Delete the named pods and wait until none of them exists any more. With a grace period
    of 1 s, not 0: a pod deleted with 0 leaves the API at once while the kubelet is still
    stopping its containers, so a teardown that waited only for the name let the next step
    (a GPU reset) meet the pod's process still holding the GPU."""
    for name in names:
        delete_if_there(core.delete_namespaced_pod, name, namespace, grace_period_seconds=1)
    left = set(names)
    wait_for(f"the test pods {sorted(left)} gone", lambda: not left & {
        p.metadata.name for p in core.list_namespaced_pod(namespace).items}, timeout=timeout)


def created_pods(core: client.CoreV1Api, namespace: str) -> Iterator[list[str]]:
    """Body of a `pods` fixture: the test appends the names it creates; all are gone after it."""
    created: list[str] = []
    yield created
    delete_pods(core, namespace, created)


def live_pods(core: client.CoreV1Api, namespace: str, selector: str) -> list[client.V1Pod]:
    """The pods matching `selector` that are not being deleted."""
    return [p for p in core.list_namespaced_pod(namespace, label_selector=selector).items
            if p.metadata.deletion_timestamp is None]


def phases_by_node(core: client.CoreV1Api, namespace: str, app: str) -> dict[str, str]:
    """{node: phase} of an app's pods (app.kubernetes.io/name) not being deleted."""
    return {p.spec.node_name: p.status.phase
            for p in live_pods(core, namespace, f"app.kubernetes.io/name={app}")}


def gpu_status(core: client.CoreV1Api, node: str) -> dict[str, str]:
    """The node's GPU resources: {"capacity/<resource>": n, "allocatable/<resource>": n}."""
    s = core.read_node(node).status
    return {f"{part}/{k}": v for part, values in (("capacity", s.capacity),
                                                  ("allocatable", s.allocatable))
            for k, v in (values or {}).items() if k.startswith(ln.RESOURCE_PREFIX)}


def release_nodes(core: client.CoreV1Api, names: list[str], *labels: str) -> None:
    """Nodes schedulable again and without `labels` (e.g. an earlier run's rollout state)."""
    for name in names:
        core.patch_node(name, {"spec": {"unschedulable": None},
                               "metadata": {"labels": dict.fromkeys(labels)}})


def delete_namespace(core: client.CoreV1Api, namespace: str, timeout: float = 120) -> None:
    """Delete `namespace` (if there) and wait until it and its pods are gone."""
    from gpukit.conformance.cluster import Kube

    assert Kube(core.api_client).delete_namespace(namespace, timeout=timeout), (
        f"namespace {namespace} stayed")


def node_sh(spec: LabSpec, node: str, command: str, timeout: float = 60) -> str:
    """`sh -c command` on a lab node; its stdout (the test fails on a non-zero exit)."""
    r = cluster.node_exec(spec.node(node), ["sh", "-c", command], timeout=timeout)
    assert r.returncode == 0, f"{node}: {command}: {r.stdout}{r.stderr}"
    return r.stdout


def runtime_pod(name: str, node: str, runtime_class: str, image: str, resource: str | None,
                env: dict[str, str] | None = None, command: list[str] | None = None,
                labels: dict[str, str] | None = None) -> client.V1Pod:
    """A pod of one container "c" under `runtime_class` on `node`, with one `resource` (none
    when None) and `env`: how a user's pod meets the NVIDIA runtime."""
    limits = {resource: "1"} if resource else None
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels=labels),
        spec=client.V1PodSpec(
            node_selector={"kubernetes.io/hostname": node}, restart_policy="Never",
            runtime_class_name=runtime_class, termination_grace_period_seconds=0,
            containers=[client.V1Container(
                name="c", image=image, image_pull_policy="Never", command=command,
                env=[client.V1EnvVar(name=k, value=v) for k, v in (env or {}).items()],
                resources=client.V1ResourceRequirements(limits=limits))]))  # fmt: skip


def work_pod(name: str, node: str, resource: str, mem_mb: int, util: int) -> client.V1Pod:
    """A pod of the lab's GPU workload (gpukit.lab.nvml.workload): container "trainer" holds
    `mem_mb` of its GPU's memory at `util` % utilisation, as the mock NVML reports it."""
    from gpukit.lab.nvml import workload

    volume = workload.pod_volume("/var/lib/gpukit-lab/nvml")
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(
            node_selector={"kubernetes.io/hostname": node}, restart_policy="Never",
            termination_grace_period_seconds=2,
            volumes=[client.V1Volume(name=volume["name"], host_path=client.V1HostPathVolumeSource(
                path=volume["hostPath"]["path"], type="DirectoryOrCreate"))],
            containers=[client.V1Container(
                name="trainer", image=workload.IMAGE, image_pull_policy="Never",
                args=workload.args(mem_mb, util),
                volume_mounts=[client.V1VolumeMount(name=volume["name"],
                                                    mount_path=workload.CLIENTS_IN_POD)],
                resources=client.V1ResourceRequirements(limits={resource: "1"}))]))


def dra_slices(custom: client.CustomObjectsApi, node: str) -> list[dict[str, Any]]:
    """The ResourceSlices of NVIDIA's GPU driver name on `node`."""
    got = custom.list_cluster_custom_object(
        "resource.k8s.io", "v1", "resourceslices",
        field_selector=f"spec.nodeName={node},spec.driver={dra.DRIVER}")
    return list(got["items"])


L = TypeVar("L", bound="SiteLab")


@dataclass
class SiteLab:
    """What a module's site.yml lab test starts from: the lab's own inventory (`original`, to
    leave the lab as declared), a copy the test may edit, and gpukit's wheelhouse built once
    (edits of the checkout meanwhile are no change on the nodes). A module's own `Lab` extends
    it (a dataclass subclass built with `as_`) with its API clients and views."""

    spec: LabSpec
    original: Path
    inventory: Path
    wheelhouse: str

    def as_(self, cls: type[L], **more: Any) -> L:
        """This SiteLab as the subclass `cls`, with its further fields `more`."""
        return cls(**{f.name: getattr(self, f.name) for f in fields(SiteLab)}, **more)

    def site(self, *args: str, inventory: Path | None = None, timeout: float = 1800,
             **kwargs: Any) -> PlayResult:
        """ansible-playbook site.yml on the copy (or `inventory`) with this wheelhouse."""
        extra = {"gpukit_node_wheelhouse_archive": self.wheelhouse, **kwargs.pop("extra_vars", {})}
        return run_playbook("site.yml", inventory or self.inventory, *args, timeout=timeout,
                            extra_vars=extra, **kwargs)


@dataclass
class DriverLab(SiteLab):
    """A SiteLab the driver upgrade tests drive: the inventory's driver branch set, upgrade.yml
    run, what a node runs read (test_upgrade_lab.py, test_driver_reload_lab.py)."""

    core: client.CoreV1Api

    def sh(self, node: str, command: str) -> str:
        return node_sh(self.spec, node, command)

    def set_branch(self, branch: str) -> None:
        import yaml

        path = self.inventory / "group_vars" / "gpu_nodes.yml"
        doc = yaml.safe_load(path.read_text())
        doc["nvidia_driver_branch"] = branch
        path.write_text(yaml.safe_dump(doc, sort_keys=False))

    def upgrade(self, *args: str) -> PlayResult:
        return run_playbook("playbooks/upgrade.yml", self.inventory, *args, var_files=(),
                            timeout=1500)  # fmt: skip

    def running_driver(self, node: str) -> str:
        out = self.sh(node, "nvidia-smi --query-gpu=driver_version --format=csv,noheader")
        return out.split()[0]


def site_lab(tmp_path_factory: pytest.TempPathFactory, name: str,
             keep_host_vars: bool = True) -> SiteLab:
    """Prepare a SiteLab: the lab's apt repository built, its inventory copied under a fresh
    temporary folder `name` (without the generated host_vars when not `keep_host_vars`), the
    wheelhouse built, the kubernetes client pointed at the lab."""
    from kubernetes import config

    from gpukit.lab.config import cache_dir
    from gpukit.lab.controlplane import paths
    from gpukit.lab.inventory import for_instance
    from gpukit.lab.packages import build_repo
    from gpukit.provision import wheelhouse

    spec = load_spec()
    build_repo()
    original = for_instance(spec)
    inventory = tmp_path_factory.mktemp(name) / "inventory"
    shutil.copytree(original, inventory)
    if not keep_host_vars:
        for generated in (inventory / "host_vars").glob("*.yml"):
            generated.unlink()
    wh = wheelhouse.build(cache_dir(), "3.11")
    config.load_kube_config(str(paths().admin_kubeconfig))
    return SiteLab(spec, original, inventory, str(wh.archive))


HTTP_GET = """
import sys, urllib.error, urllib.request
try:
    r = urllib.request.urlopen("http://127.0.0.1:9402" + sys.argv[1], timeout=5)
    print(r.status, r.read().decode())
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode())
except OSError as e:  # not listening (yet)
    print(0, e)
"""


def agent_http(node: str, path: str) -> tuple[int, str]:
    """GET the agent's HTTP endpoint on `node` (loopback in the node's network namespace,
    which the agent's hostNetwork pod shares): (status, body); status 0 when nothing answers."""
    spec = load_spec()
    r = subprocess.run(
        ["nsenter", f"--net={network.netns_path(spec.node(node), spec)}", sys.executable, "-c",
         HTTP_GET, path], capture_output=True, text=True, check=True,
    )  # fmt: skip
    status, _, body = r.stdout.partition(" ")
    return int(status), body


# MIG mode on GPU 0 (argv[1]: create or destroy; pending until the GPU is reset).
MIG_MODE = """
import sys, pynvml as n
n.nvmlInit()
n.nvmlDeviceSetMigMode(n.nvmlDeviceGetHandleByIndex(0), 1 if sys.argv[1] == "create" else 0)
"""

# Two 3g GPU instances, each with its compute instance, on GPU 0 (MIG mode on).
MIG_CREATE = """
import pynvml as n
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
info = n.nvmlDeviceGetGpuInstanceProfileInfo(h, n.NVML_GPU_INSTANCE_PROFILE_3_SLICE)
for _ in range(2):
    gi = n.nvmlDeviceCreateGpuInstance(h, info.id)
    ci = n.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, n.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE, 0)
    n.nvmlGpuInstanceCreateComputeInstance(gi, ci.id)
"""


def node_pynvml(node: str, code: str, *args: str) -> None:
    """Run `code` with pynvml against `node`'s mock GPUs (its profile and device state)."""
    from gpukit.lab import nvml

    root = nodes.root(load_spec().node(node))
    env = nvml.env(root / "etc/gpukit-lab/nvml/profile.yaml", root / "var/lib/gpukit-lab/nvml")
    subprocess.run([sys.executable, "-c", code, *args], env=env, check=True)


def installed(node: str, package: str) -> bool:
    """Whether `package` is installed on `node` (dpkg's status)."""
    return cluster.node_exec(load_spec().node(node), ["sh", "-c", (
        f"dpkg -s {package} 2>/dev/null | grep -q '^Status: install ok installed'")],
        timeout=120).returncode == 0


@contextmanager
def _lab_package(node: str, package: str, force: str = "") -> Iterator[None]:
    """The lab apt repository's `package` installed on `node` for the block (`force`: dpkg's
    --force option), purged afterwards; a node that had it keeps it as it was."""
    spec = load_spec().node(node)

    def sh(command: str) -> subprocess.CompletedProcess[str]:
        return cluster.node_exec(spec, ["sh", "-c", command], timeout=120)

    if installed(node, package):
        yield
        return
    flags = f" --force-{force}" if force else ""
    r = sh(f"dpkg -i{flags} /opt/gpukit-lab/apt/{package}_*.deb")
    assert r.returncode == 0, f"{node}: installing {package}: {r.stdout}{r.stderr}"
    try:
        yield
    finally:
        sh(f"dpkg --purge{flags} {package}")


@contextmanager
def driver_userspace(node: str) -> Iterator[None]:
    """The stand-in driver package's user space on `node` (nvidia-smi, the MPS tools,
    libcuda), as site.yml installs it, for the tests that need it on a bare lab node; then
    purged and the lab's mock NVML (which the package replaces) restored. A node that had a
    driver package of any branch (an earlier site.yml or upgrade) keeps it as it was: the
    branches conflict, so another could not be installed beside it."""
    from gpukit.lab.packages.catalog import BRANCHES

    if any(installed(node, f"nvidia-driver-{b.name}") for b in BRANCHES):
        yield
        return
    nvml = nodes.root(load_spec().node(node)) / "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
    saved = nvml.read_bytes()
    try:
        with _lab_package(node, f"nvidia-driver-{BRANCHES[0].name}", force="depends"):
            yield
    finally:
        # The package replaces the mock NVML; its purge takes the library with it.
        if not nvml.exists() or nvml.read_bytes() != saved:
            nvml.write_bytes(saved)


@contextmanager
def cdi_hook(node: str) -> Iterator[None]:
    """The stand-in toolkit's nvidia-cdi-hook on `node` (the package, as the container_toolkit
    role installs it), for the CDI specs that name its hooks; purged afterwards unless the
    node had it."""
    with _lab_package(node, "nvidia-container-toolkit"):
        yield


MPS_VIEW = r"""
import json, pynvml as n
n.nvmlInit()
out = {}
for i in range(n.nvmlDeviceGetCount()):
    h = n.nvmlDeviceGetHandleByIndex(i)
    out[n.nvmlDeviceGetUUID(h)] = {
        "mode": n.nvmlDeviceGetComputeMode(h),
        "procs": [p.pid for p in n.nvmlDeviceGetComputeRunningProcesses(h)],
        "clients": [p.pid for p in n.nvmlDeviceGetMPSComputeRunningProcesses(h)]}
print(json.dumps(out))
"""


def mps_view(node: str) -> dict[str, dict[str, Any]]:
    """NVML on `node` per GPU UUID: compute mode (3: EXCLUSIVE_PROCESS, 0: DEFAULT), the processes on the
    GPU (an MPS server) and its MPS clients' pids."""
    from gpukit.lab import nvml

    root = nodes.root(load_spec().node(node))
    env = nvml.env(root / "etc/gpukit-lab/nvml/profile.yaml", root / "var/lib/gpukit-lab/nvml")
    r = subprocess.run([sys.executable, "-c", MPS_VIEW], env=env, capture_output=True,
                       text=True, check=True, timeout=60)
    got: dict[str, dict[str, Any]] = json.loads(r.stdout)
    return got


@dataclass
class ApiLab(SiteLab):
    """A SiteLab with the API clients and the views the agents' tests read."""

    core: client.CoreV1Api
    custom: client.CustomObjectsApi

    def slices(self, node: str) -> list[dict[str, Any]]:
        return dra_slices(self.custom, node)

    def agents(self, app: str) -> dict[str, str]:
        """{node: phase} of gpukit's agent `app` (the device plugin agent, the DRA plugin)."""
        return phases_by_node(self.core, AGENT_NAMESPACE, app)

    def gpu_status(self, node: str) -> dict[str, str]:
        return gpu_status(self.core, node)


def declaration_condition(core: client.CoreV1Api, node: str) -> client.V1NodeCondition | None:
    """The node's served-vs-declared condition (GpuDeclarationMismatch), if any."""
    for c in core.read_node(node).status.conditions or []:
        if c.type == nd.CONDITION_TYPE:
            return c
    return None


def clear_declaration_condition(core: client.CoreV1Api, node: str) -> None:
    """The condition outlives the agent and the DRA plugin (as node-problem-detector's do): a
    test leaves none."""
    conditions = core.read_node(node).status.conditions or []
    for i, c in enumerate(conditions):
        if c.type == nd.CONDITION_TYPE:
            core.patch_node_status(node, [{"op": "remove", "path": f"/status/conditions/{i}"}])
            return


def declaration_events(core: client.CoreV1Api, node: str, reason: str) -> list[str]:
    """Messages of the node's served-vs-declared Events of `reason`."""
    found = core.list_namespaced_event(
        "default", field_selector=f"involvedObject.name={node},reason={reason}")
    return [e.message or "" for e in found.items]
