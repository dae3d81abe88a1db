"""An inventory of N simulated GPU hosts: the lab's groups and declarations, more hosts.

Hosts take the profiles in turn (the lab's mix by default); each sits in its profile's group
(gpukit.lab.inventory.group_of) with the lab's group_vars, and gets an address in a range no
lab uses (the simulated hosts are never reached: the suite runs with --no-host against them).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from gpukit.lab.config import available_profiles
from gpukit.lab.inventory import LAB_INVENTORY, PROFILE_GROUPS, group_of, profile_declaration

DEFAULT_MIX = ("a100-sxm4-40gb-x8", "a100-80gb-x4", "h100-80gb-x8", "t4-x2")
# Documentation range of RFC 5737 is too small for 500 hosts; 100.64/10 (shared address
# space) is never a lab's: the lab uses 10.244.x and 198.18.x.
ADDRESSES = ipaddress.IPv4Network("100.64.0.0/16")
MAX_HOSTS = 60000


class FleetError(ValueError):
    """A fleet setting is wrong; the message names it and its value."""


def host_name(i: int) -> str:
    return f"sim-{i:04d}"


def generate(
    out: Path, count: int, mix: Sequence[str] = DEFAULT_MIX, kubeconfig: Path | None = None
) -> Path:
    """Write hosts.yml and group_vars for `count` simulated hosts under `out` (their cluster:
    `kubeconfig`, else the lab inventory's); returns `out`."""
    if not 1 <= count <= MAX_HOSTS:
        raise FleetError(f"hosts: {count!r} is not a number of hosts from 1 to {MAX_HOSTS}")
    unknown = [p for p in mix if p not in available_profiles()]
    if not mix or unknown:
        raise FleetError(
            f"profiles: {', '.join(unknown) or '(none)'} not among the lab's"
            f" profiles ({', '.join(available_profiles())})"
        )
    lab_hosts = yaml.safe_load((LAB_INVENTORY / "hosts.yml").read_text())
    groups: dict[str, Any] = {}
    for i in range(count):
        profile = mix[i % len(mix)]
        group = groups.setdefault(group_of(profile), {"hosts": {}})
        group["hosts"][host_name(i + 1)] = {"ansible_host": str(ADDRESSES.network_address + 10 + i)}
    settings = dict(lab_hosts["all"]["vars"])
    if kubeconfig is not None:
        settings["gpukit_kubeconfig"] = str(kubeconfig)
    doc = {"all": {"vars": settings, "children": {"gpu_nodes": {"children": groups}}}}
    (out / "group_vars").mkdir(parents=True, exist_ok=True)
    for src in sorted((LAB_INVENTORY / "group_vars").glob("*.yml")):
        (out / "group_vars" / src.name).write_text(src.read_text())
    for profile in sorted(set(mix) - set(PROFILE_GROUPS)):
        (out / "group_vars" / f"{group_of(profile)}.yml").write_text(
            yaml.safe_dump(profile_declaration(profile), sort_keys=False)
        )
    (out / "hosts.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return out
