"""The lab's shape: where it keeps state, which nodes it runs, which ports it uses."""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
PROFILES_DIR = REPO_ROOT / "gpukit" / "lab" / "profiles"
# The stack the lab runs by default: the newest Kubernetes release on containerd 2.
# Supported: Kubernetes 1.35 to 1.37; containerd 1.7 only with 1.35 (from 1.36 the kubelet
# needs containerd 2).
DEFAULT_K8S_VERSION = "v1.37.2"
DEFAULT_CONTAINERD_VERSION = "v2.2.9"
SUPPORTED_K8S_MINORS = (35, 36, 37)
K8S_VERSION = os.environ.get("GPUKIT_K8S_VERSION", DEFAULT_K8S_VERSION)
CONTAINERD_VERSION = os.environ.get("GPUKIT_CONTAINERD_VERSION", DEFAULT_CONTAINERD_VERSION)
_RELEASE = re.compile(r"^v(\d+)\.(\d+)\.(\d+)$")

_NODE_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$")


class LabConfigError(ValueError):
    """A lab setting is wrong; the message names the setting and its value."""


def cache_dir() -> Path:
    return Path(os.environ.get("GPUKIT_CACHE", Path.home() / ".cache" / "gpukit"))


def instance() -> int:
    """Which lab on this machine (GPUKIT_LAB_INSTANCE, 0-9): several can run side by side."""
    raw = os.environ.get("GPUKIT_LAB_INSTANCE", "0")
    if not raw.isdigit() or int(raw) > 9:
        raise LabConfigError(f"GPUKIT_LAB_INSTANCE: {raw!r} is not a number from 0 to 9")
    return int(raw)


def state_dir() -> Path:
    default = "/var/lib/gpukit-lab" + (f"-{instance()}" if instance() else "")
    return Path(os.environ.get("GPUKIT_LAB_DIR", default))


@dataclass(frozen=True)
class NodeSpec:
    name: str
    profile: str
    index: int

    def address(self, lab: LabSpec) -> str:
        return str(lab.network.network_address + 10 + self.index)


@dataclass(frozen=True)
class LabSpec:
    nodes: tuple[NodeSpec, ...]
    instance: int = 0
    apiserver_port: int = 443
    k8s_version: str = K8S_VERSION
    containerd_version: str = CONTAINERD_VERSION
    etcd_client_port_override: int | None = None
    extra: dict[str, str] = field(default_factory=dict)

    # Everything a lab claims on the machine derives from its instance number.
    @property
    def network(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(f"10.244.{77 + self.instance}.0/24")

    @property
    def service_cidr(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(f"198.18.{self.instance}.0/24")

    @property
    def pod_network(self) -> ipaddress.IPv4Network:
        """Pods' addresses; each node bridges its own /24 inside its own namespace."""
        return ipaddress.IPv4Network(f"10.{100 + self.instance}.0.0/16")

    def pod_cidr(self, node: NodeSpec) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(f"10.{100 + self.instance}.{node.index}.0/24")

    @property
    def bridge(self) -> str:
        return f"gpukit{self.instance}"

    @property
    def prefix(self) -> str:
        """Names of host-side objects (netns, veths, cgroups) start with this."""
        return "gpukit" if self.instance == 0 else f"gpukit{self.instance}"

    @property
    def etcd_client_port(self) -> int:
        return self.etcd_client_port_override or 23790 + 10 * self.instance

    @property
    def etcd_peer_port(self) -> int:
        return 23795 + 10 * self.instance

    @property
    def controller_manager_port(self) -> int:
        return 10257 + 100 * self.instance

    @property
    def scheduler_port(self) -> int:
        return 10259 + 100 * self.instance

    @property
    def host_address(self) -> str:
        return str(self.network.network_address + 1)

    @property
    def api_address(self) -> str:
        # The `kubernetes` Service's ClusterIP; bound on the lab bridge so in-cluster
        # clients reach the apiserver without kube-proxy and without leaving the machine.
        return str(self.service_cidr.network_address + 1)

    @property
    def server_url(self) -> str:
        return f"https://{self.api_address}:{self.apiserver_port}"

    def node(self, name: str) -> NodeSpec:
        for n in self.nodes:
            if n.name == name:
                return n
        raise LabConfigError(f"lab node {name!r} is not defined (nodes: {self.node_names()})")

    def node_names(self) -> list[str]:
        return [n.name for n in self.nodes]


DEFAULT_NODES = "gpu-a100=a100-sxm4-40gb-x8,gpu-t4=t4-x2"


def available_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILES_DIR.glob("*.yaml") if not p.stem.startswith("_"))


def parse_nodes(text: str) -> tuple[NodeSpec, ...]:
    """Parse `name=profile,name=profile` (the GPUKIT_LAB_NODES setting)."""
    nodes: list[NodeSpec] = []
    profiles = available_profiles()
    for i, item in enumerate(filter(None, (s.strip() for s in text.split(",")))):
        name, sep, profile = item.partition("=")
        if not sep:
            raise LabConfigError(f"GPUKIT_LAB_NODES: entry {item!r} is not name=profile")
        if not _NODE_NAME.match(name):
            raise LabConfigError(f"GPUKIT_LAB_NODES: node name {name!r} is not a DNS label")
        if profile not in profiles:
            raise LabConfigError(
                f"GPUKIT_LAB_NODES: node {name!r} has unknown profile {profile!r}"
                f" (known: {', '.join(profiles)})"
            )
        if any(n.name == name for n in nodes):
            raise LabConfigError(f"GPUKIT_LAB_NODES: node name {name!r} appears twice")
        nodes.append(NodeSpec(name=name, profile=profile, index=i + 1))
    if not nodes:
        raise LabConfigError("GPUKIT_LAB_NODES: no nodes given")
    return tuple(nodes)


def check_versions(k8s: str, containerd: str) -> None:
    """Refuse a stack the lab does not support, naming the setting and its value."""
    m = _RELEASE.match(k8s)
    if not m or int(m.group(1)) != 1 or int(m.group(2)) not in SUPPORTED_K8S_MINORS:
        minors = ", ".join(f"1.{v}" for v in SUPPORTED_K8S_MINORS)
        raise LabConfigError(
            f"GPUKIT_K8S_VERSION: {k8s!r} is not a supported Kubernetes release ({minors},"
            " as v1.MINOR.PATCH)"
        )
    c = _RELEASE.match(containerd)
    if not c or ((c.group(1), c.group(2)) != ("1", "7") and int(c.group(1)) != 2):
        raise LabConfigError(
            f"GPUKIT_CONTAINERD_VERSION: {containerd!r} is not a containerd 1.7.x or 2.x release"
        )
    if c.group(1) == "1" and int(m.group(2)) >= 36:
        raise LabConfigError(
            f"GPUKIT_CONTAINERD_VERSION: {containerd!r} with Kubernetes {k8s}: from 1.36 the"
            " kubelet needs containerd 2.x (1.7 runs only with 1.35)"
        )


def load_spec() -> LabSpec:
    check_versions(K8S_VERSION, CONTAINERD_VERSION)
    return LabSpec(
        nodes=parse_nodes(os.environ.get("GPUKIT_LAB_NODES", DEFAULT_NODES)), instance=instance()
    )
