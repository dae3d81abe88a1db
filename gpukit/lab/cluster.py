"""`gpukit lab up | status | down`: the whole lab's life cycle."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpukit.lab import cgroups, controlplane, images, network, nodes, pki, registry
from gpukit.lab.config import LabSpec, NodeSpec, cache_dir, state_dir
from gpukit.lab.controlplane import COMPONENTS, LabError, paths
from gpukit.lab.packages import containerd
from gpukit.lab.procs import Proc, ProcTable

REPO = Path(__file__).resolve().parents[2]
# What the kubelet requires of host-wide kernel tunables (protectKernelDefaults).
KUBELET_SYSCTLS = {
    "vm/overcommit_memory": "1",
    "vm/panic_on_oom": "0",
    "kernel/panic": "10",
    "kernel/panic_on_oops": "1",
    "kernel/keys/root_maxkeys": "1000000",
    "kernel/keys/root_maxbytes": "25000000",
}
# Floors the lab raises a host tunable to (never lowers it). Each node's systemd, journald,
# containerd and kubelet hold about 8 inotify instances together; at the kernel's default of
# 128 per user the 16th node's systemd exits 255 at boot with no message (seen with 8 labs
# side by side). kind asks the same of its users' hosts.
SYSCTL_FLOORS = {"fs/inotify/max_user_instances": 1024}

Progress = Callable[[str], None]


def _say(msg: str) -> None:
    print(f"[gpukit lab {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def table() -> ProcTable:
    return ProcTable(state_dir() / "pids")


def kubernetes_bindir(lab: LabSpec) -> Path:
    return cache_dir() / "kubernetes" / lab.k8s_version / "bin"


def kubectl(lab: LabSpec, *args: str, stdin: str | None = None) -> str:
    """The lab's kubectl as its admin, for tests and for a person at the lab (exec, dry runs,
    what a user would type); lab code itself reaches the API through gpukit.k8s."""
    r = subprocess.run(
        [str(kubernetes_bindir(lab) / "kubectl"), f"--kubeconfig={paths().admin_kubeconfig}",
         *args],
        input=stdin, capture_output=True, text=True,
    )  # fmt: skip
    if r.returncode != 0:
        raise LabError(f"kubectl {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout


def rootfs() -> Path:
    return cache_dir() / "rootfs" / "bookworm"


def check_prerequisites(lab: LabSpec) -> None:
    if os.geteuid() != 0:
        raise LabError("the lab needs root (namespaces, cgroups, mounts): run it as root")
    bindir = kubernetes_bindir(lab)
    for b in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet"):
        if not (bindir / b).exists():
            raise LabError(
                f"{bindir / b} is missing: run `make k8s` (builds Kubernetes {lab.k8s_version})"
            )
    if not (rootfs() / ".complete").exists():
        raise LabError(f"node root {rootfs()} is missing: "
                       "run `bash gpukit/lab/scripts/build-rootfs.sh`")
    controlplane.etcd_binary()


# --- sysctls -------------------------------------------------------------------


# One record for the whole machine: kernel tunables are host-wide, and several lab
# instances may hold them. The originals come back when the last instance goes down.
SYSCTL_RECORD = Path("/var/lib/gpukit-lab-sysctls.json")


def _locked_record() -> Any:
    SYSCTL_RECORD.parent.mkdir(parents=True, exist_ok=True)
    f = open(SYSCTL_RECORD.with_suffix(".lock"), "w")  # noqa: SIM115 (held by the caller)
    fcntl.flock(f, fcntl.LOCK_EX)
    return f


def _read_record() -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(SYSCTL_RECORD.read_text())
        return data
    except (OSError, ValueError):
        return {}


def _sysctl(key: str) -> str:
    return Path("/proc/sys", key).read_text().strip()


def apply_sysctls(lab: LabSpec) -> None:
    with _locked_record():
        rec = _read_record() or {"saved": {}, "holders": []}
        # The host's own values, saved once by the first lab (also for a key a newer lab
        # added while an older lab held the record).
        for k in (*KUBELET_SYSCTLS, *SYSCTL_FLOORS):
            rec["saved"].setdefault(k, _sysctl(k))
        if lab.instance not in rec["holders"]:
            rec["holders"].append(lab.instance)
        tmp = SYSCTL_RECORD.with_suffix(".tmp")
        tmp.write_text(json.dumps(rec))
        tmp.replace(SYSCTL_RECORD)
        for k, v in KUBELET_SYSCTLS.items():
            Path("/proc/sys", k).write_text(v)
        for k, floor in SYSCTL_FLOORS.items():
            if int(_sysctl(k)) < floor:
                Path("/proc/sys", k).write_text(str(floor))


def restore_sysctls(lab: LabSpec) -> None:
    with _locked_record():
        rec = _read_record()
        if not rec:
            return
        holders = [h for h in rec["holders"] if h != lab.instance]
        if holders:
            rec["holders"] = holders
            SYSCTL_RECORD.write_text(json.dumps(rec))
            return
        for k, v in rec["saved"].items():
            Path("/proc/sys", k).write_text(v)
        SYSCTL_RECORD.unlink()


# --- node helpers ----------------------------------------------------------------


def init_proc(node: NodeSpec) -> Proc | None:
    rec = nodes.node_dir(node) / "init.json"
    try:
        data = json.loads(rec.read_text())
    except (OSError, ValueError):
        return None
    p = Proc(name=f"init-{node.name}", pid=int(data["pid"]), start=int(data["start"]))
    return p if p.alive() else None


def node_exec(
    node: NodeSpec, argv: list[str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run a command inside a running node (all its namespaces)."""
    init = init_proc(node)
    if init is None:
        raise LabError(f"lab node {node.name} is not running")
    return subprocess.run(
        ["nsenter", "-t", str(init.pid), "-a", "--", *argv],
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def _write_shared(lab: LabSpec) -> Path:
    shared = state_dir() / "shared"
    (shared / "bin").mkdir(parents=True, exist_ok=True)
    src = kubernetes_bindir(lab) / "kubelet"
    dst = shared / "bin" / "kubelet"
    built = f"{lab.k8s_version} {src.stat().st_mtime_ns}\n"  # another version, or rebuilt
    record = shared / "bin" / "kubelet.built"
    if not dst.exists() or not record.exists() or record.read_text() != built:
        shutil.copy2(src, dst.with_suffix(".new"))
        dst.with_suffix(".new").replace(dst)
        record.write_text(built)
    lines = []
    for key in cgroups.hierarchies():
        if key == "":
            lines.append("cgroup2 relatime unified")
        elif key.startswith("name="):
            lines.append(f"cgroup none,{key} {key.removeprefix('name=')}")
        else:
            lines.append(f"cgroup {key} {key}")
    (shared / "cgroup-mounts").write_text("\n".join(lines) + "\n")
    images.build_all(shared / "images")
    images.build_agent(shared / "images", REPO, cache_dir())  # a no-op if its key is the same
    return shared


def _stop_node(node: NodeSpec, t: ProcTable) -> None:
    t.stop(f"node-{node.name}", timeout=30)
    init = init_proc(node)
    if init is not None:  # an orphaned node (its supervisor was killed)
        os.kill(init.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while init.alive() and time.monotonic() < deadline:
            time.sleep(0.1)
    (nodes.node_dir(node) / "init.json").unlink(missing_ok=True)
    # Nothing of a node may outlive it: its PID namespace died with its init, but be sure.
    for pid in cgroups.procs(node.name):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while cgroups.remove(node.name) and time.monotonic() < deadline:
        time.sleep(0.2)


def _node_booted(node: NodeSpec) -> bool:
    try:
        r = node_exec(node, ["systemctl", "is-active", "containerd.service"], timeout=10)
    except (LabError, subprocess.TimeoutExpired):
        return False
    return r.stdout.strip() == "active"


def _images_dir() -> Path:
    return state_dir() / "shared" / "images"


def _ctr_images(node: NodeSpec) -> dict[str, str]:
    """The node containerd's images (k8s.io namespace): ref -> manifest digest."""
    r = node_exec(node, ["ctr", "-n", "k8s.io", "images", "ls"])
    if r.returncode != 0:
        raise LabError(f"{node.name}: ctr images ls failed: {r.stderr.strip()}")
    refs = {}
    for line in r.stdout.splitlines()[1:]:  # REF TYPE DIGEST SIZE PLATFORMS LABELS
        cols = line.split()
        if len(cols) >= 3:
            refs[cols[0]] = cols[2]
    return refs


def _image_id(node: NodeSpec, manifest: str) -> str | None:
    """The image ID (config digest) of a manifest in the node's containerd. Remembered per
    node: a manifest's digest fixes its config's, so a warm check is one `ctr images ls`."""
    memo = nodes.node_dir(node) / "agent-image.json"
    try:
        seen = json.loads(memo.read_text())
        if seen["manifest"] == manifest:
            return str(seen["id"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    r = node_exec(node, ["ctr", "-n", "k8s.io", "content", "get", manifest])
    if r.returncode != 0:
        return None
    image_id = str(json.loads(r.stdout)["config"]["digest"])
    memo.write_text(json.dumps({"manifest": manifest, "id": image_id}) + "\n")
    return image_id


def _ctr_import(node: NodeSpec, ref: str, tar: str) -> None:
    r = node_exec(
        node, ["ctr", "-n", "k8s.io", "images", "import", f"/opt/gpukit-lab/images/{tar}"]
    )
    if r.returncode != 0:
        raise LabError(f"{node.name}: importing {ref} failed: {r.stderr.strip()}")


def _import_images(node: NodeSpec, agent_id: str) -> bool:
    """Import what the node lacks; the node-agent image again unless the node's tag already
    names the image built from this checkout (`agent_id`). True if it was imported."""
    have = _ctr_images(node)
    for ref, tar in ((images.PAUSE, "pause.tar"), (images.SHELL, "shell.tar")):
        if ref not in have:
            _ctr_import(node, ref, tar)
    manifest = have.get(images.AGENT)
    if manifest is not None and _image_id(node, manifest) == agent_id:
        return False
    _ctr_import(node, images.AGENT, "node-agent.tar")
    manifest = _ctr_images(node).get(images.AGENT)
    got = None if manifest is None else _image_id(node, manifest)
    if got != agent_id:
        raise LabError(f"{node.name}: imported {images.AGENT}, but its ID is {got}, not {agent_id}")
    (nodes.root(node) / "var/lib/gpukit-lab/agent-image.digest").unlink(missing_ok=True)  # old
    return True


def _agent_id() -> str:
    image_id = images.agent_record(_images_dir()).get("id")
    if not image_id:
        raise LabError(f"no image ID recorded for {images.AGENT} in {_images_dir()}")
    return image_id


def _restart_stale_agents(lab: LabSpec, on: set[str], agent_id: str, say: Progress) -> None:
    """Delete the controller-owned pods on nodes `on` that run the node-agent tag with an
    older image than the node now has: re-importing a tag restarts nothing, and with
    `imagePullPolicy: Never` such pods would keep running old code. Their controller (the
    agent's DaemonSet) starts them again on the new image. A lab-only convenience."""
    if not on:
        return
    kc = f"--kubeconfig={paths().admin_kubeconfig}"
    kubectl = str(kubernetes_bindir(lab) / "kubectl")
    r = subprocess.run(
        [kubectl, kc, "get", "pods", "-A", "-o", "json", "--request-timeout=10s"],
        capture_output=True, text=True,
    )  # fmt: skip
    if r.returncode != 0:
        say(f"warning: cannot list pods to restart stale node agents: {r.stderr.strip()}")
        return
    owners: set[tuple[str, str]] = set()
    for pod in json.loads(r.stdout)["items"]:
        meta, spec = pod["metadata"], pod["spec"]
        stale = [
            c for c in pod.get("status", {}).get("containerStatuses") or []
            if c.get("image") == images.AGENT and c.get("imageID") not in ("", None, agent_id)
        ]  # fmt: skip
        if spec.get("nodeName") not in on or not stale:
            continue
        owner = next((o for o in meta.get("ownerReferences", []) if o.get("controller")), None)
        where = f"{meta['namespace']}/{meta['name']} on {spec['nodeName']}"
        if owner is None:
            say(f"warning: pod {where} runs an old {images.AGENT} and has no controller: left")
            continue
        say(f"restarting pod {where}: it runs an old {images.AGENT}")
        d = subprocess.run(
            [kubectl, kc, "-n", meta["namespace"], "delete", "pod", meta["name"],
             "--ignore-not-found", "--wait=true", "--timeout=60s"],
            capture_output=True, text=True,
        )  # fmt: skip
        if d.returncode != 0:
            say(f"warning: deleting pod {where} failed: {d.stderr.strip()}")
        elif owner.get("kind") == "DaemonSet":
            owners.add((meta["namespace"], owner["name"]))
    for ns, name in sorted(owners):
        w = subprocess.run(
            [kubectl, kc, "-n", ns, "rollout", "status", f"daemonset/{name}", "--timeout=60s"],
            capture_output=True, text=True,
        )  # fmt: skip
        if w.returncode != 0:
            say(f"warning: daemonset {ns}/{name} not rolled out: {w.stderr.strip()}")


def ensure_images(lab: LabSpec, say: Progress = _say) -> None:
    """Every running node has the lab's images, and the node-agent image built from this
    checkout (rebuilt when its content key changed, imported again where the node's image
    ID differs); agent pods running an older image are restarted."""
    before = images.agent_record(_images_dir()).get("key")
    images.build_all(_images_dir())
    images.build_agent(_images_dir(), REPO, cache_dir())
    if images.agent_record(_images_dir()).get("key") != before:
        say(f"built {images.AGENT} from this checkout")
    agent_id = _agent_id()
    with ThreadPoolExecutor(max_workers=len(lab.nodes) or 1) as pool:  # imports take seconds
        changed = list(pool.map(lambda n: _import_images(n, agent_id), lab.nodes))
    imported = {n.name for n, c in zip(lab.nodes, changed, strict=True) if c}
    for name in sorted(imported):
        say(f"node {name}: imported {images.AGENT} ({agent_id[:19]})")
    _restart_stale_agents(lab, imported, agent_id, say)


# --- status ----------------------------------------------------------------------


@dataclass
class Status:
    components: dict[str, bool] = field(default_factory=dict)
    nodes: dict[str, dict[str, bool]] = field(default_factory=dict)
    # What runs: the apiserver's version, and per node kubelet, containerd and runc.
    versions: dict[str, str] = field(default_factory=dict)
    node_versions: dict[str, dict[str, str]] = field(default_factory=dict)

    @property
    def up(self) -> bool:
        return all(self.components.values()) and all(all(v.values()) for v in self.nodes.values())

    @property
    def anything(self) -> bool:
        return any(self.components.values()) or any(
            v["supervisor"] or v["init"] for v in self.nodes.values()
        )


def _ready_nodes(lab: LabSpec) -> dict[str, bool]:
    kc = paths().admin_kubeconfig
    if not kc.exists():
        return {}
    r = subprocess.run(
        [str(kubernetes_bindir(lab) / "kubectl"), f"--kubeconfig={kc}", "get", "nodes",
         "-o", "json", "--request-timeout=5s"],
        capture_output=True, text=True,
    )  # fmt: skip
    if r.returncode != 0:
        return {}
    out: dict[str, bool] = {}
    for item in json.loads(r.stdout)["items"]:
        conds = {c["type"]: c["status"] for c in item["status"].get("conditions", [])}
        out[item["metadata"]["name"]] = conds.get("Ready") == "True"
    return out


def status(lab: LabSpec) -> Status:
    t = table()
    st = Status()
    for c in COMPONENTS:
        p = t.get(c)
        st.components[c] = p is not None and p.alive()
    st.components["apiserver-ready"] = st.components["kube-apiserver"] and controlplane.healthy(lab)
    if st.components["apiserver-ready"]:
        st.versions["kubernetes"] = controlplane.server_version(lab)
    ready = _ready_nodes(lab) if st.components["apiserver-ready"] else {}
    for n in lab.nodes:
        sup = t.get(f"node-{n.name}")
        init = init_proc(n)
        st.nodes[n.name] = {
            "supervisor": sup is not None and sup.alive(),
            "init": init is not None,
            "containerd": init is not None and _node_booted(n),
            "kubelet": init is not None and _unit_active(n, "kubelet.service"),
            "ready": ready.get(n.name, False),
        }
        if init is not None:
            st.node_versions[n.name] = node_versions(n)
    return st


# The first line each prints: "Kubernetes v1.37.2", "containerd github.com/containerd/
# containerd v2.2.9 <rev>", "runc version 1.1.5+ds1".
_VERSION_COMMANDS = {
    "kubelet": ["/opt/gpukit-lab/bin/kubelet", "--version"],
    "containerd": ["containerd", "--version"],
    "runc": ["runc", "--version"],
}


def node_versions(node: NodeSpec) -> dict[str, str]:
    """What a running node runs, asked of its own binaries: kubelet, containerd, runc."""
    out: dict[str, str] = {}
    for name, argv in _VERSION_COMMANDS.items():
        try:
            r = node_exec(node, argv, timeout=10)
        except (LabError, subprocess.TimeoutExpired):
            continue
        words = (r.stdout.splitlines() or [""])[0].split()
        found = [w for w in words if w[:1].isdigit() or (w[:1] == "v" and w[1:2].isdigit())]
        if r.returncode == 0 and found:
            out[name] = found[0]
    return out


def _unit_active(node: NodeSpec, unit: str) -> bool:
    try:
        return (
            node_exec(node, ["systemctl", "is-active", unit], timeout=10).stdout.strip() == "active"
        )
    except (LabError, subprocess.TimeoutExpired):
        return False


# --- up / down -------------------------------------------------------------------


def _check_runtime_unchanged(lab: LabSpec, node: NodeSpec) -> None:
    """A running node keeps its containerd: switching versions under it would pull the
    runtime from under its containers."""
    have = nodes.installed_containerd(nodes.root(node))
    want = containerd.deb_version(lab.containerd_version)
    if have is not None and have != want and init_proc(node) is not None:
        raise LabError(
            f"node {node.name} runs containerd {have}, the lab is set to {want}"
            f" (GPUKIT_CONTAINERD_VERSION={lab.containerd_version}): run `gpukit lab down` first"
        )


def start_control_plane(lab: LabSpec, say: Progress = _say, t0: float | None = None) -> pki.CA:
    """The lab's bridge, PKI, etcd and control plane, started where not running; its CA.
    Alone (no node booted), it is what the simulated fleet (gpukit.lab.fleet) registers its
    API-only nodes with."""
    t0 = time.monotonic() if t0 is None else t0
    t = table()
    apply_sysctls(lab)
    network.ensure_bridge(lab)
    ca = controlplane.make_pki(lab)
    bindir = kubernetes_bindir(lab)
    for c in COMPONENTS:
        p = t.get(c)
        if p is None or not p.alive():
            say(f"starting {c}")
            controlplane.start(lab, t, c, bindir)
        if c == "kube-apiserver":
            controlplane.wait_ready(lab)
            say(f"kube-apiserver ready ({time.monotonic() - t0:.1f}s)")
    return ca


def up(lab: LabSpec, say: Progress = _say, timeout: float = 180) -> Path:
    """Bring the lab to all nodes Ready; repair what is missing; no-op when up."""
    check_prerequisites(lab)
    t0 = time.monotonic()
    st = status(lab)
    if st.up:
        ensure_images(lab, say)  # the checkout may have changed since the lab came up
        say("lab is up (nothing to do)")
        return paths().admin_kubeconfig
    t = table()
    ca = start_control_plane(lab, say, t0)
    _write_shared(lab)
    for n in lab.nodes:
        network.ensure_node_netns(lab, n)
        _check_runtime_unchanged(lab, n)
        nodes.prepare(lab, n, rootfs(), ca)
        sup = t.get(f"node-{n.name}")
        if sup is None or not sup.alive():
            _stop_node(n, t)  # clear an orphan or leftovers before booting again
            cgroups.create(n.name)
            say(f"booting node {n.name} ({n.profile}, {n.address(lab)})")
            t.start(
                f"node-{n.name}",
                [sys.executable, "-m", "gpukit.lab.supervisor", n.name],
                paths().logs / f"node-{n.name}.log",
            )
    deadline = time.monotonic() + timeout
    pending = {n.name for n in lab.nodes}
    imported: set[str] = set()
    reimported: set[str] = set()  # nodes whose node-agent image changed
    agent_id = _agent_id()
    while pending and time.monotonic() < deadline:
        for n in lab.nodes:
            if n.name not in imported and _node_booted(n):
                if _import_images(n, agent_id):
                    reimported.add(n.name)
                imported.add(n.name)
        ready = _ready_nodes(lab)
        for name in list(pending):
            if ready.get(name) and name in imported:
                pending.discard(name)
                say(f"node {name} Ready ({time.monotonic() - t0:.1f}s)")
        if pending:
            time.sleep(0.5)
    if pending:
        raise LabError(
            f"nodes not Ready after {timeout:.0f}s: {', '.join(sorted(pending))};"
            f" see {paths().logs} and `gpukit lab status`"
        )
    _restart_stale_agents(lab, reimported, agent_id, say)
    say(f"lab up in {time.monotonic() - t0:.1f}s; kubeconfig: {paths().admin_kubeconfig}")
    return paths().admin_kubeconfig


def down(lab: LabSpec, say: Progress = _say, purge: bool = False) -> None:
    t = table()
    for n in lab.nodes:
        say(f"stopping node {n.name}")
        _stop_node(n, t)
        network.remove_node_netns(lab, n)
    for c in reversed(COMPONENTS):
        if t.get(c) is not None:
            say(f"stopping {c}")
        t.stop(c)
    if t.get(registry.PROC) is not None:
        say("stopping the registry")
    t.stop(registry.PROC)
    network.remove_bridge(lab)
    restore_sysctls(lab)
    if purge:
        for n in lab.nodes:
            shutil.rmtree(nodes.node_dir(n), ignore_errors=True)
        shutil.rmtree(state_dir(), ignore_errors=True)
    say("lab down")
