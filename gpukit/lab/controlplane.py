"""The lab's control plane on the host: etcd, apiserver, controller-manager, scheduler."""

from __future__ import annotations

import re
import shutil
import socket
import ssl
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from gpukit.lab import pki
from gpukit.lab.config import LabSpec, state_dir
from gpukit.lab.procs import ProcTable

COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")


class LabError(RuntimeError):
    """The lab could not do what was asked; the message says what to fix."""


@dataclass(frozen=True)
class Paths:
    root: Path

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.root / "kubeconfig"


def paths() -> Paths:
    return Paths(state_dir())


def etcd_binary() -> Path:
    found = shutil.which("etcd")
    if not found:
        raise LabError("etcd not found: install Debian's etcd-server (make deps does)")
    return Path(found)


def port_free(address: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((address, port))
        except OSError:
            return False
    return True


def make_pki(lab: LabSpec) -> pki.CA:
    p = paths().pki
    ca = pki.CA(p)
    ca.issue(
        p / "apiserver",
        "kube-apiserver",
        dns=("kubernetes", "kubernetes.default", "kubernetes.default.svc",
             "kubernetes.default.svc.cluster.local", "localhost"),
        ips=(lab.api_address, lab.host_address, "127.0.0.1"),
        server=True,
    )  # fmt: skip
    ca.issue(p / "apiserver-kubelet-client", "kube-apiserver-kubelet-client",
             organizations=("system:masters",), client=True)  # fmt: skip
    pki.service_account_keys(p)
    for name, cn, org in (
        ("admin", "gpukit-lab-admin", ("system:masters",)),
        ("controller-manager", "system:kube-controller-manager", ()),
        ("scheduler", "system:kube-scheduler", ()),
    ):
        crt, key = ca.issue(p / name, cn, organizations=org, client=True)
        target = paths().admin_kubeconfig if name == "admin" else p / f"{name}.kubeconfig"
        pki.kubeconfig(target, lab.server_url, ca.cert_path, crt, key, cn)
    return ca


def argv(lab: LabSpec, component: str, bindir: Path) -> list[str]:
    p = paths()
    k = p.pki
    etcd_url = f"http://127.0.0.1:{lab.etcd_client_port}"
    if component == "etcd":
        peer = f"http://127.0.0.1:{lab.etcd_peer_port}"
        return [
            str(etcd_binary()), "--name=lab", f"--data-dir={p.root / 'etcd'}",
            f"--listen-client-urls={etcd_url}", f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=lab={peer}", "--log-level=warn",
        ]  # fmt: skip
    if component == "kube-apiserver":
        return [
            str(bindir / component),
            f"--etcd-servers={etcd_url}",
            f"--bind-address={lab.api_address}", f"--advertise-address={lab.api_address}",
            f"--secure-port={lab.apiserver_port}",
            f"--service-cluster-ip-range={lab.service_cidr}",
            "--endpoint-reconciler-type=none",
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            "--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
            f"--client-ca-file={k / 'ca.crt'}",
            f"--tls-cert-file={k / 'apiserver.crt'}",
            f"--tls-private-key-file={k / 'apiserver.key'}",
            f"--kubelet-client-certificate={k / 'apiserver-kubelet-client.crt'}",
            f"--kubelet-client-key={k / 'apiserver-kubelet-client.key'}",
            f"--kubelet-certificate-authority={k / 'ca.crt'}",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={k / 'sa.pub'}",
            f"--service-account-signing-key-file={k / 'sa.key'}",
            "--allow-privileged=true", "--profiling=false", "--v=1",
        ]  # fmt: skip
    # The controller manager and the scheduler: each with its kubeconfig and secure port.
    if component == "kube-controller-manager":
        kc, port = k / "controller-manager.kubeconfig", lab.controller_manager_port
        own = [
            f"--service-account-private-key-file={k / 'sa.key'}",
            f"--root-ca-file={k / 'ca.crt'}", "--use-service-account-credentials=true",
            f"--cluster-signing-cert-file={k / 'ca.crt'}",
            f"--cluster-signing-key-file={k / 'ca.key'}",
            "--controllers=" + ",".join(["*", *(f"-{c}" for c in disabled_controllers(bindir))]),
        ]  # fmt: skip
    elif component == "kube-scheduler":
        kc, port, own = k / "scheduler.kubeconfig", lab.scheduler_port, []
    else:
        raise LabError(f"unknown control-plane component {component!r}")
    return [
        str(bindir / component),
        "--leader-elect=false", "--bind-address=127.0.0.1", "--profiling=false", "--v=1",
        f"--kubeconfig={kc}", f"--secure-port={port}",
        f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}", *own,
    ]  # fmt: skip


# Controllers the lab has no use for: it has no cloud, and each node brings its own pod range.
# Releases drop controllers (1.37 has no cloud ones any more): disable those the binary knows.
UNWANTED_CONTROLLERS = ("cloud-node-lifecycle", "service-lb-controller", "node-ipam-controller")


def disabled_controllers(bindir: Path) -> list[str]:
    """The unwanted controllers this kube-controller-manager knows (its --help lists them)."""
    import subprocess

    r = subprocess.run([str(bindir / "kube-controller-manager"), "--help"],
                       capture_output=True, text=True, timeout=30)  # fmt: skip
    known = re.search(r"All controllers: ([^\n]*)", r.stdout + r.stderr)
    names = {n.strip() for n in known.group(1).split(",")} if known else set()
    return [c for c in UNWANTED_CONTROLLERS if c in names]


def ports(lab: LabSpec) -> dict[str, tuple[str, int]]:
    return {
        "etcd": ("127.0.0.1", lab.etcd_client_port),
        "etcd-peer": ("127.0.0.1", lab.etcd_peer_port),
        "kube-apiserver": (lab.api_address, lab.apiserver_port),
        "kube-controller-manager": ("127.0.0.1", lab.controller_manager_port),
        "kube-scheduler": ("127.0.0.1", lab.scheduler_port),
    }


def start(lab: LabSpec, table: ProcTable, component: str, bindir: Path) -> None:
    owned = {"etcd": ("etcd", "etcd-peer")}.get(component, (component,))
    for key in owned:
        addr, port = ports(lab)[key]
        if not port_free(addr, port):
            raise LabError(
                f"{component}: port {addr}:{port} is in use by another program;"
                " stop it or change the lab's port (GPUKIT_LAB_* settings)"
            )
    table.start(component, argv(lab, component, bindir), paths().logs / f"{component}.log")


def _https_get(lab: LabSpec, path: str) -> tuple[int, str]:
    k = paths().pki
    ctx = ssl.create_default_context(cafile=str(k / "ca.crt"))
    ctx.load_cert_chain(str(k / "admin.crt"), str(k / "admin.key"))
    try:
        with urllib.request.urlopen(f"{lab.server_url}{path}", context=ctx, timeout=3) as r:
            return int(r.status), r.read().decode()
    except urllib.error.HTTPError as e:
        return int(e.code), e.read().decode(errors="replace")
    except (OSError, ssl.SSLError) as e:
        return 0, str(e)


def wait_ready(lab: LabSpec, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        code, body = _https_get(lab, "/readyz")
        if code == 200:
            return
        last = f"{code} {body[-300:]}"
        time.sleep(0.5)
    raise LabError(f"kube-apiserver not ready after {timeout:.0f}s: {last}; see {paths().logs}")


def server_version(lab: LabSpec) -> str:
    """The apiserver's gitVersion (e.g. v1.37.2), or "" when it cannot be read."""
    import json

    code, body = _https_get(lab, "/version")
    try:
        return str(json.loads(body)["gitVersion"]) if code == 200 else ""
    except (ValueError, KeyError, TypeError):
        return ""


def healthy(lab: LabSpec) -> bool:
    return _https_get(lab, "/readyz")[0] == 200
