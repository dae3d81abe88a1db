"""A GPU's PCIe root complex (`resource.kubernetes.io/pcieRoot`) read from sysfs, as Kubernetes'
deviceattribute.GetPCIeRootAttributeByPCIBusID reads it: `<sysfs>/bus/pci/devices/<bus id>` is
the kernel's link to `<sysfs>/devices/pci<domain>:<bus>/<ports...>/<bus id>`; the root is the
first component under `devices/`. The link is read, not followed (a container's view of the
host's sysfs resolves it the same way). Anything else (no link, a target outside
`devices/pci*` or not ending in the bus id) says nothing: no attribute, never a guess, and one
log line per GPU, not one per rescan.
"""

from __future__ import annotations

import logging
import os
import posixpath
import re
import threading

from gpukit.contracts.dra import PCIE_ROOT_ATTRIBUTE

log = logging.getLogger(__name__)

_BUS_ID = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]$")
_ROOT = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")
_said: set[tuple[str, str]] = set()
_said_lock = threading.Lock()


class Unknown(Exception):
    """sysfs cannot tell this device's root complex (the message says why)."""


def read(bus_id: str, sysfs_root: str) -> str:
    """`pci<domain>:<bus>` for the device at `bus_id` (sysfs form, `0000:07:00.0`); Unknown
    when sysfs cannot tell."""
    if not _BUS_ID.match(bus_id):
        raise Unknown(f"PCI bus id {bus_id!r} is not of the form 0000:07:00.0")
    link = posixpath.join(sysfs_root, "bus/pci/devices", bus_id)
    try:
        target = os.readlink(link)
    except OSError as exc:  # absent, or a directory (no kernel's layout)
        raise Unknown(f"{link} is not a link into {sysfs_root}/devices: {exc.strerror}") from None
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(link), target))
    devices = posixpath.normpath(posixpath.join(sysfs_root, "devices")) + "/"
    parts = resolved[len(devices):].split("/") if resolved.startswith(devices) else []
    if len(parts) < 2 or not _ROOT.match(parts[0]) or parts[-1] != bus_id:
        raise Unknown(f"{link} links to {target}, not to {devices}pci<domain>:<bus>/.../{bus_id}")
    return parts[0]


def lookup(bus_id: str, sysfs_root: str) -> str | None:
    """`read`, or None after logging why (once per bus id and reason)."""
    try:
        return read(bus_id, sysfs_root)
    except Unknown as exc:
        key = (bus_id, str(exc))
        with _said_lock:
            first = key not in _said
            _said.add(key)
        if first:
            log.warning("no %s for GPU %s: %s", PCIE_ROOT_ATTRIBUTE, bus_id, exc)
        return None
