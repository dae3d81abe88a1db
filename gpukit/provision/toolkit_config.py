"""The NVIDIA container runtime's own config (/etc/nvidia-container-runtime/config.toml) and the
device plugin strategies that must agree with it.

Hardening by default (NVIDIA's documented advice for Kubernetes): the runtime ignores
NVIDIA_VISIBLE_DEVICES in unprivileged containers
(`accept-nvidia-visible-devices-envvar-when-unprivileged = false`), so a pod that sets the
variable itself (every CUDA image does) gets no GPU it was not allocated, and takes the device
plugin's list from volume mounts (`accept-nvidia-visible-devices-as-volume-mounts = true`).
The declaration variable `gpukit_runtime_accept_envvar_unprivileged: true` opts out.

With the hardening on, a device plugin config whose only strategy is `envvar` (also NVIDIA's
default, for a config that names none) cannot give an unprivileged pod its GPU: such configs
are refused, naming host, variable and config. No strategy is filled in silently: the
ConfigMap carries the declared configs as written (rollouts compare the two).

The file is edited in place: only the two top-level keys change; a commented-out default line
(`#accept-... = ...`, as NVIDIA's package ships them) is replaced where it stands.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# The hardening rule lives below the model and provisioning both; roles reach it here.
from gpukit.contracts.runtime_hardening import CONFIGS_VARIABLE as CONFIGS_VARIABLE
from gpukit.contracts.runtime_hardening import HARDENED_STRATEGIES as HARDENED_STRATEGIES
from gpukit.contracts.runtime_hardening import NVIDIA_DEFAULT_STRATEGY as NVIDIA_DEFAULT_STRATEGY
from gpukit.contracts.runtime_hardening import OPT_OUT_VARIABLE as OPT_OUT_VARIABLE
from gpukit.contracts.runtime_hardening import unhardened_configs as unhardened_configs
from gpukit.provision.edit import Edit

DEFAULT_PATH = "/etc/nvidia-container-runtime/config.toml"
ENVVAR_UNPRIVILEGED = "accept-nvidia-visible-devices-envvar-when-unprivileged"
VOLUME_MOUNTS = "accept-nvidia-visible-devices-as-volume-mounts"


class ToolkitConfigError(ValueError):
    """The runtime's config or the declaration cannot be used; the message says what to fix."""


@dataclass(frozen=True)
class ToolkitSettings:
    accept_envvar_unprivileged: bool = False
    accept_volume_mounts: bool = True

    def wanted(self) -> dict[str, bool]:
        return {ENVVAR_UNPRIVILEGED: self.accept_envvar_unprivileged,
                VOLUME_MOUNTS: self.accept_volume_mounts}  # fmt: skip


def _loads(text: str, path: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ToolkitConfigError(f"{path}: not valid TOML ({e}); fix the file first") from e


def _set_top_level(text: str, key: str, value: bool) -> str:
    """`key = value` at the top level: the existing assignment or the commented-out default
    replaced where it stands, else a new line before the first table."""
    line = f"{key} = {'true' if value else 'false'}"
    lines = text.splitlines(keepends=True)
    first_table = next((i for i, ln in enumerate(lines) if ln.lstrip().startswith("[")),
                       len(lines))  # fmt: skip
    assigned = re.compile(rf"^\s*{re.escape(key)}\s*=")
    commented = re.compile(rf"^\s*#\s*{re.escape(key)}\s*=")
    for pattern in (assigned, commented):
        for i in range(first_table):
            if pattern.match(lines[i]):
                lines[i] = line + "\n"
                return "".join(lines)
    if lines and first_table == len(lines) and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    lines.insert(first_table, line + "\n")
    return "".join(lines)


def plan(current: str | None, s: ToolkitSettings, path: str = DEFAULT_PATH) -> Edit:
    """The config with the hardening keys as `s` wants them; only what differs changes."""
    doc = _loads(current or "", path)
    after = current or ""
    changes: list[str] = []
    for key, value in s.wanted().items():
        have = doc.get(key)
        if have is not None and not isinstance(have, bool):
            changes.append(f"{key}: {have!r} (not a boolean) -> {value}")
        elif have != value:
            changes.append(f"{key}: {'unset' if have is None else have} -> {value}")
        else:
            continue
        after = _set_top_level(after, key, value)
    result = _loads(after, path)
    for key, value in s.wanted().items():  # the edit must read back as planned
        if result.get(key) is not value:
            raise ToolkitConfigError(f"{path}: {key} does not read back as {value} after the"
                                     " edit; fix the file by hand")  # fmt: skip
    if current is None:
        changes.insert(0, f"{path}: created")
    return Edit(path=path, before=current, after=after if changes else current,
                changes=tuple(changes))  # fmt: skip


def hardening_problems(
    configs: Mapping[str, Any] | None, accept_envvar_unprivileged: bool, host: str
) -> list[str]:
    """Why the device plugin configs cannot work with the runtime's settings, one line per
    config (empty: they agree)."""
    if accept_envvar_unprivileged:
        return []
    return [f"host {host}: {CONFIGS_VARIABLE}[{name!r}] {why}"
            for name, _, why in unhardened_configs(configs)]
