"""The lab network: one bridge on the host and one network namespace per node.

All lab traffic stays between loopback, this bridge and these namespaces. The
apiserver's Service address is bound on the bridge, so in-cluster clients reach
it without kube-proxy and nothing routes off the machine.
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

from gpukit.lab.config import LabSpec, NodeSpec, load_spec


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def netns_name(node: NodeSpec, lab: LabSpec | None = None) -> str:
    return f"{(lab or load_spec()).prefix}-{node.name}"


def netns_path(node: NodeSpec, lab: LabSpec | None = None) -> Path:
    return Path("/run/netns") / netns_name(node, lab)


def _host_if(lab: LabSpec, node: NodeSpec) -> str:
    """The host end of the node's veth: `gk<instance>-<node>`, or, where that passes the
    kernel's 15 characters, a digest of the node name (cut names collided: gpu-a100-80 and
    gpu-a100-80-b, and the second node's setup deleted the first one's link)."""
    name = f"gk{lab.instance}-{node.name}"
    if len(name) <= 15:
        return name
    return f"gk{lab.instance}-{hashlib.sha256(node.name.encode()).hexdigest()[:10]}"


def _link_exists(name: str, netns: str | None = None) -> bool:
    args = ["-n", netns] if netns else []
    return _ip(*args, "link", "show", name, check=False).returncode == 0


def ensure_bridge(lab: LabSpec) -> None:
    if not _link_exists(lab.bridge):
        _ip("link", "add", lab.bridge, "type", "bridge")
    prefix = lab.network.prefixlen
    addrs = _ip("-o", "addr", "show", "dev", lab.bridge).stdout
    for addr in (f"{lab.host_address}/{prefix}", f"{lab.api_address}/32"):
        if f" {addr} " not in addrs:
            _ip("addr", "add", addr, "dev", lab.bridge)
    _ip("link", "set", lab.bridge, "up")


def ensure_node_netns(lab: LabSpec, node: NodeSpec) -> None:
    ns = netns_name(node, lab)
    if not netns_path(node, lab).exists():
        _ip("netns", "add", ns)
    host_if = _host_if(lab, node)
    if not _link_exists("eth0", ns):
        if _link_exists(host_if):
            _ip("link", "del", host_if)
        _ip("link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", ns)
    _ip("link", "set", host_if, "master", lab.bridge, "up")
    _ip("-n", ns, "link", "set", "lo", "up")
    addr = f"{node.address(lab)}/{lab.network.prefixlen}"
    if f" {addr} " not in _ip("-n", ns, "-o", "addr", "show", "dev", "eth0").stdout:
        _ip("-n", ns, "addr", "add", addr, "dev", "eth0")
    _ip("-n", ns, "link", "set", "eth0", "up")
    # Only the lab network and the apiserver's Service address are reachable from a node.
    _ip("-n", ns, "route", "replace", f"{lab.api_address}/32", "via", lab.host_address)
    _ip("-n", ns, "route", "replace", str(lab.service_cidr), "via", lab.host_address)


def remove_node_netns(lab: LabSpec, node: NodeSpec) -> None:
    host_if = _host_if(lab, node)
    if _link_exists(host_if):
        _ip("link", "del", host_if, check=False)
    if netns_path(node, lab).exists():
        _ip("netns", "del", netns_name(node, lab), check=False)


def remove_bridge(lab: LabSpec) -> None:
    if _link_exists(lab.bridge):
        _ip("link", "del", lab.bridge, check=False)
