"""What the lab's stand-in driver shows GPU consumers: sysfs, DMI, /proc/driver, /dev/nvidia-caps.

Rendered from a node's GPU profile (`gpukit/lab/profiles/`) and its mock NVML state, in the forms
that NVIDIA's consumers read (go-nvlib's nvpci, the container toolkit's nvcaps and information-file
parsers, GPU feature discovery's machine type):

- `/sys/devices/pci<domain>:<bus>/<root port>/[<switch ports>/]<0000:bb:dd.f>/`, laid out as a
  kernel lays it out (see `pci_paths`): vendor, device, subsystem_vendor, subsystem_device,
  class (`0x030200`, a 3D controller), revision, numa_node, local_cpulist, irq, resource, a
  256-byte config space (ids, class, a capability list without a vendor-specific one: no vGPU),
  `driver` -> `.../bus/pci/drivers/nvidia`; `/sys/bus/pci/devices/<bus id>` and
  `/sys/bus/pci/drivers/nvidia/<bus id>` are links to it (the bus lists the node's GPUs only,
  not their bridges);
- `/sys/class/dmi/id/product_name` (the profile's `machine`) and product_uuid;
- `/proc/driver/nvidia/version`, `/proc/driver/nvidia/gpus/<bus id>/information`,
  `/proc/driver/nvidia-caps/mig-minors`, `/proc/driver/nvidia/capabilities/...`;
- `/dev/nvidia-caps/nvidia-cap<N>` (major `CAPS_MAJOR`) for config, monitor and every minor of
  the node's GPUs.

The /proc/driver tree lives in the node's mock state directory (`proc-driver/`) and is written
by the mock library itself (gpukit/lab/nvml/src/caps.c): the static files when the node boots, the
capability files after every MIG change, whoever makes it. The functions here render the same
content (tests hold the two to each other) and the sysfs, DMI and /dev trees, which
`gpukit.lab.nodes` writes into the node's directory and gpukit/lab/node/boot.sh mounts.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

# The lab's major for /dev/nvidia-caps (a real driver's `nvidia-caps` line in /proc/devices).
CAPS_MAJOR = 509
NVIDIA_MAJOR = 195  # /dev/nvidia<N>, nvidiactl (255), nvidia-modeset (254)
CAPS_CONFIG_MINOR = 1
CAPS_MONITOR_MINOR = 2
MAX_GI = 15  # GPU instance ids 0..14
MAX_CI = 8  # compute instance ids 0..7
CAPS_PER_GI = 1 + MAX_CI
CAPS_PER_GPU = MAX_GI * CAPS_PER_GI
CAPS_TABLE_GPUS = 32  # mig-minors lists GPU minors 0..31 (more when a node has more)
# Must match gpukit/lab/nvml/src/mock.h (the library writes /proc/driver at boot).
IRQ_BASE = 120
DRIVER_BUILD_DATE = "Tue Jan  6 00:00:00 UTC 2026"
DRIVER_GCC = "gcc version 12.2.0 (Debian 12.2.0-14)"
DEFAULT_MACHINE = "Standard PC (Q35 + ICH9, 2009)"  # a profile without `machine:`

PCI_VENDOR_NVIDIA = 0x10DE
PCI_CLASS_3D = 0x030200
PCI_CLASS_VGA = 0x030000

MODE_CONFIG = 0o400
MODE_ACCESS = 0o444


def caps_minor(gpu_minor: int, gi: int, ci: int | None = None) -> int:
    """The /dev/nvidia-caps minor of a GPU instance (ci None) or compute instance: the
    driver's fixed table, 3 + 135 per GPU minor + 9 per GPU instance (+ 1 + ci)."""
    m = CAPS_CONFIG_MINOR + 2 + gpu_minor * CAPS_PER_GPU + gi * CAPS_PER_GI
    return m if ci is None else m + 1 + ci


def mig_minors(gpu_minors: Iterable[int] = ()) -> str:
    """/proc/driver/nvidia-caps/mig-minors."""
    n = max([CAPS_TABLE_GPUS, *(m + 1 for m in gpu_minors)])
    lines = [f"config {CAPS_CONFIG_MINOR}", f"monitor {CAPS_MONITOR_MINOR}"]
    for gpu in range(n):
        for gi in range(MAX_GI):
            lines.append(f"gpu{gpu}/gi{gi}/access {caps_minor(gpu, gi)}")
            lines += [
                f"gpu{gpu}/gi{gi}/ci{ci}/access {caps_minor(gpu, gi, ci)}" for ci in range(MAX_CI)
            ]
    return "\n".join(lines) + "\n"


def cap_file(minor: int, mode: int = MODE_ACCESS) -> str:
    """A capability file: the device node's minor and mode (decimal), as nvidia-caps prints."""
    return f"DeviceFileMinor: {minor}\nDeviceFileMode: {mode}\nDeviceFileModify: 1\n"


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    bus_id: str  # sysfs form: 0000:07:00.0
    minor: int
    device_id: int
    subsystem_id: int
    vbios: str
    numa_node: int  # -1: none
    cpus: str
    memory_mib: int
    mig_capable: bool
    pcie_switch: int = -1  # the profile's: GPUs with the same number share a PCIe switch


@dataclass(frozen=True)
class Profile:
    name: str
    seed: str
    driver_version: str
    machine: str
    gpus: tuple[Gpu, ...]


def sysfs_bus_id(pci_bus_id: str) -> str:
    """`00000000:07:00.0` or `07:00.0` (a profile's, NVML's) -> `0000:07:00.0` (sysfs, /proc)."""
    m = re.fullmatch(
        r"(?:([0-9A-Fa-f]{1,8}):)?([0-9A-Fa-f]{1,2}):([0-9A-Fa-f]{1,2})\.([0-7])", pci_bus_id
    )
    if not m:
        raise ValueError(f"not a PCI bus id: {pci_bus_id!r}")
    dom, bus, dev, fn = (int(x or "0", 16) for x in m.groups())
    return f"{dom:04x}:{bus:02x}:{dev:02x}.{fn}"


def _int(v: Any) -> int:
    return v if isinstance(v, int) else int(str(v), 0)


def load_profile(path: Path) -> Profile:
    data = yaml.safe_load(path.read_text())
    defaults = data.get("defaults") or {}
    cpus = {int(n["id"]): str(n["cpus"]) for n in data.get("numa_nodes") or []}
    gpus = []
    for i, entry in enumerate(data["gpus"]):
        g = {**defaults, **entry}
        numa = int(g["numa_node"]) if g.get("numa_node") is not None else -1
        gpus.append(
            Gpu(
                index=i,
                name=str(g["name"]),
                bus_id=sysfs_bus_id(str(g["pci_bus_id"])),
                minor=int(g.get("minor_number", i)),
                device_id=_int(g["pci_device_id"]),
                subsystem_id=_int(g.get("pci_subsystem_id", 0)),
                vbios=str(g.get("vbios_version", "00.00.00.00.00")),
                numa_node=numa,
                cpus=cpus.get(numa, ""),
                memory_mib=int(g["memory_mib"]),
                mig_capable=bool(g.get("mig_table")),
                pcie_switch=int(g["pcie_switch"]) if g.get("pcie_switch") is not None else -1,
            )
        )
    name = str(data["name"])
    return Profile(
        name=name,
        seed=str(data.get("seed") or name),
        driver_version=str(data["driver_version"]),
        machine=str(data.get("machine") or DEFAULT_MACHINE),
        gpus=tuple(gpus),
    )


# ---- /proc/driver ----


def version_file(driver_version: str) -> str:
    return (
        f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {driver_version}  {DRIVER_BUILD_DATE}\n"
        f"GCC version:  {DRIVER_GCC}\n"
    )


def information_file(gpu: Gpu, uuid_: str) -> str:
    return (
        f"Model: \t\t {gpu.name}\nIRQ:   \t\t {IRQ_BASE + gpu.index}\nGPU UUID: \t {uuid_}\n"
        f"Video BIOS: \t {gpu.vbios}\nBus Type: \t PCIe\nDMA Size: \t 47 bits\n"
        f"DMA Mask: \t 0x7fffffffffff\nBus Location: \t {gpu.bus_id}\n"
        f"Device Minor: \t {gpu.minor}\nGPU Excluded:\t No\n"
    )


def capabilities(profile: Profile, status: Mapping[str, Any]) -> dict[str, str]:
    """Files under /proc/driver/nvidia/capabilities (relative paths -> text) for the MIG state in
    a mock status (`python -m gpukit.lab.nvml status`); directories end with '/'."""
    out = {
        "mig/config": cap_file(CAPS_CONFIG_MINOR, MODE_CONFIG),
        "mig/monitor": cap_file(CAPS_MONITOR_MINOR, MODE_ACCESS),
    }
    for gpu, st in zip(profile.gpus, status["gpus"], strict=True):
        if not gpu.mig_capable:
            continue
        gis = (st.get("mig") or {}).get("gpu_instances", [])
        if not gis:
            out[f"gpu{gpu.minor}/mig/"] = ""  # an empty directory
        for gi in gis:
            out[f"gpu{gpu.minor}/mig/gi{gi['id']}/access"] = cap_file(
                caps_minor(gpu.minor, gi["id"])
            )
            for ci in gi["compute_instances"]:
                out[f"gpu{gpu.minor}/mig/gi{gi['id']}/ci{ci['id']}/access"] = cap_file(
                    caps_minor(gpu.minor, gi["id"], ci["id"])
                )
    return out


def proc_driver(profile: Profile, status: Mapping[str, Any]) -> dict[str, str]:
    """Every file of the node's /proc/driver (relative paths -> text; directories end in '/')."""
    out = {
        "nvidia/version": version_file(profile.driver_version),
        "nvidia-caps/mig-minors": mig_minors(g.minor for g in profile.gpus),
    }
    for gpu, st in zip(profile.gpus, status["gpus"], strict=True):
        out[f"nvidia/gpus/{gpu.bus_id}/information"] = information_file(gpu, st["uuid"])
    out.update({f"nvidia/capabilities/{k}": v for k, v in capabilities(profile, status).items()})
    return out


def read_tree(root: Path) -> dict[str, str]:
    """A rendered tree as proc_driver/capabilities return it (to compare with them)."""
    out: dict[str, str] = {}
    for dirpath, dirs, files in os.walk(root):
        rel = Path(dirpath).relative_to(root)
        if not files and not dirs and rel != Path("."):
            out[f"{rel}/"] = ""
        for f in files:
            out[str(rel / f) if rel != Path(".") else f] = (Path(dirpath) / f).read_text()
    return out


# ---- sysfs, DMI, /dev ----


@dataclass(frozen=True)
class Link:
    target: str


@dataclass(frozen=True)
class CharDev:
    major: int
    minor: int
    mode: int


Entry = bytes | Link | CharDev


def _bars(gpu: Gpu) -> list[tuple[int, int, int]]:
    """sysfs `resource` lines 0-5 (start, end, flags): BAR0 registers (16 MiB), BAR1 the
    framebuffer aperture (memory rounded up to a power of two, 64-bit prefetchable), BAR3
    (32 MiB, 64-bit prefetchable)."""
    bus = int(gpu.bus_id.split(":")[1], 16)
    dom = int(gpu.bus_id.split(":")[0], 16)
    mmio = 0x80000000 + (bus << 24) % 0x40000000
    aperture = 1 << max(28, (gpu.memory_mib * 2**20 - 1).bit_length())
    high = (0x20000000000 + ((dom << 8) | bus) * 2**37) & ~(aperture - 1)
    return [  # a 64-bit BAR takes two registers: its second resource line is empty
        (mmio, mmio + 0xFFFFFF, 0x40200),
        (high, high + aperture - 1, 0x14220C),
        (0, 0, 0),
        (high + aperture, high + aperture + 0x1FFFFFF, 0x14220C),
        (0, 0, 0),
        (0, 0, 0),
    ]


def config_space(gpu: Gpu) -> bytes:
    """256 bytes: ids, command/status (capability list), class, BARs, subsystem ids, a
    capability list of power management (0x60) -> MSI (0x68) -> PCI Express (0x78), and no
    vendor-specific capability (a GPU, not a vGPU)."""
    c = bytearray(256)

    def put(off: int, value: int, size: int) -> None:
        c[off : off + size] = value.to_bytes(size, "little")

    put(0x00, PCI_VENDOR_NVIDIA, 2)
    put(0x02, gpu.device_id >> 16, 2)
    put(0x04, 0x0406, 2)  # memory space, bus master, INTx disabled
    put(0x06, 0x0010, 2)  # capability list present
    put(0x08, 0xA1, 1)  # revision
    put(0x09, PCI_CLASS_3D, 3)  # prog-if, subclass, class
    for i, (start, _end, flags) in enumerate(_bars(gpu)):
        if start:
            put(0x10 + 4 * i, (start & 0xFFFFFFF0) | (flags & 0xF), 4)
            if flags & 0x4:  # 64-bit: the upper half in the next register
                put(0x14 + 4 * i, start >> 32, 4)
    put(0x2C, gpu.subsystem_id & 0xFFFF, 2)
    put(0x2E, gpu.subsystem_id >> 16, 2)
    put(0x34, 0x60, 1)
    put(0x3C, IRQ_BASE + gpu.index, 1)
    put(0x3D, 1, 1)  # INTA
    put(0x60, 0x6801, 2)  # PM, next 0x68
    put(0x62, 0x0003, 2)
    put(0x68, 0x7805, 2)  # MSI, next 0x78
    put(0x78, 0x0010, 2)  # PCI Express, end of list
    put(0x7A, 0x0002, 2)  # endpoint
    return bytes(c)


PCI_CLASS_BRIDGE = 0x060400  # PCI-to-PCI bridge: root ports, switch ports
ROOT_PORT_SLOT = 0x1C  # <root bus>:1c.0, a PCH root port's slot (off a VM's low slots)
# The switch: a Broadcom PEX 88096 (PLX's vendor id), as on HGX baseboards.
SWITCH_VENDOR, SWITCH_DEVICE = 0x10B5, 0xC010
ROOT_PORT_VENDOR, ROOT_PORT_DEVICE = 0x8086, 0x347A  # an Ice Lake-SP root port


@dataclass(frozen=True)
class Bridge:
    path: str  # under /sys/devices: pci<dom>:<bus>/<port bus id>[/...]
    vendor: int
    device: int


def pci_paths(profile: Profile) -> tuple[dict[str, str], list[Bridge]]:
    """Where each GPU sits under /sys/devices, following the profile's topology as the mock
    NVML answers it (nvmlDeviceGetTopologyCommonAncestor): GPUs of one `pcie_switch` share a
    switch (SINGLE) under one root port; each switch, and each GPU without one, has a host
    bridge of its own, `pci<domain>:<root bus>` (two of them are NODE or SYSTEM apart, never
    one bridge). Bus numbers as a kernel assigns them below the GPUs' own: a GPU alone sits
    right under its root port (root bus = its bus - 1), a switch takes the root port's
    secondary bus (upstream port) and the next (downstream ports, one per GPU). -> (GPU bus
    id: path, the bridges); ValueError when the profile's bus numbers leave no room."""
    groups: dict[tuple[str, int | str], list[Gpu]] = {}
    for gpu in profile.gpus:
        domain = gpu.bus_id.split(":")[0]
        key: int | str = gpu.pcie_switch if gpu.pcie_switch >= 0 else f"own{gpu.index}"
        groups.setdefault((domain, key), []).append(gpu)
    paths: dict[str, str] = {}
    bridges: list[Bridge] = []
    used: dict[str, int] = {}  # domain: highest bus taken so far
    for (domain, _key), gpus in sorted(groups.items(), key=lambda kv: (
            kv[0][0], min(_bus(g) for g in kv[1]))):
        gpus = sorted(gpus, key=_bus)
        switched = len(gpus) > 1  # a "switch" of one GPU changes no common ancestor
        root = _bus(gpus[0]) - (3 if switched else 1)
        if root < 0 or root <= used.get(domain, -1):
            raise ValueError(f"profile {profile.name}: pci_bus_id {gpus[0].bus_id} leaves no bus "
                             f"for its root port{' and switch' if switched else ''}")
        used[domain] = _bus(gpus[-1])
        top = f"pci{domain}:{root:02x}"
        port = f"{top}/{domain}:{root:02x}:{ROOT_PORT_SLOT:02x}.0"
        bridges.append(Bridge(port, ROOT_PORT_VENDOR, ROOT_PORT_DEVICE))
        if not switched:
            paths[gpus[0].bus_id] = f"{port}/{gpus[0].bus_id}"
            continue
        upstream = f"{port}/{domain}:{root + 1:02x}:00.0"
        bridges.append(Bridge(upstream, SWITCH_VENDOR, SWITCH_DEVICE))
        for slot, gpu in enumerate(gpus):
            downstream = f"{upstream}/{domain}:{root + 2:02x}:{slot:02x}.0"
            bridges.append(Bridge(downstream, SWITCH_VENDOR, SWITCH_DEVICE))
            paths[gpu.bus_id] = f"{downstream}/{gpu.bus_id}"
    return paths, bridges


def _bus(gpu: Gpu) -> int:
    return int(gpu.bus_id.split(":")[1], 16)


def pci_tree(profile: Profile) -> dict[str, Entry]:
    """/sys: `devices/pci<domain>:<bus>/.../<bus id>/...` (each GPU's files, its bridges'
    ids), `bus/pci/devices/<bus id>` and `bus/pci/drivers/nvidia/<bus id>` linking to them
    (relative paths under /sys, relative links, as a kernel's)."""
    out: dict[str, Entry] = {}
    paths, bridges = pci_paths(profile)
    for bridge in bridges:
        for k, v in (("vendor", f"0x{bridge.vendor:04x}"), ("device", f"0x{bridge.device:04x}"),
                     ("class", f"0x{PCI_CLASS_BRIDGE:06x}")):
            out[f"devices/{bridge.path}/{k}"] = (v + "\n").encode()
    for gpu in profile.gpus:
        d = f"devices/{paths[gpu.bus_id]}"
        files = {
            "vendor": f"0x{PCI_VENDOR_NVIDIA:04x}",
            "device": f"0x{gpu.device_id >> 16:04x}",
            "subsystem_vendor": f"0x{gpu.subsystem_id & 0xFFFF:04x}",
            "subsystem_device": f"0x{gpu.subsystem_id >> 16:04x}",
            "class": f"0x{PCI_CLASS_3D:06x}",
            "revision": "0xa1",
            "numa_node": str(gpu.numa_node),
            "local_cpulist": gpu.cpus,
            "irq": str(IRQ_BASE + gpu.index),
            "enable": "1",
            "current_link_width": "16",
            "resource": "\n".join(
                f"0x{s:016x} 0x{e:016x} 0x{f:016x}" for s, e, f in [*_bars(gpu), *[(0, 0, 0)] * 7]
            ),
        }
        for k, v in files.items():
            out[f"{d}/{k}"] = (v + "\n").encode()
        out[f"{d}/config"] = config_space(gpu)
        up = "../" * len(d.split("/"))  # from the device's directory to /sys
        out[f"{d}/driver"] = Link(f"{up}bus/pci/drivers/nvidia")
        out[f"bus/pci/devices/{gpu.bus_id}"] = Link(f"../../../{d}")
        out[f"bus/pci/drivers/nvidia/{gpu.bus_id}"] = Link(f"../../../../{d}")
    return out


def dmi_tree(profile: Profile) -> dict[str, Entry]:
    """/sys/class/dmi/id: product_name (GFD's nvidia.com/gpu.machine), product_uuid."""
    node_uuid = uuid.uuid5(uuid.NAMESPACE_URL, f"gpukit-lab:{profile.seed}")
    return {
        "product_name": (profile.machine + "\n").encode(),
        "product_uuid": (str(node_uuid) + "\n").encode(),
    }


def caps_devices(profile: Profile) -> dict[str, Entry]:
    """/dev/nvidia-caps: config (0400), monitor and every GPU/compute instance minor of the
    node's GPUs (0444), as the MIG capability files name them."""
    out: dict[str, Entry] = {
        f"nvidia-cap{CAPS_CONFIG_MINOR}": CharDev(CAPS_MAJOR, CAPS_CONFIG_MINOR, MODE_CONFIG),
        f"nvidia-cap{CAPS_MONITOR_MINOR}": CharDev(CAPS_MAJOR, CAPS_MONITOR_MINOR, MODE_ACCESS),
    }
    for gpu in profile.gpus:
        for gi in range(MAX_GI):
            for ci in [None, *range(MAX_CI)]:
                m = caps_minor(gpu.minor, gi, ci)
                out[f"nvidia-cap{m}"] = CharDev(CAPS_MAJOR, m, MODE_ACCESS)
    return out


def sync_tree(root: Path, entries: Mapping[str, Entry]) -> None:
    """Make root hold exactly these entries, changing only what differs (a running node has
    the tree mounted: files are replaced by rename, never rewritten in place)."""
    root.mkdir(parents=True, exist_ok=True)
    wanted_dirs = {root}
    for rel in entries:
        p = root / rel
        wanted_dirs.update(p.parents)
    for rel, entry in entries.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        try:
            st: os.stat_result | None = p.lstat()
        except FileNotFoundError:
            st = None
        if isinstance(entry, Link):
            if st and stat.S_ISLNK(st.st_mode) and os.readlink(p) == entry.target:
                continue
            tmp = p.with_name(p.name + ".gpukit-new")
            tmp.unlink(missing_ok=True)
            tmp.symlink_to(entry.target)
        elif isinstance(entry, CharDev):
            dev = os.makedev(entry.major, entry.minor)
            if (
                st
                and stat.S_ISCHR(st.st_mode)
                and st.st_rdev == dev
                and stat.S_IMODE(st.st_mode) == entry.mode
            ):
                continue
            tmp = p.with_name(p.name + ".gpukit-new")
            tmp.unlink(missing_ok=True)
            os.mknod(tmp, stat.S_IFCHR | entry.mode, dev)
            tmp.chmod(entry.mode)
        else:
            if st and stat.S_ISREG(st.st_mode) and p.read_bytes() == entry:
                continue
            tmp = p.with_name(p.name + ".gpukit-new")
            tmp.unlink(missing_ok=True)
            tmp.write_bytes(entry)
            tmp.chmod(0o444)
        if st and stat.S_ISDIR(st.st_mode):
            shutil.rmtree(p)
        tmp.replace(p)
    for dirpath, dirs, files in os.walk(root, topdown=False):
        here = Path(dirpath)
        for name in files + [d for d in dirs if (here / d).is_symlink()]:
            rel = str((here / name).relative_to(root))
            if rel not in entries:
                (here / name).unlink()
        for d in dirs:
            q = here / d
            if not q.is_symlink() and q.is_dir() and q not in wanted_dirs:
                q.rmdir()


def render_node(profile_path: Path, surface: Path) -> None:
    """The node's static hardware trees under `surface` (the node's directory, outside its
    root): sys/devices/pci*, sys/bus/pci/{devices,drivers}, sys/class/dmi/id,
    dev/nvidia-caps."""
    profile = load_profile(profile_path)
    tree = pci_tree(profile)
    for part in ("devices", "bus/pci"):
        sync_tree(surface / "sys" / part, {k[len(part) + 1:]: v for k, v in tree.items()
                                           if k.startswith(part + "/")})
    sync_tree(surface / "sys/class/dmi/id", dmi_tree(profile))
    sync_tree(surface / "dev/nvidia-caps", caps_devices(profile))
