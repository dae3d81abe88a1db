"""site.yml on the lab: both nodes converge to the inventory, a second run changes nothing,
check mode reports drift without touching it, and a branch switch upgrades the driver.

The tests share one lab and run in order (each builds on the previous one's state). The
inventory is the lab's (a copy for this lab instance) plus the lab's provisioning settings
(lab_group_vars.yml); gpukit's wheelhouse is built once and pinned for the whole module, so
edits to the checkout while the tests run do not count as changes on the nodes.
"""

from __future__ import annotations

import json
import subprocess
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import tomlkit
import yaml
from kubernetes import client, config
from labplay import BIN, LAB_VARS, PlayResult, run_playbook

from gpukit.lab import cluster, nodes
from gpukit.lab.config import LabSpec, NodeSpec, cache_dir, load_spec
from gpukit.lab.controlplane import paths

pytestmark = pytest.mark.lab

CONTAINERD = "/etc/containerd/config.toml"
PIN = "/etc/apt/preferences.d/gpukit-nvidia-driver"
CDI = "/etc/cdi/nvidia.yaml"
TIMINGS: dict[str, float] = {}


@dataclass
class Lab:
    spec: LabSpec
    inventory: Path
    hostvars: dict[str, dict[str, Any]]
    wheelhouse: str
    core: client.CoreV1Api

    def node(self, name: str) -> NodeSpec:
        return self.spec.node(name)

    def sh(self, name: str, command: str) -> str:
        r = cluster.node_exec(self.node(name), ["sh", "-c", command])
        assert r.returncode == 0, f"{name}: {command}: {r.stderr}"
        return r.stdout

    def play(self, *args: str, **kw: Any) -> PlayResult:
        extra = {"gpukit_node_wheelhouse_archive": self.wheelhouse, **kw.pop("extra_vars", {})}
        return run_playbook("site.yml", self.inventory, *args, extra_vars=extra, **kw)


def wait_for(what: str, check: Callable[[], Any], timeout: float = 90) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(1)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


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


def branch_version(branch: str) -> str:
    from gpukit.lab.packages import BRANCHES

    return next(b.driver_version for b in BRANCHES if b.name == branch)


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


def test_site_converges_both_nodes(lab: Lab) -> None:
    r = lab.play()
    TIMINGS["first"] = r.seconds
    assert r.rc == 0 and not r.failed, r.describe()
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
        # containerd: the nvidia runtime added, everything the lab wrote kept (comments too).
        text = lab.sh(name, f"cat {CONTAINERD}")
        cri = tomllib.loads(text)["plugins"]["io.containerd.grpc.v1.cri"]
        nvidia = cri["containerd"]["runtimes"]["nvidia"]
        assert nvidia["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime"
        assert nvidia["options"]["SystemdCgroup"] is False
        assert cri["containerd"]["default_runtime_name"] == "runc"
        assert cri["enable_cdi"] is True and "/etc/cdi" in cri["cdi_spec_dirs"]
        assert cri["sandbox_image"] == "localhost/gpukit-lab/pause:3.10"
        assert "# The lab VM lacks CAP_SYS_RESOURCE" in text
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
                 lambda n=name, w=want: gpu_allocatable(lab.core, n) == w)  # fmt: skip
        labels = lab.core.read_node(name).metadata.labels
        assert labels["nvidia.com/device-plugin.config"] == hv["gpukit_device_plugin_config"]
        if hv.get("gpukit_mig_config"):
            assert labels["nvidia.com/mig.config"] == hv["gpukit_mig_config"]
    assert expected_allocatable(lab.hostvars["gpu-t4"]) == {"nvidia.com/gpu": 8}


def test_second_run_changes_nothing(lab: Lab) -> None:
    r = lab.play()
    TIMINGS["second"] = r.seconds
    assert r.rc == 0 and not r.failed, r.describe()
    assert r.changed == {}, f"a second run changed something: {r.changed}"
    for host in lab.hostvars:
        assert r.changed_count(host) == 0
    print(f"\nsite.yml on the lab: first run {TIMINGS.get('first', 0):.1f}s,"
          f" second run {r.seconds:.1f}s")  # fmt: skip


def test_check_mode_reports_drift_without_changing_it(lab: Lab) -> None:
    name = "gpu-t4"
    text = lab.sh(name, f"cat {CONTAINERD}")
    if ".runtimes.nvidia]" not in text:  # left drifted by an interrupted run: converge first
        assert lab.play("--limit", name).rc == 0
        text = lab.sh(name, f"cat {CONTAINERD}")
    doc = tomlkit.parse(text)
    del doc["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["nvidia"]  # type: ignore[index, union-attr]
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
    )


def test_branch_switch_upgrades_the_driver_and_reboots(lab: Lab) -> None:
    name = "gpu-t4"
    hv = lab.hostvars[name]
    old = str(hv["nvidia_driver_branch"])
    new = "570" if old != "570" else "550"
    new_version = branch_version(new)
    # Check mode shows the exact upgrade, changes nothing.
    plan = lab.play("--check", "--limit", name, "--tags", "nvidia_driver",
                    extra_vars={"nvidia_driver_branch": new})  # fmt: skip
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
        "--limit", name, "--tags", "nvidia_driver", extra_vars={"nvidia_driver_branch": new}
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
                 "nvidia.com/cuda.driver-version.full") == new_version, timeout=120)  # fmt: skip
    # Back to the inventory's branch (the lab stays as declared).
    back = lab.play("--limit", name, "--tags", "nvidia_driver")
    assert back.rc == 0 and not back.failed, back.describe()
    assert installed(lab, name)["nvidia-driver"] == f"{branch_version(old)}-1"
    assert lab.sh(name, "nvidia-smi --query-gpu=driver_version --format=csv,noheader"
                  ).split()[0] == branch_version(old)  # fmt: skip
