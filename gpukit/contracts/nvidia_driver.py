"""NVIDIA's driver packages, as its channels name them, and what a declared driver must be:
the branch, kernel module flavour, channel and exact version the inventory's `nvidia_driver_*`
variables give (`DriverSpec`). Shared by the declaration model (which refuses what the
`nvidia_driver` role would) and provisioning (which plans the packages); the plan itself is
`gpukit.provision.driver`.

Channels (where the packages come from; package names differ; <b> is the branch):
* `cuda` (Debian, Ubuntu): NVIDIA's CUDA repository; `nvidia-driver` with
  `nvidia-kernel-open-dkms` (open) or `nvidia-kernel-dkms` (proprietary).
* `ubuntu` (Ubuntu): Ubuntu's archive; `nvidia-driver-<b>-server-open` or
  `nvidia-driver-<b>-server`.
* `lab` (Debian): the gpukit lab's stand-ins; `nvidia-driver`, `nvidia-driver-<b>` with
  `nvidia-kernel-open-<b>` or `nvidia-kernel-<b>`.
* `cuda` (RedHat): NVIDIA's CUDA repository; the dnf module stream `nvidia-driver:<b>-open`
  or `nvidia-driver:<b>-dkms`, held by versionlock.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

FLAVOURS = ("open", "proprietary")
FAMILIES = ("debian", "redhat")
_BRANCH = re.compile(r"^\d{3,4}$")
_VERSION = re.compile(r"^\d{3,4}(\.\d+){1,2}$")


class DriverSpecError(ValueError):
    """A driver setting is wrong; the message names the variable and the value."""


@dataclass(frozen=True)
class Channel:
    name: str
    family: str
    driver: tuple[str, ...]  # user space (and meta) packages; "{b}" is the branch
    kernel: Mapping[str, tuple[str, ...]]  # flavour -> kernel module packages
    persistenced: tuple[str, ...]
    pin: tuple[str, ...]  # package globs the branch pin covers
    family_globs: tuple[str, ...]  # installed driver packages that are not wanted get removed


CHANNELS: dict[tuple[str, str], Channel] = {
    ("debian", "lab"): Channel(
        name="lab",
        family="debian",
        driver=("nvidia-driver", "nvidia-driver-{b}"),
        kernel={"open": ("nvidia-kernel-open-{b}",), "proprietary": ("nvidia-kernel-{b}",)},
        persistenced=("nvidia-persistenced",),
        pin=("nvidia-driver", "nvidia-driver-*", "nvidia-kernel-*", "nvidia-persistenced"),
        family_globs=("nvidia-driver-*", "nvidia-kernel-*"),
    ),
    ("debian", "cuda"): Channel(
        name="cuda",
        family="debian",
        driver=("nvidia-driver",),
        kernel={"open": ("nvidia-kernel-open-dkms",), "proprietary": ("nvidia-kernel-dkms",)},
        persistenced=("nvidia-persistenced",),
        pin=(
            "nvidia-*",
            "libnvidia-*",
            "libcuda*",
            "libnvcuvid*",
            "libnvoptix*",
            "firmware-nvidia-gsp*",
            "xserver-xorg-video-nvidia*",
            "libegl-nvidia*",
            "libgl1-nvidia-*",
            "libglx-nvidia*",
            "cuda-drivers*",
        ),
        family_globs=("nvidia-kernel-dkms", "nvidia-kernel-open-dkms"),
    ),
    ("debian", "ubuntu"): Channel(
        name="ubuntu",
        family="debian",
        driver=(),
        kernel={
            "open": ("nvidia-driver-{b}-server-open",),
            "proprietary": ("nvidia-driver-{b}-server",),
        },
        persistenced=(),  # nvidia-compute-utils-<b>-server, a dependency
        pin=("nvidia-*", "libnvidia-*", "xserver-xorg-video-nvidia-*"),
        family_globs=("nvidia-driver-*",),
    ),
    ("redhat", "cuda"): Channel(
        name="cuda",
        family="redhat",
        driver=("nvidia-driver", "nvidia-driver-cuda", "nvidia-driver-libs"),
        kernel={"open": ("kmod-nvidia-open-dkms",), "proprietary": ("kmod-nvidia-latest-dkms",)},
        persistenced=("nvidia-persistenced",),
        pin=(),
        family_globs=(),
    ),
}


@dataclass(frozen=True)
class DriverSpec:
    """What the inventory declares for a node's driver."""

    branch: str
    kernel_modules: str = "open"
    family: str = "debian"
    channel: str = "cuda"
    persistenced: bool = True
    version: str | None = None  # an exact driver version within the branch, e.g. 550.90.07

    def __post_init__(self) -> None:
        if not _BRANCH.match(str(self.branch)):
            raise DriverSpecError(
                f"nvidia_driver_branch: {self.branch!r} is not a driver branch such as '550'"
            )
        if self.kernel_modules not in FLAVOURS:
            raise DriverSpecError(
                f"nvidia_driver_kernel_modules: {self.kernel_modules!r} is not one of"
                f" {', '.join(FLAVOURS)}"
            )
        if (self.family, self.channel) not in CHANNELS:
            known = ", ".join(f"{c} ({f})" for f, c in CHANNELS)
            raise DriverSpecError(
                f"nvidia_driver_channel: {self.channel!r} is not available on the {self.family}"
                f" family (known: {known})"
            )
        if self.version is not None:
            if not _VERSION.match(self.version):
                raise DriverSpecError(
                    f"nvidia_driver_version: {self.version!r} is not a driver version such as"
                    " '550.90.07'"
                )
            if not (self.version + ".").startswith(self.branch + "."):
                raise DriverSpecError(
                    f"nvidia_driver_version: {self.version!r} is not in branch"
                    f" nvidia_driver_branch={self.branch!r}"
                )

    @property
    def channel_info(self) -> Channel:
        return CHANNELS[(self.family, self.channel)]

    def packages(self) -> list[str]:
        """Package names to install, in install order (kernel module first)."""
        c = self.channel_info
        names = [*c.kernel[self.kernel_modules], *c.driver]
        if self.persistenced:
            names += c.persistenced
        return [n.format(b=self.branch) for n in names]

    def version_glob(self) -> str:
        return f"{self.version}-*" if self.version else f"{self.branch}.*"
