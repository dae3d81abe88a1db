"""Prepare a lab node's root the way a cluster installer prepares a machine."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import uuid
from pathlib import Path

import yaml

from gpukit.lab import driver_surface, pki, registry
from gpukit.lab.config import PROFILES_DIR, LabSpec, NodeSpec, cache_dir, state_dir
from gpukit.lab.packages import containerd

NODE_FILES = Path(__file__).resolve().parent / "node"
# Units that would reach outside the machine, touch host-wide kernel state, or
# wait for hardware a namespace has not got.
MASKED_UNITS = (
    "systemd-sysctl.service",
    "systemd-timesyncd.service",
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "e2scrub_all.timer",
    "fstrim.timer",
    "systemd-modules-load.service",
    "getty@tty1.service",
    "console-getty.service",
    "systemd-remount-fs.service",
    "sys-kernel-config.mount",
    "sys-kernel-debug.mount",
    "sys-kernel-tracing.mount",
    "sys-fs-fuse-connections.mount",
    "systemd-journald-audit.socket",
)


def node_dir(node: NodeSpec) -> Path:
    return state_dir() / "nodes" / node.name


def root(node: NodeSpec) -> Path:
    return node_dir(node) / "root"


def surface_dir(node: NodeSpec) -> Path:
    """The node's rendered driver surface (sys/, dev/ trees boot.sh mounts): beside its root."""
    return node_dir(node) / "driver"


def gpu_count(profile: str) -> int:
    """Number of GPUs in a mock NVML profile (the device files a node gets)."""
    path = PROFILES_DIR / f"{profile}.yaml"
    data = yaml.safe_load(path.read_text())
    if isinstance(data, dict):
        if isinstance(data.get("gpus"), list):
            return len(data["gpus"])
        for key in ("count", "gpu_count"):
            if isinstance(data.get(key), int):
                return int(data[key])
    raise ValueError(f"{path}: no GPU count (expected `count:` or a `gpus:` list)")


def ssh_key() -> Path:
    key = state_dir() / "ssh" / "id_ed25519"
    if not key.exists():
        key.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpukit-lab", "-f", str(key)],
            check=True,
        )
    return key


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def prepare(lab: LabSpec, node: NodeSpec, base: Path, ca: pki.CA) -> None:
    """Create the node's root from the base image (once) and write its identity."""
    ndir = node_dir(node)
    r = root(node)
    if not (ndir / ".prepared").exists():
        if r.exists():
            shutil.rmtree(r)
        ndir.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cp", "-a", "--reflink=auto", str(base), str(r)], check=True)
        (r / ".complete").unlink(missing_ok=True)
        _first_boot_identity(node, r)
        (ndir / ".prepared").touch()
    install_containerd(lab, r)
    for path, text in registry.node_files(lab).items():  # containerd pulls from the lab's
        _write(r / path.lstrip("/"), text)
    (ndir / "gpus").write_text(str(gpu_count(node.profile)))
    _write_kubernetes_node(lab, node, r, ca)
    _write_nvml_profile(node, r)
    # The stand-in driver's hardware view (PCI sysfs, DMI, /dev/nvidia-caps), mounted by
    # boot.sh; its /proc/driver is written by the mock library into the NVML state dir.
    driver_surface.render_node(r / "etc/gpukit-lab/nvml/profile.yaml", surface_dir(node))


def _first_boot_identity(node: NodeSpec, r: Path) -> None:
    _write(r / "etc/machine-id", uuid.uuid4().hex + "\n", 0o444)
    _write(r / "etc/hostname", node.name + "\n")
    _write(r / "etc/hosts", f"127.0.0.1 localhost\n127.0.1.1 {node.name}\n")
    _write(r / "etc/resolv.conf", "# gpukit lab: no DNS leaves this machine\n")
    subprocess.run(["ssh-keygen", "-A", "-f", str(r)], check=True, capture_output=True)
    pub = ssh_key().with_suffix(".pub").read_text()
    _write(r / "root/.ssh/authorized_keys", pub, 0o600)
    (r / "root/.ssh").chmod(0o700)
    wants = r / "etc/systemd/system"
    for unit in MASKED_UNITS:
        link = wants / unit
        link.unlink(missing_ok=True)
        link.symlink_to("/dev/null")
    _write(r / "etc/systemd/system/kubelet.service", (NODE_FILES / "kubelet.service").read_text())
    _write(
        r / "etc/systemd/system/gpukit-lab-reboot.service",
        (NODE_FILES / "gpukit-lab-reboot.service").read_text(),
    )
    rb = wants / "reboot.target.wants"
    rb.mkdir(parents=True, exist_ok=True)
    (rb / "gpukit-lab-reboot.service").unlink(missing_ok=True)
    (rb / "gpukit-lab-reboot.service").symlink_to("/etc/systemd/system/gpukit-lab-reboot.service")
    (r / "var/lib/gpukit-lab").mkdir(parents=True, exist_ok=True)
    mu = wants / "multi-user.target.wants"
    mu.mkdir(parents=True, exist_ok=True)
    (mu / "kubelet.service").unlink(missing_ok=True)
    (mu / "kubelet.service").symlink_to("/etc/systemd/system/kubelet.service")


def installed_containerd(r: Path) -> str | None:
    """The version of the containerd package installed in a node's root (dpkg's record)."""
    status = r / "var/lib/dpkg/status"
    for stanza in status.read_text().split("\n\n") if status.exists() else []:
        fields = dict(
            line.split(": ", 1) for line in stanza.splitlines() if ": " in line and line[0] != " "
        )
        if fields.get("Package") == containerd.PACKAGE and fields.get("Status", "").endswith(
            " installed"
        ):
            return fields.get("Version")
    return None


def install_containerd(lab: LabSpec, r: Path) -> bool:
    """Install the lab's containerd package into a node's root (stopped) with dpkg, unless
    that version is installed, and write the node's containerd config for its config
    version over the package's default. True if it installed."""
    if installed_containerd(r) == containerd.deb_version(lab.containerd_version):
        return False
    deb = containerd.build_deb(cache_dir(), lab.containerd_version)
    inside = Path("/var/cache/gpukit-lab") / deb.name
    (r / inside.relative_to("/")).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(deb, r / inside.relative_to("/"))
    try:
        # --force-confnew: a version switch takes the new release's default config, which
        # the lab's own then replaces (its config version differs between 1.7 and 2.x).
        proc = subprocess.run(
            ["chroot", str(r), "dpkg", "--force-confnew", "-i", str(inside)],
            capture_output=True, text=True,
        )  # fmt: skip
    finally:
        (r / inside.relative_to("/")).unlink(missing_ok=True)
    if proc.returncode != 0:
        raise RuntimeError(f"installing {deb.name} into {r} failed: {proc.stderr.strip()}")
    version = containerd.config_version(lab.containerd_version)
    template = NODE_FILES / f"containerd-v{version}.toml"
    _write(r / "etc/containerd/config.toml", template.read_text())
    return True


def _write_kubernetes_node(lab: LabSpec, node: NodeSpec, r: Path, ca: pki.CA) -> None:
    ip = node.address(lab)
    pkidir = r / "etc/kubernetes/pki"
    pkidir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(ca.cert_path, pkidir / "ca.crt")
    crt, key = ca.issue(
        pkidir / "kubelet-client",
        f"system:node:{node.name}",
        organizations=("system:nodes",),
        client=True,
    )
    scrt, skey = ca.issue(
        pkidir / "kubelet-serving", node.name, dns=(node.name,), ips=(ip,), server=True
    )
    inside = Path("/etc/kubernetes/pki")
    pki.kubeconfig(
        r / "etc/kubernetes/kubelet.conf",
        lab.server_url,
        inside / "ca.crt",
        inside / crt.name,
        inside / key.name,
        f"system:node:{node.name}",
    )
    _write(r / "etc/default/kubelet", f"NODE_IP={ip}\nNODE_NAME={node.name}\n")
    # Pods get addresses on a bridge inside the node's own namespace and no route at
    # all beyond it (no gateway, no forwarding, no masquerading): they reach nothing.
    (r / "etc/cni/net.d/99-loopback.conflist").unlink(missing_ok=True)
    cni = {
        "cniVersion": "1.0.0",
        "name": "gpukit-lab",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": False,
                "ipMasq": False,
                "ipam": {"type": "host-local", "ranges": [[{"subnet": str(lab.pod_cidr(node))}]]},
            }
        ],
    }
    _write(r / "etc/cni/net.d/10-gpukit-lab.conflist", json.dumps(cni, indent=2) + "\n")
    config = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": ip,
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock",
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": "/",
        "failSwapOn": False,
        "failCgroupV1": False,
        "makeIPTablesUtilChains": False,
        # Kernel tunables are host-wide: the lab sets them once, nodes only check them.
        "protectKernelDefaults": True,
        "resolvConf": "/etc/resolv.conf",
        "tlsCertFile": str(inside / scrt.name),
        "tlsPrivateKeyFile": str(inside / skey.name),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(inside / "ca.crt")},
        },
        "authorization": {"mode": "Webhook"},
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        "registerNode": True,
        "nodeStatusReportFrequency": "10s",
        "nodeStatusUpdateFrequency": "4s",
        "localStorageCapacityIsolation": False,
    }
    _write(r / "var/lib/kubelet/config.yaml", yaml.safe_dump(config, sort_keys=False))


def _write_nvml_profile(node: NodeSpec, r: Path) -> None:
    """The node's GPU hardware: its mock NVML profile, seeded by the node name."""
    src = PROFILES_DIR / f"{node.profile}.yaml"
    dst = r / "etc/gpukit-lab/nvml/profile.yaml"
    dst.parent.mkdir(parents=True, exist_ok=True)
    # Same hardware, different boards: each node's UUIDs and serials derive from its own seed.
    text = re.sub(r"(?m)^seed:.*$", f"seed: {node.profile}@{node.name}", src.read_text())
    if not re.search(r"(?m)^seed:", text):
        text = f"seed: {node.profile}@{node.name}\n" + text
    _write(dst, text)
    _write(r / "etc/gpukit-lab/nvml/profile-name", node.profile + "\n")
    # The simulated driver's user-space library, where a driver install puts it.
    from gpukit.lab import nvml

    lib = nvml.library_path()
    if lib is not None:
        dst_lib = r / "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
        tmp = dst_lib.with_suffix(".gpukit-new")
        shutil.copyfile(lib, tmp)
        tmp.replace(dst_lib)


def nvml_cli(node: NodeSpec, *args: str) -> str:
    """`python -m gpukit.lab.nvml ARGS` against a node's mock GPUs (its profile and state)."""
    import sys

    r = root(node)
    proc = subprocess.run(
        [sys.executable, "-m", "gpukit.lab.nvml",
         "--profile", str(r / "etc/gpukit-lab/nvml/profile.yaml"),
         "--state-dir", str(r / "var/lib/gpukit-lab/nvml"), *args],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return proc.stdout


def gpu_uuids(node: NodeSpec) -> list[str]:
    """The UUIDs of a node's mock GPUs, in index order."""
    return [g["uuid"] for g in json.loads(nvml_cli(node, "status"))["gpus"]]
