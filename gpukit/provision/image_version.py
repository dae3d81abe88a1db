"""The agent image's version against the collection's: a release's wheel, collection and agent
image carry one version (make dist), and the preflight (gpukit.gpu.inventory_check) refuses an
image tagged with another release's version, which would run an agent older or newer than the
roles that configure it.

A value that is no image reference at all (tag or `@sha256:` digest) is refused first.
Only a tag that is a release version (`1.2.3`, `v1.2.3`, `1.2.3-rc1`) is compared: a tag such as
`dev` or `latest`, or an image by digest alone, says nothing about its version, so it is a
warning (the lab's `localhost/gpukit-lab/node-agent:dev`). A user who runs another release's
image on purpose sets PINNED_VARIABLE: the mismatch is then a warning too.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

IMAGE_VARIABLE = "gpukit_device_plugin_image"
PINNED_VARIABLE = "gpukit_device_plugin_image_pinned"
_RELEASE = re.compile(r"v?(\d+\.\d+\.\d+(?:[-+.][0-9A-Za-z.+-]+)?)")
# An image reference as containerd and the kubelet parse it (the distribution project's
# reference grammar): [registry[:port]/]path[:tag][@sha256:<64 hex>]. Only sha256 digests: the
# one algorithm registries and containerd use for image manifests.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_HOST = rf"(?:{_LABEL}(?:\.{_LABEL})*)"
_REFERENCE = re.compile(
    rf"(?P<name>(?:{_HOST}(?::\d+)?/)?{_COMPONENT}(?:/{_COMPONENT})*)"
    r"(?::(?P<tag>[\w][\w.-]{0,127}))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?"
)
NAME_MAX = 255  # the grammar's limit on the name (registry and path)


def collection_version(root: Path) -> str:
    """The version of the collection at `root`: its MANIFEST.json once built or installed,
    its galaxy.yml in a checkout."""
    manifest = root / "MANIFEST.json"
    if manifest.is_file():
        return str(json.loads(manifest.read_text())["collection_info"]["version"])
    return str(yaml.safe_load((root / "galaxy.yml").read_text())["version"])


def reference_problem(image: str, variable: str = IMAGE_VARIABLE) -> str | None:
    """One line naming `variable` and its value when `image` is no image reference (by tag,
    by digest, or both), else None."""
    shown = image if len(image) <= 200 else image[:197] + "..."
    m = _REFERENCE.fullmatch(image)
    if m is None or len(m.group("name")) > NAME_MAX:
        return (f"{variable}: {shown!r} is not an image reference (expected"
                " [registry[:port]/]name[:tag] or ...@sha256:<64 hex digits>)")
    return None


def digest(image: str) -> str | None:
    """The reference's `sha256:` digest, None when it names the image by tag only."""
    m = _REFERENCE.fullmatch(image)
    return m.group("digest") if m else None


def tag(image: str) -> str | None:
    """The image reference's tag (None without one): after the last ':' of its last path
    component, before any '@digest' (a registry's ':port' is not a tag)."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return last.rsplit(":", 1)[1] if ":" in last else None


def release_version(image: str) -> str | None:
    """The release version the image's tag names, None when the tag is no release version."""
    t = tag(image)
    m = _RELEASE.fullmatch(t) if t else None
    return m.group(1) if m else None


@dataclass(frozen=True)
class Verdict:
    problem: str | None = None  # refuse, one line
    warning: str | None = None  # deploy, and say why it may be wrong


def check(image: str, collection_version: str, pinned: bool = False) -> Verdict:
    """The image (IMAGE_VARIABLE's value) against the collection's version."""
    if not image:
        return Verdict()  # the role refuses a missing image itself
    malformed = reference_problem(image)
    if malformed:
        return Verdict(problem=malformed)
    shown = image if len(image) <= 200 else image[:197] + "..."
    version = release_version(image)
    if version is None:
        return Verdict(warning=f"{IMAGE_VARIABLE}: {shown!r} is not tagged with a release version"
                       f" (the collection gpukit.gpu is {collection_version}): the agent's version"
                       " is not checked")  # fmt: skip
    if version == collection_version:
        return Verdict()
    line = (f"{IMAGE_VARIABLE}: {shown!r} is version {version}, the collection gpukit.gpu is"
            f" {collection_version}")  # fmt: skip
    if pinned:
        return Verdict(warning=f"{line} (deployed: {PINNED_VARIABLE} is true)")
    return Verdict(problem=f"{line}; use the image of version {collection_version}, or set"
                   f" {PINNED_VARIABLE}: true to deploy this one on purpose")  # fmt: skip
