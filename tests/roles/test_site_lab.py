"""site.yml on the lab: both nodes converge to the inventory, a second run changes nothing,
check mode reports drift without touching it, a branch switch upgrades the driver, and an edit
of the inventory's group_vars changes only the nodes it declares (the conformance suite then
passes against the edited inventory).

The tests share one lab and run in order (each builds on the previous one's state). The
inventory is the lab's (a copy for this lab instance) plus the lab's provisioning settings
(inventories/lab/group_vars/all.yml); gpukit's wheelhouse is built once and pinned for the whole module, so
edits to the checkout while the tests run do not count as changes on the nodes.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import tomlkit
import yaml
from counted_playbook import counts
from kubernetes import client, config
from labplay import BIN, LAB_VARS, REPO, PlayResult, branch_version, run_playbook
from labtools import wait_for

from gpukit.k8s import waits
from gpukit.lab import cluster, images, nodes
from gpukit.lab.config import LabSpec, NodeSpec, cache_dir, load_spec
from gpukit.lab.controlplane import paths
from gpukit.lab.packages import containerd
from gpukit.lab.packages.catalog import RUNTIME_LOG

pytestmark = pytest.mark.lab

CONTAINERD = "/etc/containerd/config.toml"
PIN = "/etc/apt/preferences.d/gpukit-nvidia-driver"
CDI = "/etc/cdi/nvidia.yaml"
TIMINGS: dict[str, float] = {}


# containerd's CRI runtime table by config version: 3 (containerd 2), 2 (containerd 1.7).
CRI_TABLE = {3: "io.containerd.cri.v1.runtime", 2: "io.containerd.grpc.v1.cri"}


@dataclass
class Lab:
    spec: LabSpec
    inventory: Path
    hostvars: dict[str, dict[str, Any]]
    wheelhouse: str
    core: client.CoreV1Api

    def node(self, name: str) -> NodeSpec:
        return self.spec.node(name)

    @property
    def config_version(self) -> int:
        return containerd.config_version(self.spec.containerd_version)

    def sh(self, name: str, command: str) -> str:
        r = cluster.node_exec(self.node(name), ["sh", "-c", command])
        assert r.returncode == 0, f"{name}: {command}: {r.stderr}"
        return r.stdout

    def play(self, *args: str, inventory: Path | None = None, **kw: Any) -> PlayResult:
        extra = {"gpukit_node_wheelhouse_archive": self.wheelhouse, **kw.pop("extra_vars", {})}
        return run_playbook("site.yml", inventory or self.inventory, *args, extra_vars=extra,
                            **kw)  # fmt: skip


def containerd_dump(lab: Lab, name: str) -> dict[str, Any]:
    """The node's containerd's effective config, as containerd itself prints it."""
    return tomllib.loads(lab.sh(name, "containerd config dump"))


def cri_runtime(dump: dict[str, Any]) -> dict[str, Any]:
    """The CRI runtime settings of a dump (containerd 2 prints version 3, 1.7 version 2)."""
    table: dict[str, Any] = dump["plugins"][CRI_TABLE[int(dump["version"])]]
    return table


def sandbox_image(dump: dict[str, Any]) -> str:
    if int(dump["version"]) == 3:
        return str(dump["plugins"]["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"])
    return str(cri_runtime(dump)["sandbox_image"])


def hostvars_of(inventory: Path) -> dict[str, dict[str, Any]]:
    out = subprocess.run(
        [str(BIN / "ansible-inventory"), "-i", str(inventory), "--list", "-e", f"@{LAB_VARS}"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return dict(json.loads(out)["_meta"]["hostvars"])


def expected_allocatable(hv: dict[str, Any]) -> dict[str, int]:
    """What the device plugin must advertise for the node's declarations."""
    cfg = hv["gpukit_device_plugin_configs"][hv["gpukit_device_plugin_config"]]
    strategy = (cfg.get("flags") or {}).get("migStrategy", "none")
    replicas = 1
    for r in ((cfg.get("sharing") or {}).get("timeSlicing") or {}).get("resources") or []:
        if r["name"] == "nvidia.com/gpu":
            replicas = int(r["replicas"])
    count = int(hv["gpukit_gpu"]["count"])
    mig: dict[int, dict[str, int]] = {}
    layout = hv.get("gpukit_mig_config")
    for entry in (hv.get("gpukit_mig_configs") or {}).get(layout) or [] if layout else []:
        devices = range(count) if entry["devices"] == "all" else entry["devices"]
        for i in devices:
            if entry.get("mig-enabled"):
                mig[i] = dict(entry.get("mig-devices") or {})
            else:
                mig.pop(i, None)
    out: dict[str, int] = {}
    whole = count - (len(mig) if strategy == "mixed" else 0)
    if whole:
        out["nvidia.com/gpu"] = whole * replicas
    if strategy == "mixed":
        for devices in mig.values():
            for profile, n in devices.items():
                key = f"nvidia.com/mig-{profile.replace('+', '.')}"
                out[key] = out.get(key, 0) + int(n)
    return out


def gpu_allocatable(core: client.CoreV1Api, name: str) -> dict[str, int]:
    alloc = core.read_node(name).status.allocatable or {}
    return {k: int(v) for k, v in alloc.items() if k.startswith("nvidia.com/") and int(v) > 0}


def installed(lab: Lab, name: str) -> dict[str, str]:
    text = lab.sh(name, "dpkg-query -W -f='${Package} ${Version} ${db:Status-Abbrev}\\n' "
                        "'nvidia-*' 2>/dev/null || true")  # fmt: skip
    return {p[0]: p[1] for p in (line.split() for line in text.splitlines())
            if len(p) >= 3 and p[2].startswith("ii")}  # fmt: skip


def boot_time(lab: Lab, name: str) -> str:
    return lab.sh(name, "ps -o lstart= -p 1").strip()


@pytest.fixture(scope="module")
def lab(lab_cluster: object) -> Lab:
    from gpukit.lab.inventory import for_instance
    from gpukit.lab.packages import build_repo
    from gpukit.provision import wheelhouse

    spec = load_spec()
    build_repo()
    inventory = for_instance(spec)
    wh = wheelhouse.build(cache_dir(), "3.11")
    config.load_kube_config(str(paths().admin_kubeconfig))
    return Lab(spec, inventory, hostvars_of(inventory), wh.archive, client.CoreV1Api())


def test_site_converges_both_nodes(lab: Lab, tmp_path: Path) -> None:
    calls = tmp_path / "calls.txt"  # the declaration model's entries, counted through the play
    r = lab.play(command=(sys.executable, str(REPO / "tests/roles/counted_playbook.py"),
                          str(calls)))  # fmt: skip
    TIMINGS["first"] = r.seconds
    assert r.rc == 0 and not r.failed, r.describe()
    assert_validated_once(lab, calls)
    for name, hv in lab.hostvars.items():
        branch = str(hv["nvidia_driver_branch"])
        version = branch_version(branch)
        pkgs = installed(lab, name)
        flavour = "open" if hv["nvidia_driver_kernel_modules"] == "open" else ""
        kernel = f"nvidia-kernel-{flavour + '-' if flavour else ''}{branch}"
        for pkg in ("nvidia-driver", f"nvidia-driver-{branch}", kernel, "nvidia-persistenced"):
            assert pkgs.get(pkg) == f"{version}-1", f"{name}: {pkg} {pkgs}"
        assert "nvidia-container-toolkit" in pkgs
        assert f"Pin: version {branch}.*" in lab.sh(name, f"cat {PIN}")
        assert lab.sh(name, "nvidia-smi --query-gpu=driver_version --format=csv,noheader"
                      ).split() == [version] * int(hv["gpukit_gpu"]["count"])  # fmt: skip
        assert lab.sh(name, "systemctl is-active nvidia-persistenced").strip() == "active"
        # containerd runs with the nvidia runtime (its own dump: files merged, defaults
        # filled in); the file keeps everything the lab wrote, comments too.
        text = lab.sh(name, f"cat {CONTAINERD}")
        assert tomllib.loads(text)["version"] == lab.config_version
        assert "# The lab VM lacks CAP_SYS_RESOURCE" in text
        dump = containerd_dump(lab, name)
        cri = cri_runtime(dump)
        nvidia = cri["containerd"]["runtimes"]["nvidia"]
        assert nvidia["runtime_type"] == "io.containerd.runc.v2"
        assert nvidia["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime"
        assert nvidia["options"]["SystemdCgroup"] is False
        # nvidia the default where the inventory says so (gpu-a100 in inventories/lab)
        default = "nvidia" if hv.get("container_toolkit_set_as_default") else "runc"
        assert cri["containerd"]["default_runtime_name"] == default, name
        assert cri["enable_cdi"] is True and "/etc/cdi" in cri["cdi_spec_dirs"]
        assert sandbox_image(dump) == "localhost/gpukit-lab/pause:3.10"
        # gpukit is installed on the node, in its venv.
        lab.sh(name, "/opt/gpukit/bin/python -c 'import gpukit.provision, pynvml'")
        # The CDI spec names every GPU and MIG device of the node.
        cdi = yaml.safe_load(lab.sh(name, f"cat {CDI}"))
        names = {d["name"] for d in cdi["devices"]}
        mig = sum(v for k, v in expected_allocatable(hv).items() if "/mig-" in k)
        assert len(names) == 2 * (int(hv["gpukit_gpu"]["count"]) + mig) + 1, names
    # The device plugin runs everywhere and serves what the inventory declares.
    apps = client.AppsV1Api()
    ds = apps.read_namespaced_daemon_set("gpukit-node-agent", "gpukit-system")
    assert ds.status.number_ready == ds.status.desired_number_scheduled == len(lab.hostvars)
    for name, hv in lab.hostvars.items():
        want = expected_allocatable(hv)
        wait_for(f"{name} allocatable {want}",
                 lambda n=name, w=want: gpu_allocatable(lab.core, n) == w, every=1, timeout=90)  # fmt: skip
        # The agent got its node's declaration from the role and says it serves it (issue 30).
        wait_for(f"{name} condition GpuDeclarationMismatch False",
                 lambda n=name: declaration_condition(lab.core, n) == (
                     "False", "ServesDeclaration"), every=1, timeout=30)  # fmt: skip
        labels = lab.core.read_node(name).metadata.labels
        assert labels["nvidia.com/device-plugin.config"] == hv["gpukit_device_plugin_config"]
        if hv.get("gpukit_mig_config"):
            assert labels["nvidia.com/mig.config"] == hv["gpukit_mig_config"]
    assert expected_allocatable(lab.hostvars["gpu-t4"]) == {"nvidia.com/gpu": 8}


def declaration_condition(core: client.CoreV1Api, node: str) -> tuple[str, str] | None:
    for c in core.read_node(node).status.conditions or []:
        if c.type == "GpuDeclarationMismatch":
            return c.status, c.reason
    return None


def assert_validated_once(lab: Lab, calls: Path) -> None:
    """site.yml validated each host's declaration once, in the preflight: one host validation
    per host, one parse per distinct config (hosts share them); the roles read the preflight's
    result. The only other parse is the node agent's ConfigMap check of the merged configs
    (once per play)."""
    lines = calls.read_text().splitlines()
    hosts = sorted(lab.hostvars)
    assert sorted(ln.split()[1] for ln in lines if ln.startswith("node_from_vars ")) == hosts
    distinct = {json.dumps(c, sort_keys=True) for hv in lab.hostvars.values()
                for c in hv["gpukit_device_plugin_configs"].values()}  # fmt: skip
    merged = {name for hv in lab.hostvars.values() for name in hv["gpukit_device_plugin_configs"]}
    configmap = [ln for ln in lines if ln.startswith("parse_config gpukit_device_plugin_configs[")]
    assert len(configmap) == len(merged), lines
    assert counts(calls)["parse_config"] == len(distinct) + len(merged), lines
    assert counts(calls)["sharing"] == 0, lines


# How a GitOps tool applies `gpukit manifests` after site.yml: server-side, as its own field
# manager, without --force-conflicts.
GITOPS_MANAGER = "gitops-check"


def _without_bookkeeping(obj: dict[str, Any]) -> dict[str, Any]:
    meta = {k: v for k, v in obj["metadata"].items()
            if k not in ("managedFields", "resourceVersion")}  # fmt: skip
    return {**obj, "metadata": meta}


def _missing_or_different(want: Any, live: Any, path: str = "") -> list[str]:
    """Where the live object lacks or differs from a field we declared (fields the API server
    adds are not differences, nor a declared zero value it leaves out, as `readOnly: false`;
    lists must match item by item)."""
    if live is None and want in (False, 0, "", [], {}):
        return []
    if isinstance(want, dict):
        if not isinstance(live, dict):
            return [f"{path or '.'}: {live!r} is not a mapping"]
        return [d for k, v in want.items()
                for d in _missing_or_different(v, live.get(k), f"{path}.{k}")]  # fmt: skip
    if isinstance(want, list):
        if not isinstance(live, list) or len(live) != len(want):
            return [f"{path}: {len(want)} items declared, live {live!r}"]
        return [d for i, (w, x) in enumerate(zip(want, live, strict=True))
                for d in _missing_or_different(w, x, f"{path}[{i}]")]  # fmt: skip
    return [] if want == live else [f"{path}: declared {want!r}, live {live!r}"]


def test_gpukit_manifests_prints_what_the_role_applied(lab: Lab) -> None:
    """`gpukit manifests` for the lab's inventory (with the play's -e) prints exactly the
    objects site.yml's device_plugin role applied (issue 29, GitOps): every field the printed
    object declares is live, and a GitOps tool's server-side apply of it as another manager,
    without forcing, meets no conflict with the role's apply and changes nothing."""
    from kubernetes.dynamic import DynamicClient
    from kubernetes.dynamic.exceptions import NotFoundError

    out = subprocess.run(
        [sys.executable, "-m", "gpukit", "manifests", "--inventory", str(lab.inventory),
         "-e", f"@{LAB_VARS}"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert out.returncode == 0, out.stderr
    printed = list(yaml.safe_load_all(out.stdout))
    assert [o["kind"] for o in printed] == [
        "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
        "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
        # served vs declared: the condition's policy and each node's declaration (issue 30)
        "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "ConfigMap", "ConfigMap",
        "DaemonSet",  # then the DRA plugin's, applied always (no pod: no node declares DRA)
        "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding", "DeviceClass", "DeviceClass", "DaemonSet"]  # fmt: skip
    dyn = DynamicClient(client.ApiClient())

    def resource(dyn: DynamicClient, doc: dict[str, Any]) -> Any:
        return dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])

    problems: list[str] = []
    for want in printed:
        meta = want["metadata"]
        name = f"{want['kind']} {meta.get('namespace', '')}/{meta['name']}"
        try:
            live = resource(dyn, want).get(
                name=meta["name"], namespace=meta.get("namespace")).to_dict()
        except NotFoundError:
            problems.append(f"{name}: printed but not in the cluster")
            continue
        problems += [f"{name}: {d}" for d in _missing_or_different(want, live)]
        try:
            dry = resource(dyn, want).server_side_apply(
                body=want, name=meta["name"], namespace=meta.get("namespace"),
                field_manager=GITOPS_MANAGER, dry_run="All").to_dict()
        except client.exceptions.ApiException as e:
            problems.append(f"{name}: server-side apply as {GITOPS_MANAGER}: {e.status} {e.body}")
            continue
        if _without_bookkeeping(dry) != _without_bookkeeping(live):
            problems.append(f"{name}: a server-side apply of the printed object would change it")
    assert not problems, "\n".join(problems)
    # The lab's own settings reached the DaemonSet (not only defaults on both sides).
    pod = printed[10]["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == "localhost/gpukit-lab/node-agent:dev"
    assert sorted(printed[8]["data"]) == sorted(
        lab.hostvars["gpu-t4"]["gpukit_device_plugin_configs"])
    assert sorted(printed[9]["data"]) == sorted(lab.hostvars)  # one declaration per node


def test_second_run_changes_nothing(lab: Lab) -> None:
    r = lab.play()
    TIMINGS["second"] = r.seconds
    assert r.rc == 0 and not r.failed, r.describe()
    assert r.changed == {}, f"a second run changed something: {r.changed}"
    for host in lab.hostvars:
        assert r.changed_count(host) == 0
    print(f"\nsite.yml on the lab: first run {TIMINGS.get('first', 0):.1f}s,"
          f" second run {r.seconds:.1f}s")  # fmt: skip


def _sleeper(name: str, node: str, runtime_class: str | None) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(
            node_name=node, host_network=True, restart_policy="Never",
            runtime_class_name=runtime_class, termination_grace_period_seconds=0,
            containers=[client.V1Container(name="c", image=images.SHELL,
                                           command=["sleep", "3600"])],
        ),
    )  # fmt: skip


def test_pods_run_under_the_nvidia_runtime_class(lab: Lab) -> None:
    """The role's RuntimeClass `nvidia` (handler: the runtime it added, as NVIDIA's GPU
    Operator names it) runs its pods' containers through nvidia-container-runtime (its log
    names each container it created); a pod without it runs through plain runc."""
    name = "gpu-t4"
    rc = client.NodeV1Api().read_runtime_class("nvidia")
    assert rc.handler == "nvidia" and rc.metadata.labels == {"app.kubernetes.io/part-of": "gpukit"}
    pods = {"gpukit-test-nvidia-rc": "nvidia", "gpukit-test-plain": None}
    try:
        for pod, runtime_class in pods.items():
            lab.core.create_namespaced_pod("default", _sleeper(pod, name, runtime_class))
        ids = {}
        for pod in pods:
            got = waits.pod_phase(lab.core, "default", pod, {"Running"}, 90)
            ids[pod] = got.status.container_statuses[0].container_id.removeprefix(
                "containerd://")
        log = lab.sh(name, f"cat {RUNTIME_LOG} 2>/dev/null || true")
        created = {line.split()[-1] for line in log.splitlines() if " create " in line}
        assert ids["gpukit-test-nvidia-rc"] in created, (ids, log[-2000:])
        assert ids["gpukit-test-plain"] not in created, (ids, log[-2000:])
    finally:
        for pod in pods:
            lab.core.delete_namespaced_pod(pod, "default", grace_period_seconds=0)
        for pod in pods:  # gone before the next test restarts containerd
            assert waits.gone(lab.core.list_namespaced_pod, ("default",),
                              f"metadata.name={pod}", 90), pod


def test_a_gpu_less_pod_meets_the_hardening_under_the_default_gpu_runtime(lab: Lab) -> None:
    """Issue 28: on the node whose default runtime the inventory makes nvidia, a pod with no
    runtimeClassName runs through nvidia-container-runtime; asking for every GPU through
    NVIDIA_VISIBLE_DEVICES=all, it gets none unprivileged (NVIDIA's hardening) and every one
    privileged (the runtime's log names the device nodes it added)."""
    name = next(n for n, hv in lab.hostvars.items() if hv.get("container_toolkit_set_as_default"))
    count = int(lab.hostvars[name]["gpukit_gpu"]["count"])
    script = 'ls /dev | grep "^nvidia[0-9]" | tr "\\n" " "; echo END; exec sleep 3600'
    pods = {"gpukit-test-nvd-all": False, "gpukit-test-nvd-all-priv": True}
    try:
        for pod, privileged in pods.items():
            body = _sleeper(pod, name, None)
            c = body.spec.containers[0]
            c.command = ["sh", "-c", script]
            c.env = [client.V1EnvVar(name="NVIDIA_VISIBLE_DEVICES", value="all")]
            c.security_context = client.V1SecurityContext(privileged=privileged)
            lab.core.create_namespaced_pod("default", body)
        log = ""
        seen: dict[str, str] = {}
        for pod in pods:
            got = waits.pod_phase(lab.core, "default", pod, {"Running"}, 90)
            cid = got.status.container_statuses[0].container_id.removeprefix("containerd://")
            seen[pod] = wait_for(f"{pod} to report", lambda p=pod: (
                lambda out: out if "END" in out else None)(
                lab.core.read_namespaced_pod_log(p, "default")), timeout=60)
            log = lab.sh(name, f"cat {RUNTIME_LOG}")
            assert any(" create " in ln and ln.split()[-1] == cid for ln in log.splitlines()), (
                pod, log[-2000:])
            edits = [ln for ln in log.splitlines() if f": {cid}: mode " in ln]
            if pods[pod]:
                added = set(re.findall(r"/dev/nvidia\d+\b", edits[0])) if edits else set()
                assert added == {f"/dev/nvidia{i}" for i in range(count)}, (pod, edits)
            else:
                assert edits == [], (pod, edits)
        assert seen["gpukit-test-nvd-all"].split() == ["END"], seen
        assert len(seen["gpukit-test-nvd-all-priv"].split()) == count + 1, seen
    finally:
        for pod in pods:
            lab.core.delete_namespaced_pod(pod, "default", grace_period_seconds=0)
        for pod in pods:
            assert waits.gone(lab.core.list_namespaced_pod, ("default",),
                              f"metadata.name={pod}", 90), pod


DROPIN = "/etc/containerd/conf.d/99-gpukit-nvidia.toml"
OTHER = "/etc/containerd/conf.d/50-other-tool.toml"
NVIDIAS = "/etc/containerd/conf.d/99-nvidia.toml"
CONFIGURE = "Configure containerd for the nvidia runtime"


def containerd_pid(lab: Lab, name: str) -> str:
    return lab.sh(name, "systemctl show -p MainPID --value containerd").strip()


def test_drop_in_mode_on_the_nodes_containerd(lab: Lab) -> None:
    """drop_in mode against the node's real containerd: the installer's main file gains only
    the import, gpukit's drop-in has its version, another tool's drop-in is kept, and
    containerd (restarted) runs both; a second run changes nothing and does not restart it;
    check mode shows drift without touching it; a rewrite that containerd reads the same
    changes the file but does not restart containerd. Then back to in_place."""
    name = "gpu-t4"
    root = nodes.root(lab.node(name))
    in_place = lab.sh(name, f"cat {CONTAINERD}")
    installer = (REPO / "gpukit/lab/node" / f"containerd-v{lab.config_version}.toml").read_text()
    other = (f"# left by another tool\nversion = {lab.config_version}\n\n"
             f'[plugins."{CRI_TABLE[lab.config_version]}".containerd.runtimes.other]\n'
             '  runtime_type = "io.containerd.runc.v2"\n')  # fmt: skip
    (root / CONTAINERD.lstrip("/")).write_text(installer)
    (root / OTHER.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
    (root / OTHER.lstrip("/")).write_text(other)
    # NVIDIA's own drop-in (nvidia-ctk --drop-in-config) sorts after gpukit's and would make
    # nvidia the default this node does not declare: gpukit's takes its place.
    table = CRI_TABLE[lab.config_version]
    theirs = (f"version = {lab.config_version}\n[plugins.\"{table}\".containerd]\n"
              '  default_runtime_name = "nvidia"\n'
              f'[plugins."{table}".containerd.runtimes.nvidia]\n'
              '  runtime_type = "io.containerd.runc.v2"\n'
              f'[plugins."{table}".containerd.runtimes.nvidia.options]\n'
              '  BinaryName = "/usr/bin/nvidia-container-runtime"\n')  # fmt: skip
    (root / NVIDIAS.lstrip("/")).write_text(theirs)
    drop_in = {"container_toolkit_containerd_mode": "drop_in"}
    tags = ("--limit", name, "--tags", "container_toolkit_config")
    try:
        pid = containerd_pid(lab, name)
        r = lab.play(*tags, extra_vars=drop_in)
        assert r.rc == 0 and not r.failed, r.describe()
        assert set(r.changed.get(name, [])) == {CONFIGURE, "Restart containerd"}, r.changed
        main = lab.sh(name, f"cat {CONTAINERD}")
        added = [ln for ln in main.splitlines() if ln not in installer.splitlines()]
        assert added == ["imports = [\"/etc/containerd/conf.d/*.toml\"]"], main
        assert tomllib.loads(lab.sh(name, f"cat {DROPIN}"))["version"] == lab.config_version
        assert lab.sh(name, f"cat {OTHER}") == other
        assert not (root / NVIDIAS.lstrip("/")).exists()
        assert lab.sh(name, f"cat {NVIDIAS}.replaced-by-gpukit") == theirs
        wait_for("containerd restarted", lambda: containerd_pid(lab, name) not in ("0", pid), every=1, timeout=90)
        runtimes = cri_runtime(containerd_dump(lab, name))["containerd"]["runtimes"]
        assert runtimes["nvidia"]["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime"
        assert "other" in runtimes and "runc" in runtimes
        default = cri_runtime(containerd_dump(lab, name))["containerd"]["default_runtime_name"]
        assert default == "runc", default
        assert sandbox_image(containerd_dump(lab, name)) == "localhost/gpukit-lab/pause:3.10"
        # Idempotent, and containerd keeps running.
        pid = containerd_pid(lab, name)
        again = lab.play(*tags, extra_vars=drop_in)
        assert again.rc == 0 and again.changed == {}, again.describe()
        assert containerd_pid(lab, name) == pid
        # Check mode: drift in gpukit's drop-in shown, not repaired.
        drifted = lab.sh(name, f"cat {DROPIN}").replace("nvidia-container-runtime", "runc")
        (root / DROPIN.lstrip("/")).write_text(drifted)
        check = lab.play(*tags, "--check", "--diff", extra_vars=drop_in)
        assert check.rc == 0 and set(check.changed.get(name, [])) >= {CONFIGURE}, check.describe()
        assert "nvidia-container-runtime" in json.dumps(check.results[name][CONFIGURE]["diff"])
        assert lab.sh(name, f"cat {DROPIN}") == drifted
        fixed = lab.play(*tags, extra_vars=drop_in)
        assert set(fixed.changed.get(name, [])) == {CONFIGURE, "Restart containerd"}
        assert fixed.results[name][CONFIGURE]["restart_needed"] is True
        # A rewrite containerd reads the same: the file is put back, containerd keeps running.
        pid = wait_for("containerd up", lambda: containerd_pid(lab, name) not in ("0", "")
                       and containerd_pid(lab, name), every=1, timeout=90)  # fmt: skip
        wait_for("containerd active", lambda: _active(lab, name), every=1, timeout=90)
        (root / DROPIN.lstrip("/")).write_text("# a comment\n" + lab.sh(name, f"cat {DROPIN}"))
        layout = lab.play(*tags, extra_vars=drop_in)
        assert layout.changed.get(name) == [CONFIGURE], layout.describe()
        assert layout.results[name][CONFIGURE]["restart_needed"] is False
        assert containerd_pid(lab, name) == pid
    finally:
        (root / OTHER.lstrip("/")).unlink(missing_ok=True)
        for leftover in (NVIDIAS, NVIDIAS + ".replaced-by-gpukit"):
            (root / leftover.lstrip("/")).unlink(missing_ok=True)
        (root / CONTAINERD.lstrip("/")).write_text(in_place)
        back = lab.play(*tags)  # in_place removes gpukit's drop-in
    assert back.rc == 0 and not back.failed, back.describe()
    assert not (root / DROPIN.lstrip("/")).exists()
    wait_for("containerd active", lambda: _active(lab, name), every=1, timeout=90)
    wait_for(f"{name} allocatable back",
             lambda: gpu_allocatable(lab.core, name) == expected_allocatable(lab.hostvars[name]), every=1, timeout=90)  # fmt: skip


def _active(lab: Lab, name: str) -> bool:
    r = cluster.node_exec(lab.node(name), ["systemctl", "is-active", "containerd"])
    return r.stdout.strip() == "active"


def test_check_mode_reports_drift_without_changing_it(lab: Lab) -> None:
    name = "gpu-t4"
    text = lab.sh(name, f"cat {CONTAINERD}")
    if ".runtimes.nvidia]" not in text:  # left drifted by an interrupted run: converge first
        assert lab.play("--limit", name).rc == 0
        text = lab.sh(name, f"cat {CONTAINERD}")
    doc = tomlkit.parse(text)
    del doc["plugins"][CRI_TABLE[lab.config_version]]["containerd"]["runtimes"]["nvidia"]  # type: ignore[index, union-attr]
    drifted = tomlkit.dumps(doc)
    root = nodes.root(lab.node(name))
    (root / CONTAINERD.lstrip("/")).write_text(drifted)
    (root / PIN.lstrip("/")).write_text("Package: nvidia-driver\nPin: version 570.*\n"
                                        "Pin-Priority: 1001\n")  # fmt: skip
    lab.core.patch_node(name, {"metadata": {"labels": {"nvidia.com/device-plugin.config": None}}})
    r = lab.play("--check", "--diff", "--limit", name)
    assert r.rc == 0 and not r.failed, r.describe()
    changed = set(r.changed.get(name, []))
    assert changed == {"Configure containerd for the nvidia runtime", "Pin the driver branch",
                       "Label and taint the node", "Restart containerd"}, changed  # fmt: skip
    diff = json.dumps(r.results[name]["Configure containerd for the nvidia runtime"]["diff"])
    assert "containerd.runtimes.nvidia]" in diff
    # Nothing changed on the node or in the cluster.
    assert lab.sh(name, f"cat {CONTAINERD}") == drifted
    assert "570.*" in lab.sh(name, f"cat {PIN}")
    labels = lab.core.read_node(name).metadata.labels
    assert "nvidia.com/device-plugin.config" not in labels
    # A real run repairs exactly the drift.
    fixed = lab.play("--limit", name)
    assert fixed.rc == 0 and not fixed.failed, fixed.describe()
    assert set(fixed.changed.get(name, [])) == changed
    assert lab.sh(name, f"cat {CONTAINERD}") == text
    wait_for(
        "gpu-t4 allocatable back",
        lambda: gpu_allocatable(lab.core, name) == expected_allocatable(lab.hostvars[name]),
        every=1, timeout=90)


def test_branch_switch_upgrades_the_driver_and_reboots(lab: Lab) -> None:
    """nvidia_driver_activation: reboot (the default reloads the modules instead:
    tests/roles/test_driver_reload_lab.py)."""
    name = "gpu-t4"
    reboot = {"nvidia_driver_activation": "reboot"}
    hv = lab.hostvars[name]
    old = str(hv["nvidia_driver_branch"])
    new = "570" if old != "570" else "550"
    new_version = branch_version(new)
    # Check mode shows the exact upgrade, changes nothing.
    plan = lab.play("--check", "--limit", name, "--tags", "nvidia_driver",
                    extra_vars={"nvidia_driver_branch": new, **reboot})  # fmt: skip
    assert plan.rc == 0 and not plan.failed, plan.describe()
    summary = plan.results[name]["Plan the driver packages"]["summary"]
    assert f"upgrade nvidia-driver {branch_version(old)}-1 -> {new_version}-1" in summary or (
        f"downgrade nvidia-driver {branch_version(old)}-1 -> {new_version}-1" in summary
    )
    assert f"install nvidia-driver-{new} {new_version}-1" in summary
    assert "Install the driver packages" in plan.changed[name]
    assert "Reboot for the installed driver" in plan.changed[name]
    assert installed(lab, name)["nvidia-driver"] == f"{branch_version(old)}-1"
    # The real switch: new packages, the old branch gone, a reboot, the new driver running.
    booted = boot_time(lab, name)
    r = lab.play(
        "--limit", name, "--tags", "nvidia_driver",
        extra_vars={"nvidia_driver_branch": new, **reboot},
    )
    assert r.rc == 0 and not r.failed, r.describe()
    pkgs = installed(lab, name)
    assert pkgs["nvidia-driver"] == pkgs[f"nvidia-driver-{new}"] == f"{new_version}-1"
    assert f"nvidia-driver-{old}" not in pkgs
    assert f"Pin: version {new}.*" in lab.sh(name, f"cat {PIN}")
    assert boot_time(lab, name) != booted
    assert lab.sh(name, "nvidia-smi --query-gpu=driver_version --format=csv,noheader"
                  ).split()[0] == new_version  # fmt: skip
    wait_for(f"{name} labels the new driver",
             lambda: lab.core.read_node(name).metadata.labels.get(
                 "nvidia.com/cuda.driver-version.full") == new_version, timeout=120, every=1)  # fmt: skip
    # Back to the inventory's branch (the lab stays as declared).
    back = lab.play("--limit", name, "--tags", "nvidia_driver", extra_vars=reboot)
    assert back.rc == 0 and not back.failed, back.describe()
    assert installed(lab, name)["nvidia-driver"] == f"{branch_version(old)}-1"
    assert lab.sh(name, "nvidia-smi --query-gpu=driver_version --format=csv,noheader"
                  ).split()[0] == branch_version(old)  # fmt: skip


# The device plugin's cluster-wide objects (the ConfigMap of every named config, the DaemonSet)
# are applied once per play (run_once): Ansible reports that task on the play's first host,
# whichever nodes select the config that changed.
FLEET_TASK = "Apply the device plugin's objects"
NEW_LAYOUT = "a100-balanced"


def edit_yaml(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    doc = yaml.safe_load(path.read_text()) or {}
    change(doc)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def set_time_sliced_replicas(n: int) -> Callable[[dict[str, Any]], None]:
    def change(doc: dict[str, Any]) -> None:
        cfg = doc["gpukit_device_plugin_configs"]["time-sliced"]
        (res,) = [r for r in cfg["sharing"]["timeSlicing"]["resources"]
                  if r["name"] == "nvidia.com/gpu"]  # fmt: skip
        res["replicas"] = n

    return change


def agent_pods(core: client.CoreV1Api) -> dict[str, str]:
    """{node: uid} of the node agent's pods."""
    pods = core.list_namespaced_pod("gpukit-system",
                                    label_selector="app.kubernetes.io/name=gpukit-node-agent")
    return {p.spec.node_name: p.metadata.uid for p in pods.items
            if p.status.phase == "Running" and p.metadata.deletion_timestamp is None}


def run_conformance(inventory: Path, junit: Path, *args: str) -> tuple[int, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "gpukit/conformance", "--inventory", str(inventory),
         "--kubeconfig", str(paths().admin_kubeconfig), "-q", "-p", "no:cacheprovider",
         f"--junitxml={junit}", *args],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    return proc.returncode, proc.stdout[-6000:] + proc.stderr[-2000:]


def conformance_checks(junit: Path) -> list[dict[str, Any]]:
    """Every expected-vs-observed comparison the suite recorded (JUnit `check` properties)."""
    return [json.loads(p.get("value", "{}")) for p in ET.parse(junit).getroot().iter("property")
            if p.get("name") == "check"]  # fmt: skip


# Four site.yml runs, two suite runs and the waits between them: past the default 600 s when
# the machine is loaded (seen in a fresh clone's CI lane 2 at load 6), with nothing wrong.
@pytest.mark.timeout(1200)
def test_group_vars_change_only_the_nodes_they_declare(lab: Lab, tmp_path: Path) -> None:
    """A user edits the inventory's group_vars and re-runs site.yml: only the nodes whose
    declarations changed change, and the conformance suite passes against the edited inventory
    (and fails against the old one). Two edits, one run each, on a copy of the inventory:

    - time-slicing for the t4 group: replicas of the `time-sliced` config (the one the t4 group
      selects) 4 -> 8. Named configs live in gpu_nodes (one ConfigMap for the fleet), so the
      change is that ConfigMap (FLEET_TASK) and no node-level task on either node; gpu-t4's
      agent reloads the config, gpu-a100's is untouched;
    - a new named MIG layout selected by the a100 group: only gpu-a100 changes (MIG, CDI spec,
      its mig.config label); gpu-t4 reports changed=0.

    Then the original group_vars are run again and the lab is back as declared."""
    from gpukit.provision.upgrade import declaration_served
    from gpukit.summary import read_junit

    hosts = set(lab.hostvars)
    edited = tmp_path / "inventory"
    shutil.copytree(lab.inventory, edited)
    gv = edited / "group_vars"
    # Converged before the edits (a lab left drifted would blur what each edit changed).
    base = lab.play(inventory=edited)
    assert base.rc == 0 and not base.failed, base.describe()
    wait_for("allocatable as declared", lambda: all(
        gpu_allocatable(lab.core, h) == expected_allocatable(lab.hostvars[h]) for h in hosts), every=1, timeout=90)
    pods = agent_pods(lab.core)
    assert set(pods) == hosts, pods
    try:
        # 1. time-slicing replicas 4 -> 8 for the t4 group.
        edit_yaml(gv / "gpu_nodes.yml", set_time_sliced_replicas(8))
        r = lab.play(inventory=edited)
        assert r.rc == 0 and not r.failed, r.describe()
        # gpu-a100 comes first in the inventory: the fleet-wide apply reports there.
        assert r.changed == {"gpu-a100": [FLEET_TASK]}, r.changed
        assert r.changed_count("gpu-a100") == 1 and r.changed_count("gpu-t4") == 0, r.stats
        # 2. a new named MIG layout for the a100 group.
        edit_yaml(gv / "gpu_nodes.yml", lambda d: d["gpukit_mig_configs"].update({NEW_LAYOUT: [
            {"devices": [0, 1, 2, 3], "mig-enabled": True,
             "mig-devices": {"3g.20gb": 1, "2g.10gb": 1, "1g.5gb": 1}},
            {"devices": [4, 5, 6, 7], "mig-enabled": False}]}))
        edit_yaml(gv / "a100_nodes.yml", lambda d: d.update(gpukit_mig_config=NEW_LAYOUT))
        r = lab.play(inventory=edited)
        assert r.rc == 0 and not r.failed, r.describe()
        assert set(r.changed) == {"gpu-a100"}, r.changed
        # FLEET_TASK: gpu-a100's entry in the agents' declarations ConfigMap (issue 30).
        assert set(r.changed["gpu-a100"]) == {
            "Apply the node's MIG layout", "Rewrite the CDI spec for the new MIG devices",
            "Label and taint the node", FLEET_TASK}, r.changed  # fmt: skip
        assert r.changed_count("gpu-t4") == 0 and r.changed_count("gpu-a100") == 4, r.stats
        # The nodes serve the new declarations; the agents were not restarted (gpu-t4's
        # reloaded its config when the kubelet refreshed the ConfigMap volume).
        new = hostvars_of(edited)
        want = {h: expected_allocatable(new[h]) for h in hosts}
        assert want["gpu-t4"] == {"nvidia.com/gpu": 16}
        assert want["gpu-a100"] == {"nvidia.com/gpu": 4, "nvidia.com/mig-1g.5gb": 4,
                                    "nvidia.com/mig-2g.10gb": 4, "nvidia.com/mig-3g.20gb": 4}
        for h in sorted(hosts):
            wait_for(f"{h} allocatable {want[h]}",
                     lambda h=h: gpu_allocatable(lab.core, h) == want[h], timeout=180, every=1)  # fmt: skip
        # site.yml returned only once each agent says it serves its new declaration (read
        # from its ConfigMap volume, which the kubelet refreshes up to about a minute after
        # the MIG change already shows): the suite's condition check needs no wait.
        for h in sorted(hosts):
            node = lab.core.api_client.sanitize_for_serialization(lab.core.read_node(h))
            assert declaration_served(node, want[h]), (h, node["status"]["conditions"])
        assert agent_pods(lab.core) == pods
        labels = lab.core.read_node("gpu-a100").metadata.labels
        assert labels["nvidia.com/mig.config"] == NEW_LAYOUT
        # The conformance suite passes against the edited inventory, with its expectations...
        junit = tmp_path / "conformance.xml"
        rc, out = run_conformance(edited, junit)
        assert rc == 0, out
        run = read_junit(junit)
        assert run.failed == 0 and all(run.nodes[h].passed > 0 for h in hosts), out
        seen = {(c["node"], c["resource"], c["what"], c["expected"], c["observed"])
                for c in conformance_checks(junit)}  # fmt: skip
        assert ("gpu-t4", "nvidia.com/gpu", "allocatable", "16", "16") in seen
        assert ("gpu-a100", "nvidia.com/mig-3g.20gb", "allocatable", "4", "4") in seen
        # ...and fails against the old one, naming the old expectations.
        old_junit = tmp_path / "old.xml"
        rc, out = run_conformance(lab.inventory, old_junit, "-m", "discovery")
        assert rc == 1, out
        failures = "\n".join(f"{f.get('message')}\n{f.text}" for tag in ("failure", "error")
                             for f in ET.parse(old_junit).getroot().iter(tag))  # fmt: skip
        assert "node gpu-t4: nvidia.com/gpu: capacity: expected 8, observed 16" in failures
        assert "node gpu-a100: nvidia.com/gpu: capacity: expected 6, observed 4" in failures
    finally:
        # The original group_vars again: the lab ends as declared (later tests depend on it).
        back = lab.play()
    assert back.rc == 0 and not back.failed, back.describe()
    assert set(back.changed.get("gpu-a100", [])) == {
        FLEET_TASK, "Apply the node's MIG layout", "Rewrite the CDI spec for the new MIG devices",
        "Label and taint the node"} and "gpu-t4" not in back.changed, back.changed  # fmt: skip
    for h in sorted(hosts):
        wait_for(f"{h} allocatable back", lambda h=h: gpu_allocatable(
            lab.core, h) == expected_allocatable(lab.hostvars[h]), timeout=180, every=1)  # fmt: skip
