#!/usr/bin/python
# ruff: noqa: E402  (Ansible's layout: documentation strings before imports)
"""gpukit.gpu.wheelhouse: gpukit's wheels for nodes, built on the controller
(a thin adapter over gpukit.provision.wheelhouse)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: wheelhouse
short_description: Build (or reuse) the archive of gpukit's wheels for the nodes
description:
  - Takes gpukit's wheel, downloads the wheels of the dependencies it declares for the nodes'
    Python and platform, and packs them into one archive keyed by content, under the cache
    directory. Unchanged gpukit gives the same archive.
  - gpukit's wheel is C(wheel) when given (e.g. the release the controller installed), else
    built from the checkout the controller's gpukit runs from, else re-made from the installed
    gpukit package (a controller that installed gpukit from its wheel needs no checkout).
  - Runs on the controller (C(delegate_to localhost)) with the controller's gpukit.
  - Or reads a prebuilt archive (C(archive)), e.g. from CI, and builds nothing.
version_added: "0.1.0"
author: gpukit
options:
  python_version:
    description: The nodes' Python (major.minor).
    type: str
    required: true
  platforms:
    description: pip platform tags of the nodes.
    type: list
    elements: str
    default: [manylinux2014_x86_64, manylinux_2_28_x86_64]
  cache_dir:
    description: Cache directory (default C($GPUKIT_CACHE) or C(~/.cache/gpukit)).
    type: path
  archive:
    description: A prebuilt wheelhouse archive to use instead of building.
    type: path
  wheel:
    description: gpukit's wheel (a file on the controller) to put in the archive.
    type: path
notes:
  - A local cache: reports changed=false.
"""

EXAMPLES = r"""
- name: Build gpukit's wheelhouse
  gpukit.gpu.wheelhouse:
    python_version: "3.11"
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
key:
  description: Content key of the archive.
  returned: always
  type: str
archive:
  description: Path of the archive on the controller.
  returned: always
  type: str
requirement:
  description: What to install from it (C(gpukit==<version>)).
  returned: always
  type: str
"""

import os

from ansible_collections.gpukit.gpu.plugins.module_utils import gpukit_common as gk


def main():
    module = gk.ansible_module({
        "python_version": {"type": "str", "required": True},
        "platforms": {
            "type": "list",
            "elements": "str",
            "default": ["manylinux2014_x86_64", "manylinux_2_28_x86_64"],
        },
        "cache_dir": {"type": "path"},
        "archive": {"type": "path"},
        "wheel": {"type": "path"},
    })
    from pathlib import Path

    from gpukit.provision import wheelhouse

    p = module.params
    try:
        if p["archive"]:
            wh = wheelhouse.load(Path(p["archive"]))
        else:
            cache = (
                p["cache_dir"]
                or os.environ.get("GPUKIT_CACHE")
                or os.path.expanduser("~/.cache/gpukit")
            )
            wheel = Path(p["wheel"]) if p["wheel"] else None
            wh = wheelhouse.build(Path(cache), p["python_version"], p["platforms"], wheel=wheel)
    except wheelhouse.WheelhouseError as e:
        module.fail_json(msg=str(e))
    module.exit_json(changed=False, **wh.as_dict())


if __name__ == "__main__":
    main()
