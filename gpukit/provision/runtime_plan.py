"""containerd's config for the nvidia runtime, planned and judged as containerd reads it: the
file edits (gpukit.provision.runtime), proof that containerd would run the runtime, and
whether containerd's effective config changes, i.e. whether it must restart (a comment or
layout edit does not).

The judge is the node's own containerd (`containerd config dump` of the files before and of
a private copy of the planned files) where a binary is given; otherwise gpukit's reading of
the files (gpukit.provision.containerd.merge; a restart whenever any file containerd loads
parses differently).
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpukit.provision import containerd, runtime_shadows
from gpukit.provision.containerd import CRI_IMAGES_V3, CRI_RUNTIME_V3, CRI_V2, DumpError, Files
from gpukit.provision.runtime import (
    DEFAULT_CDI_DIRS,
    MANAGED,
    RUNC_SHIM,
    Edit,
    RuntimeConfigError,
    RuntimeSettings,
    configure_containerd,
    containerd_dropin,
    ensure_import,
    with_current,
)

DEFAULT_CONFIG = "/etc/containerd/config.toml"
DEFAULT_DROPIN = "/etc/containerd/conf.d/99-gpukit-nvidia.toml"
DEFAULT_IMPORT = "/etc/containerd/conf.d/*.toml"
# Where gpukit's settings go (gpukit_containerd_mode): containerd's main file itself, or a
# drop-in the main file imports.
CONTAINERD_MODES = ("in_place", "drop_in")


@dataclass(frozen=True)
class ContainerdPlan:
    edits: tuple[Edit, ...]
    restart_needed: bool
    # What differs in containerd's effective config, one dotted key per line.
    effective_changes: tuple[str, ...]
    judge: str
    # What the user should know but gpukit leaves alone (another file defining the runtime).
    warnings: tuple[str, ...] = ()

    @property
    def changed(self) -> tuple[Edit, ...]:
        return tuple(e for e in self.edits if e.changed)


def runtime_problems(config: Mapping[str, Any], s: RuntimeSettings) -> list[str]:
    """What keeps containerd from running `s` as asked, in an effective config: a dump
    (containerd 2 prints version 3, 1.7 version 2) or gpukit's merge of the files."""
    version = config.get("version", 2)
    key = CRI_V2 if version == 2 else CRI_RUNTIME_V3
    where = f'plugins."{key}"'
    off = {CRI_V2, CRI_RUNTIME_V3, CRI_IMAGES_V3} & set(config.get("disabled_plugins") or [])
    if off:
        return [f"disabled_plugins turns off {', '.join(sorted(off))}"]
    cri = config.get("plugins", {}).get(key, {})
    ctd = cri.get("containerd", {})
    runtimes = ctd.get("runtimes", {})
    rt = runtimes.get(s.runtime_name)
    problems: list[str] = []
    if not isinstance(rt, dict):
        problems.append(f"{where}.containerd.runtimes has no `{s.runtime_name}`")
    else:
        opts = rt.get("options", {})
        if rt.get("runtime_type") != RUNC_SHIM:
            problems.append(f"{s.runtime_name}.runtime_type is {rt.get('runtime_type')!r}")
        if opts.get("BinaryName") != s.binary:
            problems.append(f"{s.runtime_name}.options.BinaryName is {opts.get('BinaryName')!r}")
        # The cgroup driver must match runc's (and the kubelet's).
        runc = runtimes.get("runc", {}).get("options", {}).get("SystemdCgroup", False)
        if opts.get("SystemdCgroup", False) != runc:
            problems.append(f"{s.runtime_name}.options.SystemdCgroup differs from runc's")
    default = ctd.get("default_runtime_name", "runc")
    if s.set_as_default != (default == s.runtime_name):
        problems.append(f"{where}.containerd.default_runtime_name is {default!r}")
    if s.enable_cdi:
        if cri.get("enable_cdi", version == 3) is not True:  # the default: on in containerd 2
            problems.append(f"{where}.enable_cdi is not true")
        dirs = cri.get("cdi_spec_dirs", list(DEFAULT_CDI_DIRS))
        if missing := [d for d in s.cdi_spec_dirs if d not in dirs]:
            problems.append(f"{where}.cdi_spec_dirs lacks {missing}")
    return problems


def _content(text: str | None) -> object:
    """A file as containerd sees it: its parsed content (comments and layout do not count)."""
    if text is None:
        return None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return text


def _check_loaded(order: list[tuple[str, str | None]], version: int, own: set[str]) -> None:
    """Every file containerd loads must parse, and one with a `version` must have the main
    file's (containerd 2 merges mixed versions wrongly; 1.7 refuses version 3)."""
    main_path = order[0][0]
    for path, text in order[1:]:
        if text is None or path in own:
            continue
        doc = _content(text)
        if not isinstance(doc, dict):
            raise RuntimeConfigError(
                f"{path} (imported by containerd's config) is not valid TOML: containerd"
                " cannot start with it; fix it first"
            )
        if "version" in doc and doc["version"] != version:
            raise RuntimeConfigError(
                f"{path} (imported) has version = {doc['version']!r} but {main_path} has"
                f" version = {version}: containerd merges files of mixed versions wrongly;"
                " give them one version first"
            )


def _containerd_edits(
    s: RuntimeSettings, mode: str, main_path: str, dropin_path: str, pattern: str,
    new_version: int,
) -> list[Edit]:  # fmt: skip
    main_text = containerd.read(main_path)
    if mode == "in_place":
        edits = [configure_containerd(main_text, s, main_path, new_version)]
        # Switching from drop_in: gpukit's drop-in would override the main file.
        old = containerd.read(dropin_path)
        if old is not None and old.startswith(MANAGED):
            edits.append(Edit(dropin_path, old, None, (f"{dropin_path}: removed (in_place mode)",)))
        return edits
    if main_text is None:
        raise RuntimeConfigError(f"{main_path} is missing: drop_in mode needs the main file"
                                 " (it must import the drop-in directory)")  # fmt: skip
    imported = ensure_import(main_text, pattern, main_path)
    # Where the drop-in falls among the files containerd loads, with the import in place
    # (its content does not matter here: it imports nothing).
    placed: dict[str, str | None] = {main_path: imported.after, dropin_path: ""}
    loaded = containerd.load_order(main_path, placed)
    if dropin_path not in [p for p, _ in loaded]:
        raise RuntimeConfigError(f"{dropin_path} is not matched by import {pattern!r}:"
                                 " containerd would not read it")  # fmt: skip
    # Another definition of the runtime (NVIDIA's own drop-in...) is taken over, not left to
    # shadow gpukit's or to be merged wrongly; one holding other settings too is refused.
    takeover: list[Edit] = []
    for shadow in runtime_shadows.shadows(loaded, s, {main_path, dropin_path}):
        if not shadow.replaceable:
            raise RuntimeConfigError(runtime_shadows.refusal(shadow, s))
        takeover += runtime_shadows.replacement(shadow, s, dropin_path)
        placed[shadow.path] = None
    order = [p for p, _ in containerd.load_order(main_path, placed)]
    before = [(p, containerd.read(p) or "") for p in order[1 : order.index(dropin_path)]]
    dropin = containerd_dropin(main_text, s, main_path, dropin_path, before)
    return [with_current(dropin, containerd.read(dropin_path)), imported, *takeover]


def plan_containerd(
    s: RuntimeSettings,
    *,
    mode: str = "in_place",
    main_path: str = DEFAULT_CONFIG,
    dropin_path: str = DEFAULT_DROPIN,
    import_pattern: str = DEFAULT_IMPORT,
    binary: str | None = None,
) -> ContainerdPlan:
    """Plan the edits and judge them; raises RuntimeConfigError (nothing is written here)
    when a file cannot be edited safely or containerd would not run the runtime."""
    if mode not in CONTAINERD_MODES:
        raise RuntimeConfigError(f"mode: {mode!r} is not one of {', '.join(CONTAINERD_MODES)}")
    release = containerd.binary_version(binary) if binary else None
    new_version = 3 if release and release[0] >= 2 else 2
    edits = _containerd_edits(s, mode, main_path, dropin_path, import_pattern, new_version)
    planned: Files = {e.path: e.after for e in edits}
    after_order = containerd.load_order(main_path, planned)
    if aside := [e.path for e in edits if e.path in dict(after_order) and e.before is None
                 and e.path.endswith(runtime_shadows.ASIDE_SUFFIX)]:  # fmt: skip
        raise RuntimeConfigError(
            f"{aside[0]} (a replaced file's text kept aside) would be loaded by containerd's"
            " imports. Nothing was changed."
        )
    # In place, gpukit edits only the main file: a later file that defines the runtime too
    # overrides it now or at the next change of the inventory.
    found = runtime_shadows.shadows(after_order, s, set(planned)) if mode == "in_place" else []
    warnings = tuple(f"{w.describe(s.runtime_name)}, loaded after {main_path}: it overrides"
                     " gpukit's settings there; container_toolkit_containerd_mode: drop_in"
                     " replaces such a file" for w in found)  # fmt: skip
    version = int(tomllib.loads(after_order[0][1] or "")["version"])
    _check_loaded(after_order, version, set(planned))
    changed = any(e.changed for e in edits)
    files_after = [p for p, _ in after_order]
    if binary:
        seen = f" v{release[0]}.{release[1]}" if release else ""
        judge = f"containerd config dump ({binary}{seen})"
        try:
            after = containerd.dump(binary, main_path, planned)
        except DumpError as e:
            raise RuntimeConfigError(f"containerd would not load the planned config: {e}") from e
        try:
            before: dict[str, Any] | None = containerd.dump(binary, main_path) if changed else after
        except DumpError:
            before = None  # the config on disk does not load: the plan fixes it
    else:
        judge = "gpukit's reading of the files (no containerd binary)"
        docs: list[Mapping[str, Any]] = [
            d for _, t in after_order if isinstance(d := _content(t), dict)
        ]
        after = containerd.merge(docs, version)
        before = None
    if problems := runtime_problems(after, s):
        setters = runtime_shadows.setters(after_order, s, {main_path})
        named = "".join(f" {p} sets {', '.join(k)}." for p, k in setters)
        raise RuntimeConfigError(
            f"containerd would not run the `{s.runtime_name}` runtime as asked ({judge}):"
            f" {'; '.join(problems)}.{named} It loads, in order: {', '.join(files_after)};"
            " a file loaded later overrides an earlier one. Nothing was changed."
        )
    if not changed:
        return ContainerdPlan(tuple(edits), False, (), judge, warnings)
    if before is not None:
        effective = containerd.differences(before, after)
    elif binary:
        effective = ["the config on disk does not load in containerd"]
    else:
        old = [(p, _content(t)) for p, t in containerd.load_order(main_path)]
        new = [(p, _content(t)) for p, t in after_order]
        effective = [f"{p}: content changed" for p, c in new if (p, c) not in old]
        effective += [f"{p}: no longer loaded" for p, c in old if p not in files_after]
    return ContainerdPlan(tuple(edits), bool(effective), tuple(effective), judge, warnings)
