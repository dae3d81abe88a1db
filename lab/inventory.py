"""The lab's Ansible inventory for the running lab instance.

`inventories/lab` is written for instance 0. Another instance gets a copy in its
state directory with its own node addresses, SSH key and kubeconfig; the group
and host variables (the declarations) are the same files.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from gpukit.lab.config import REPO_ROOT, LabSpec, state_dir
from gpukit.lab.controlplane import paths

LAB_INVENTORY = REPO_ROOT / "inventories" / "lab"


def for_instance(lab: LabSpec) -> Path:
    """Path of an inventory that reaches this lab instance's nodes."""
    if lab.instance == 0 and lab.node_names() == ["gpu-a100", "gpu-t4"]:
        return LAB_INVENTORY
    out = state_dir() / "inventory"
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(LAB_INVENTORY, out)
    hosts = yaml.safe_load((out / "hosts.yml").read_text())
    v = hosts["all"]["vars"]
    v["ansible_ssh_private_key_file"] = str(state_dir() / "ssh" / "id_ed25519")
    v["gpukit_kubeconfig"] = str(paths().admin_kubeconfig)
    groups = hosts["all"]["children"]["gpu_nodes"]["children"]
    for group in groups.values():
        for name, hv in (group.get("hosts") or {}).items():
            if name in lab.node_names():
                hv["ansible_host"] = lab.node(name).address(lab)
    (out / "hosts.yml").write_text(yaml.safe_dump(hosts, sort_keys=False))
    return out
