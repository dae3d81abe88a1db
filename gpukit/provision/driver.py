"""NVIDIA driver: which packages a node needs, the branch pin, and the plan from what is
installed to what the inventory declares.

The plan is computed here, not by apt: in check mode the pin is not written, so apt would
plan against the old pin and under-report a branch switch. The plan resolves exact versions
(newest of the branch, or `version` when declared) and the role installs `name=version`,
which apt honours in check mode and real mode alike; the pin then keeps later upgrades on
the branch.

Channels and the declared driver (`DriverSpec`): `gpukit.contracts.nvidia_driver`.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

# The declared driver lives below the model and provisioning both; the roles' modules and
# filters keep reaching it here.
from gpukit.contracts.nvidia_driver import CHANNELS as CHANNELS
from gpukit.contracts.nvidia_driver import FAMILIES as FAMILIES
from gpukit.contracts.nvidia_driver import FLAVOURS as FLAVOURS
from gpukit.contracts.nvidia_driver import Channel as Channel
from gpukit.contracts.nvidia_driver import DriverSpec as DriverSpec
from gpukit.contracts.nvidia_driver import DriverSpecError as DriverSpecError
from gpukit.provision import debversion


def apt_pin(spec: DriverSpec) -> str:
    """/etc/apt/preferences.d content keeping the driver (and its meta package) on the branch.

    Priority 1001 also lets apt go back down when the branch is lowered."""
    c = spec.channel_info
    what = f"version {spec.version}" if spec.version else f"branch {spec.branch}"
    return (
        f"# Managed by gpukit (nvidia_driver): keep the NVIDIA driver on {what}.\n"
        f"Package: {' '.join(c.pin)}\n"
        f"Pin: version {spec.version_glob()}\n"
        "Pin-Priority: 1001\n"
    )


def dnf_versionlock(spec: DriverSpec) -> str:
    """/etc/dnf/plugins/versionlock.list entries holding the driver packages on the branch
    (NVIDIA's RPMs carry epoch 3)."""
    c = spec.channel_info
    names = [*c.driver, *c.kernel[spec.kernel_modules]]
    if spec.persistenced:
        names += c.persistenced
    what = f"version {spec.version}" if spec.version else f"branch {spec.branch}"
    lines = [f"# Managed by gpukit (nvidia_driver): keep the NVIDIA driver on {what}."]
    lines += [f"{n}-3:{spec.version_glob()}" for n in names]
    return "\n".join(lines) + "\n"


def dnf_module_stream(spec: DriverSpec) -> str:
    """The dnf module spec: `nvidia-driver:550-open` or `nvidia-driver:550-dkms`."""
    return f"nvidia-driver:{spec.branch}-{'open' if spec.kernel_modules == 'open' else 'dkms'}"


def dnf_enabled_stream(module_list: str, module: str = "nvidia-driver") -> str | None:
    """The enabled stream of `module` in `dnf module list --enabled <module>` output
    (`nvidia-driver   550-open [e]   ...`), or None."""
    for line in module_list.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0] == module and parts[2].startswith("[e]"):
            return parts[1]
        if len(parts) >= 2 and parts[0] == module and parts[1].endswith("[e]"):
            return parts[1].removesuffix("[e]").strip() or None
    return None


def dnf_stream_switch(spec: DriverSpec, module_list: str) -> bool:
    """dnf refuses to install another stream of an enabled module: a branch or flavour
    change must reset the module first."""
    enabled = dnf_enabled_stream(module_list)
    return enabled is not None and enabled != dnf_module_stream(spec).split(":", 1)[1]


# --- planning ------------------------------------------------------------------------------


def parse_madison(text: str) -> dict[str, list[str]]:
    """`apt-cache madison` output -> {package: [versions, newest first, no duplicates]}."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) < 3 or not parts[0] or not parts[1]:
            continue
        versions = out.setdefault(parts[0], [])
        if parts[1] not in versions:
            versions.append(parts[1])
    for versions in out.values():
        versions.sort(key=debversion.sort_key, reverse=True)
    return out


def parse_dpkg_query(text: str) -> dict[str, str]:
    """`dpkg-query -W -f='${Package} ${Version} ${db:Status-Abbrev}\\n'` -> installed versions."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[2].startswith("ii"):
            out[parts[0]] = parts[1]
    return out


@dataclass(frozen=True)
class PackageChange:
    name: str
    action: str  # install | upgrade | downgrade | remove | keep
    current: str | None
    target: str | None

    def describe(self) -> str:
        if self.action == "install":
            return f"install {self.name} {self.target or '(version resolved after apt update)'}"
        if self.action == "remove":
            return f"remove {self.name} {self.current}"
        if self.action == "keep":
            return f"keep {self.name} {self.current}"
        return f"{self.action} {self.name} {self.current} -> {self.target}"


@dataclass(frozen=True)
class DriverPlan:
    install: tuple[str, ...]  # apt arguments: name=version (name alone when unresolved)
    remove: tuple[str, ...]
    changes: tuple[PackageChange, ...]
    driver_version: str | None  # the upstream driver version the node will have
    problems: tuple[str, ...] = field(default_factory=tuple)
    pin: str = ""

    @property
    def changed(self) -> bool:
        return any(c.action != "keep" for c in self.changes)

    def summary(self) -> list[str]:
        return [c.describe() for c in self.changes if c.action != "keep"]


def _pick(spec: DriverSpec, name: str, versions: Sequence[str]) -> str | None:
    want = spec.version_glob()
    # Versions carry no epoch in these repositories; match the pin the way apt does.
    matching = [v for v in versions if fnmatch.fnmatchcase(v, want)]
    return matching[0] if matching else None


def plan_apt(
    spec: DriverSpec,
    installed: Mapping[str, str],
    available: Mapping[str, Sequence[str]],
    repo_configured: bool = True,
) -> DriverPlan:
    """From `installed` ({name: version}) and `available` (madison) to the declared driver.

    `repo_configured` False (check mode before the repository exists): packages the cache
    does not know yet are planned without a version instead of reported as missing."""
    install: list[str] = []
    changes: list[PackageChange] = []
    problems: list[str] = []
    driver_version: str | None = None
    wanted = spec.packages()
    for name in wanted:
        versions = sorted(available.get(name, ()), key=debversion.sort_key, reverse=True)
        target = _pick(spec, name, versions)
        current = installed.get(name)
        if target is None:
            if versions or repo_configured:
                problems.append(
                    f"{name}: no version matching {spec.version_glob()} in the configured"
                    f" repositories (available: {', '.join(versions) or 'none'})"
                )
            install.append(name)
            changes.append(PackageChange(name, "install", current, None))
            continue
        install.append(f"{name}={target}")
        if current is None:
            action = "install"
        else:
            cmp = debversion.compare(target, current)
            action = "keep" if cmp == 0 else ("upgrade" if cmp > 0 else "downgrade")
        changes.append(PackageChange(name, action, current, target))
        up = debversion.upstream(target)
        if driver_version is None or debversion.compare(up, driver_version) > 0:
            driver_version = up
    if driver_version is None and spec.version:
        driver_version = spec.version
    remove: list[str] = []
    for name, version in sorted(installed.items()):
        if name in wanted:
            continue
        if any(fnmatch.fnmatchcase(name, g.format(b=spec.branch)) for g in
               spec.channel_info.family_globs):  # fmt: skip
            remove.append(name)
            changes.append(PackageChange(name, "remove", version, None))
    return DriverPlan(
        install=tuple(install),
        remove=tuple(remove),
        changes=tuple(changes),
        driver_version=driver_version,
        problems=tuple(problems),
        pin=apt_pin(spec),
    )


@dataclass(frozen=True)
class RebootDecision:
    required: bool
    reason: str


def reboot_decision(
    target_version: str | None,
    loaded_version: str | None,
    nvml_error: str | None = None,
    nouveau_loaded: bool = False,
) -> RebootDecision:
    """Is a reboot due for the driver to be the one the node runs?

    `loaded_version`: what NVML reports (the loaded kernel module's version); None when NVML
    could not answer (no module loaded, or a user-space/kernel mismatch after an upgrade)."""
    if nouveau_loaded:
        return RebootDecision(True, "nouveau is loaded; it must be gone before the NVIDIA driver")
    if target_version is None:
        return RebootDecision(False, "no NVIDIA driver is declared")
    if loaded_version is None:
        detail = f" ({nvml_error})" if nvml_error else ""
        return RebootDecision(
            True, f"driver {target_version} is installed but NVML reaches no driver{detail}"
        )
    if loaded_version != target_version:
        return RebootDecision(
            True, f"driver {target_version} is installed, {loaded_version} is loaded"
        )
    return RebootDecision(False, f"driver {loaded_version} is loaded")
