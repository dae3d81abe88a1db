"""Fill a node: one pod per advertised device, then one more, then free one.

What each container saw (its /dev/nvidia* nodes and NVIDIA_VISIBLE_DEVICES), what the kubelet's
PodResources API says it gave each container, whether the over-request stayed Pending with
"Insufficient", and whether the pod that was Pending got the freed device. The isolation, MIG and
time-slicing tests assert on this record; every resource of the node is filled at once.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpukit.k8s.names import dns_name

from .cluster import PodState, pod_manifest

if TYPE_CHECKING:
    from .suite import Suite

VOLUME_MOUNTS_ROOT = "/var/run/nvidia-container-devices"
OBSERVE = (
    'for f in /dev/nvidia*; do [ -e "$f" ] && echo "DEV ${f#/dev/}"; done; '
    'for f in /dev/nvidia-caps/*; do [ -e "$f" ] && echo "CAP ${f##*/}"; done; '
    'echo "ENV ${NVIDIA_VISIBLE_DEVICES-<unset>}"; '
    f'for f in {VOLUME_MOUNTS_ROOT}/*; do [ -e "$f" ] && echo "VOL ${{f##*/}}"; done; '
    # MPS: the pipe directory, whether its daemon's control endpoint is there, the limits.
    'if [ -n "${CUDA_MPS_PIPE_DIRECTORY-}" ]; then '
    'echo "MPSPIPE $CUDA_MPS_PIPE_DIRECTORY $([ -e "$CUDA_MPS_PIPE_DIRECTORY/control" ] '
    '&& echo control || echo none)"; '
    'echo "MPSMEM ${CUDA_MPS_PINNED_DEVICE_MEM_LIMIT-<unset>}"; '
    'echo "MPSPCT ${CUDA_MPS_ACTIVE_THREAD_PERCENTAGE-<unset>}"; fi; true'
)
# Holds its devices until deleted; exits at once on SIGTERM (a shell as PID 1 would not).
HOLD = 'trap "exit 0" TERM; sleep 1000000 & wait'


@dataclass
class Seen:
    """One container: what it requested, where it got to, what it saw, what the kubelet says."""

    pod: str
    resource: str
    requested: int
    state: PodState
    dev_entries: tuple[str, ...] = ()  # every /dev/nvidia* name
    cap_entries: tuple[str, ...] = ()  # every /dev/nvidia-caps/* name (MIG capabilities)
    env: str | None = None  # NVIDIA_VISIBLE_DEVICES (None: unset)
    volume_ids: tuple[str, ...] = ()
    kubelet_ids: tuple[str, ...] | None = None  # PodResources device IDs (None: not read)
    error: str = ""
    # MPS client settings it was given: pipe directory, "control" if its daemon's control
    # endpoint is there ("none" if not), pinned memory limit, thread percentage.
    mps: dict[str, str] = field(default_factory=dict)

    @property
    def gpu_nodes(self) -> set[str]:
        """/dev/nvidia<N> device nodes (the per-GPU ones)."""
        return {f"/dev/{e}" for e in self.dev_entries
                if e.startswith("nvidia") and e[6:].isdigit()}

    @property
    def visible(self) -> list[str]:
        """Device IDs the container was told about (env, or volume-mounts entries)."""
        if self.env == VOLUME_MOUNTS_ROOT:
            return list(self.volume_ids)
        if self.env in (None, "", "void", "none", "<unset>"):
            return []
        return [v for v in (self.env or "").split(",") if v]

    def parse(self, text: str) -> None:
        devs: list[str] = []
        vols: list[str] = []
        caps: list[str] = []
        for line in text.splitlines():
            kind, _, value = line.partition(" ")
            if kind == "DEV":
                devs.append(value)
            elif kind == "CAP":
                caps.append(value)
            elif kind == "ENV":
                self.env = None if value == "<unset>" else value
            elif kind == "VOL":
                vols.append(value)
            elif kind == "MPSPIPE":
                self.mps["pipe"], _, self.mps["endpoint"] = value.partition(" ")
            elif kind == "MPSMEM":
                self.mps["memory_limit"] = value
            elif kind == "MPSPCT":
                self.mps["thread_percentage"] = value
        self.dev_entries = tuple(sorted(devs))
        self.cap_entries = tuple(sorted(caps))
        self.volume_ids = tuple(sorted(vols))


@dataclass
class NodeFill:
    node: str
    counts: dict[str, int]  # resource -> devices advertised (allocatable) when filling
    fillers: dict[str, list[Seen]] = field(default_factory=dict)
    errors: dict[str, list[str]] = field(default_factory=dict)
    extra: dict[str, Seen] = field(default_factory=dict)  # the over-request, while Pending
    reused: dict[str, Seen] = field(default_factory=dict)  # the same pod once it ran
    freed: dict[str, Seen] = field(default_factory=dict)  # the filler deleted to make room
    nogpu: Seen | None = None
    podresources_error: str = ""
    pods: list[str] = field(default_factory=list)

    def error(self, resource: str, message: str) -> None:
        self.errors.setdefault(resource, []).append(message)

    def running(self, resource: str) -> list[Seen]:
        return [s for s in self.fillers.get(resource, []) if s.state.state == "Running"]


def _requests(total: int, max_pods: int, one_each: bool) -> list[int]:
    if total <= 0:
        return []
    if one_each or total <= max_pods:
        return [1] * total
    per = math.ceil(total / max_pods)
    out = [per] * (total // per)
    if total % per:
        out.append(total % per)
    return out


def run(suite: Suite, node: str) -> NodeFill:
    kube = suite.kube
    ns = suite.namespace
    opts = suite.options
    node_obj = kube.node(node)
    from gpukit.k8s.nodes import allocatable

    counts = {r: n for r, n in allocatable(node_obj).items() if n > 0}
    fill = NodeFill(node=node, counts=counts)
    decl = suite.decl(node)
    fail_gt_one = bool(decl and decl.plugin_config.sharing.fail_requests_greater_than_one)
    shared = set(suite.shared_resources(node))
    # 1. fillers for every resource, and a pod that requests no GPU
    created: dict[str, list[Seen]] = {}
    for resource, total in counts.items():
        one_each = (resource in shared and fail_gt_one) or decl is None
        for i, n in enumerate(_requests(total, opts.max_fill_pods, one_each)):
            name = suite.pod_name("fill", node, resource, str(i))
            kube.create_pod(ns, pod_manifest(
                name, run_id=kube.run_id, role="fill", node=node, image=opts.shell_image,
                command=["sh", "-c", HOLD], limits={resource: n},
                host_network=opts.host_network,
            ))
            fill.pods.append(name)
            created.setdefault(resource, []).append(Seen(name, resource, n, PodState(name,
                                                                                   "Missing")))
    nogpu_name = suite.pod_name("nogpu", node)
    kube.create_pod(ns, pod_manifest(
        nogpu_name, run_id=kube.run_id, role="nogpu", node=node, image=opts.shell_image,
        command=["sh", "-c", HOLD], host_network=opts.host_network,
        # What a CUDA image sets: a runtime honouring it would hand out every GPU.
        env={"NVIDIA_VISIBLE_DEVICES": "all"},
    ))
    fill.pods.append(nogpu_name)
    fill.nogpu = Seen(nogpu_name, "", 0, PodState(nogpu_name, "Missing"))
    states = kube.wait_pods(ns, fill.pods, opts.pod_timeout, node=node)
    for resource, seen in created.items():
        for s in seen:
            s.state = states[s.pod]
            if s.state.state != "Running":
                fill.error(resource, f"filler pod {s.pod} requesting {s.requested} is "
                                     f"{s.state} (expected Running)")
        fill.fillers[resource] = seen
    fill.nogpu.state = states[nogpu_name]
    # 2. what each container sees
    for s in _all(fill):
        if s.state.state == "Running":
            _observe(suite, s)
    # 3. what the kubelet says it gave them
    _attach_kubelet_ids(suite, fill, [s for seen in fill.fillers.values() for s in seen])
    # 4. one more pod per fully filled resource: must stay Pending
    extras: dict[str, Seen] = {}
    for resource in counts:
        if fill.errors.get(resource):
            continue
        name = suite.pod_name("extra", node, resource)
        kube.create_pod(ns, pod_manifest(
            name, run_id=kube.run_id, role="extra", node=node, image=opts.shell_image,
            command=["sh", "-c", HOLD], limits={resource: 1}, host_network=opts.host_network,
        ))
        fill.pods.append(name)
        extras[resource] = Seen(name, resource, 1, PodState(name, "Missing"))
    if not extras:
        return fill
    states = kube.wait_pods(ns, [s.pod for s in extras.values()], opts.pod_timeout, node=node)
    for resource, s in extras.items():
        s.state = states[s.pod]
        fill.extra[resource] = Seen(s.pod, resource, 1, s.state)
    # 5. free one device per resource: the Pending pod must get exactly that one
    to_free: dict[str, Seen] = {}
    for resource, s in extras.items():
        if s.state.state == "Unschedulable" and fill.running(resource):
            to_free[resource] = fill.running(resource)[0]
    if not to_free:
        return fill
    left = kube.delete_pods(ns, [s.pod for s in to_free.values()], opts.pod_timeout, node=node)
    for resource, s in to_free.items():
        fill.freed[resource] = s
        if s.pod in left:
            fill.error(resource, f"filler pod {s.pod} was not deleted within "
                                 f"{opts.pod_timeout:.0f}s")
    states = kube.wait_pods(ns, [extras[r].pod for r in to_free], opts.pod_timeout, node=node)
    for resource in to_free:
        s = extras[resource]
        s.state = states[s.pod]
        if s.state.state == "Running":
            _observe(suite, s)
        fill.reused[resource] = s
    _attach_kubelet_ids(suite, fill, list(fill.reused.values()))
    return fill


def _all(fill: NodeFill) -> Iterable[Seen]:
    for seen in fill.fillers.values():
        yield from seen
    if fill.nogpu is not None:
        yield fill.nogpu


def _observe(suite: Suite, s: Seen) -> None:
    res = suite.kube.exec(suite.namespace, s.pod, ["sh", "-c", OBSERVE], timeout=20)
    if res.rc != 0:
        s.error = f"exec in {s.pod} failed (rc {res.rc}): {res.stderr.strip()}"
        return
    s.parse(res.stdout)


def _attach_kubelet_ids(suite: Suite, fill: NodeFill, seen: list[Seen]) -> None:
    if not seen:
        return
    view, error = suite.podresources(fill.node)
    if view is None:
        fill.podresources_error = error
        return
    for s in seen:
        if s.state.state != "Running":
            continue
        ids = view.devices(suite.namespace, s.pod).get(s.resource)
        s.kubelet_ids = tuple(ids) if ids is not None else ()


def pod_name_parts(role: str, node: str, resource: str = "") -> list[str]:
    short = resource.partition("/")[2] if "/" in resource else resource
    return [role, dns_name(node, limit=20), short]
