#!/usr/bin/python
# ruff: noqa: E402  (Ansible's layout: documentation strings before imports)
"""gpukit.gpu.driver_plan: the apt plan to the declared NVIDIA driver (gpukit.provision.driver)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: driver_plan
short_description: Plan the NVIDIA driver packages of a Debian/Ubuntu node
description:
  - Reads the installed packages (dpkg-query) and the versions apt knows (apt-cache madison)
    and returns what to install, with exact versions of the declared branch, and what to
    remove (other branches and flavours), plus the branch pin's content.
  - Plans from the declared branch, not from apt's current pin, so check mode reports a
    branch switch correctly. Changes nothing.
version_added: "0.1.0"
author: gpukit
options:
  branch:
    description: Driver branch, e.g. C(550).
    type: str
    required: true
  kernel_modules:
    description: Kernel module flavour.
    type: str
    choices: [open, proprietary]
    default: open
  channel:
    description: Package source (see gpukit.provision.driver).
    type: str
    choices: [cuda, ubuntu, lab]
    default: cuda
  persistenced:
    description: Also install the persistence daemon.
    type: bool
    default: true
  version:
    description: An exact driver version within the branch (default the newest).
    type: str
  repo_configured:
    description: False when the repository is not configured yet (check mode on a new node);
      unknown packages are then planned without a version instead of failing.
    type: bool
    default: true
"""

EXAMPLES = r"""
- name: Plan the driver
  gpukit.gpu.driver_plan:
    branch: "550"
    kernel_modules: open
    channel: lab
  register: plan
"""

RETURN = r"""
install:
  description: apt package arguments, C(name=version).
  returned: always
  type: list
  elements: str
remove:
  description: Installed driver packages that are not wanted.
  returned: always
  type: list
  elements: str
summary:
  description: The planned changes in words.
  returned: always
  type: list
  elements: str
driver_version:
  description: The upstream driver version the node will have.
  returned: always
  type: str
pin:
  description: The apt preferences file content.
  returned: always
  type: str
problems:
  description: Packages without a matching version.
  returned: always
  type: list
  elements: str
"""

from ansible_collections.gpukit.gpu.plugins.module_utils import gpukit_common as gk


def main():
    module = gk.ansible_module({
        "branch": {"type": "str", "required": True},
        "kernel_modules": {
            "type": "str",
            "choices": ["open", "proprietary"],
            "default": "open",
        },
        "channel": {"type": "str", "choices": ["cuda", "ubuntu", "lab"], "default": "cuda"},
        "persistenced": {"type": "bool", "default": True},
        "version": {"type": "str"},
        "repo_configured": {"type": "bool", "default": True},
    })
    from gpukit.provision import driver

    p = module.params
    try:
        spec = driver.DriverSpec(
            branch=p["branch"],
            kernel_modules=p["kernel_modules"],
            family="debian",
            channel=p["channel"],
            persistenced=p["persistenced"],
            version=p["version"] or None,
        )
    except driver.DriverSpecError as e:
        module.fail_json(msg=str(e))
    env = {"LC_ALL": "C"}
    rc, out, err = module.run_command(
        ["dpkg-query", "-W", "-f=${Package} ${Version} ${db:Status-Abbrev}\n"], environ_update=env
    )
    if rc not in (0, 1):
        module.fail_json(msg=f"dpkg-query failed: {err.strip()}")
    installed = driver.parse_dpkg_query(out)
    names = spec.packages()
    rc, out, err = module.run_command(["apt-cache", "madison", *names], environ_update=env)
    available = driver.parse_madison(out)
    plan = driver.plan_apt(spec, installed, available, repo_configured=p["repo_configured"])
    module.exit_json(
        changed=False,
        install=list(plan.install),
        remove=list(plan.remove),
        summary=plan.summary(),
        would_change=plan.changed,
        driver_version=plan.driver_version,
        pin=plan.pin,
        problems=list(plan.problems),
        installed={k: v for k, v in installed.items() if k in names or k in plan.remove},
    )


if __name__ == "__main__":
    main()
