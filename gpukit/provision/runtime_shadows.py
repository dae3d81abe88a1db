"""Other files containerd loads that define the nvidia runtime too: NVIDIA's own drop-in
(`nvidia-ctk runtime configure --drop-in-config` writes /etc/containerd/conf.d/99-nvidia.toml,
which sorts after gpukit's 99-gpukit-nvidia.toml and so wins), a hand-written one, or one
written for the other config version (a version-2 table under containerd 2's version 3 is
merged wrongly). gpukit names them; in drop-in mode it takes over a file that holds nothing
but the NVIDIA runtime's settings, and keeps the user's text beside it under a name the
import does not match.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpukit.provision.containerd import CRI_RUNTIME_V3, CRI_V2
from gpukit.provision.runtime import Edit, RuntimeSettings

# The user's text of a replaced file stays here (path + suffix): not `*.toml`.
ASIDE_SUFFIX = ".replaced-by-gpukit"
# Per CRI table, the settings an NVIDIA runtime drop-in writes (nvidia-ctk, the GPU
# Operator's toolkit): what gpukit's drop-in sets itself.
_CRI_KEYS = ("enable_cdi", "cdi_spec_dirs")
_CONTAINERD_KEYS = ("default_runtime_name",)


@dataclass(frozen=True)
class Shadow:
    """A file other than gpukit's own that defines the runtime."""

    path: str
    text: str
    # Dotted keys of the file that are the NVIDIA runtime's (runtimes, default, CDI).
    nvidia_keys: tuple[str, ...]
    # Dotted keys of anything else it sets: gpukit cannot take those over.
    other_keys: tuple[str, ...]

    @property
    def replaceable(self) -> bool:
        return not self.other_keys

    def describe(self, name: str) -> str:
        return f"{self.path} defines the `{name}` runtime too ({', '.join(self.nvidia_keys)})"


def _is_nvidia_runtime(name: str, table: object, s: RuntimeSettings) -> bool:
    if name == s.runtime_name:
        return True
    options = table.get("options", {}) if isinstance(table, Mapping) else {}
    binary = str(options.get("BinaryName", "")) if isinstance(options, Mapping) else ""
    return binary.rsplit("/", 1)[-1].startswith("nvidia-container-runtime")


def _split(doc: Mapping[str, Any], s: RuntimeSettings) -> tuple[list[str], list[str]]:
    """The file's keys: (the NVIDIA runtime's, everything else), as dotted paths."""
    ours: list[str] = []
    other: list[str] = [k for k in doc if k not in ("version", "plugins")]
    plugins = doc.get("plugins", {})
    if not isinstance(plugins, Mapping):
        return ours, [*other, "plugins"]
    for root, cri in plugins.items():
        where = f"plugins.{root}"
        if root not in (CRI_V2, CRI_RUNTIME_V3) or not isinstance(cri, Mapping):
            other.append(where)
            continue
        for key, value in cri.items():
            if key in _CRI_KEYS:
                ours.append(f"{where}.{key}")
            elif key == "containerd" and isinstance(value, Mapping):
                _split_containerd(value, f"{where}.containerd", s, ours, other)
            else:
                other.append(f"{where}.{key}")
    return ours, other


def _split_containerd(
    table: Mapping[str, Any], where: str, s: RuntimeSettings, ours: list[str], other: list[str]
) -> None:
    for key, value in table.items():
        at = f"{where}.{key}"
        if key in _CONTAINERD_KEYS:
            ours.append(at)
        elif key == "runtimes" and isinstance(value, Mapping):
            for name, runtime in value.items():
                (ours if _is_nvidia_runtime(name, runtime, s) else other).append(f"{at}.{name}")
        else:
            other.append(at)


def _read(
    loaded: list[tuple[str, str | None]], s: RuntimeSettings, skip: set[str]
) -> list[Shadow]:
    """The loaded files (after the main file, not in `skip`) that set any of the NVIDIA
    runtime's settings."""
    found: list[Shadow] = []
    for path, text in loaded[1:]:
        if text is None or path in skip:
            continue
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError:
            continue  # the load check names an unparsable file
        ours, other = _split(doc, s)
        if ours:
            found.append(Shadow(path, text, tuple(ours), tuple(other)))
    return found


def shadows(
    loaded: list[tuple[str, str | None]], s: RuntimeSettings, skip: set[str]
) -> list[Shadow]:
    """The loaded files (after the main file, not in `skip`) that define the runtime."""
    return [f for f in _read(loaded, s, skip) if any(".runtimes." in k for k in f.nvidia_keys)]


def setters(
    loaded: list[tuple[str, str | None]], s: RuntimeSettings, skip: set[str]
) -> list[tuple[str, tuple[str, ...]]]:
    """Which loaded files set which of the runtime's settings, to name them in a refusal (under
    containerd 1.x a file's CRI table replaces the earlier ones whole)."""
    return [(f.path, f.nvidia_keys) for f in _read(loaded, s, skip)]


def replacement(shadow: Shadow, s: RuntimeSettings, dropin_path: str) -> list[Edit]:
    """The edits that take over a replaceable file: it goes, its text stays aside."""
    aside = shadow.path + ASIDE_SUFFIX
    why = (f"{shadow.describe(s.runtime_name)}: replaced by {dropin_path}; its text is kept"
           f" in {aside}")  # fmt: skip
    return [Edit(shadow.path, shadow.text, None, (why,)), Edit(aside, None, shadow.text)]


def refusal(shadow: Shadow, s: RuntimeSettings) -> str:
    """Why a file cannot be taken over: it holds other settings too."""
    return (f"{shadow.describe(s.runtime_name)} beside other settings"
            f" ({', '.join(shadow.other_keys)}): gpukit cannot replace it without losing"
            f" those; remove its `{s.runtime_name}` runtime (or the file) first. Nothing was"
            " changed.")  # fmt: skip
