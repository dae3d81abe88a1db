"""Container runtime configuration for NVIDIA GPUs: containerd (config versions 2 and 3) and
CRI-O, edited with tomlkit so the rest of the file, its comments and its layout survive.

containerd, in place (the default): the runtime `nvidia` (runc v2 shim running
nvidia-container-runtime, with runc's options copied so cgroup settings match), optionally
the default runtime, CDI enabled with its spec directories.

containerd, drop-in: the same settings in a file of their own under `imports`, so a main
file owned by another tool (kubespray's template) is left alone, except that it must import
the drop-in directory. The drop-in has the main file's `version` (containerd 2 merges files
of mixed versions wrongly, see gpukit.provision.containerd). containerd 1.7 (version 2)
replaces a plugin's whole table with the one of the file loaded last, so a version-2 drop-in
carries the complete CRI table it replaces (the main file's, or another drop-in's loaded
before it) plus the edits, re-rendered on every run; containerd 2 (version 3) merges
tables key by key, so a version-3 drop-in holds only gpukit's settings.

CRI-O: always a drop-in in /etc/crio/crio.conf.d (CRI-O merges those natively).
"""

from __future__ import annotations

import copy
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import tomlkit
from tomlkit.exceptions import TOMLKitError
from tomlkit.items import Table
from tomlkit.toml_document import TOMLDocument

from gpukit.provision import containerd
from gpukit.provision.containerd import CRI_IMAGES_V3, CRI_RUNTIME_V3, CRI_V2, TOP_LEVEL_KEYS
from gpukit.provision.edit import Edit

__all__ = ["CRI_RUNTIME_V3", "CRI_V2", "Edit", "RuntimeConfigError", "RuntimeSettings"]

RUNC_SHIM = "io.containerd.runc.v2"
DEFAULT_BINARY = "/usr/bin/nvidia-container-runtime"
DEFAULT_CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
DEFAULT_DROPIN_DIR = "/etc/containerd/conf.d"
MANAGED = "# Managed by gpukit (container_toolkit)"


class RuntimeConfigError(ValueError):
    """The runtime's config cannot be edited safely; the message says why and what to do."""


@dataclass(frozen=True)
class RuntimeSettings:
    runtime_name: str = "nvidia"
    binary: str = DEFAULT_BINARY
    set_as_default: bool = False
    enable_cdi: bool = True
    cdi_spec_dirs: tuple[str, ...] = DEFAULT_CDI_DIRS
    # The runtime `set_as_default: false` puts back when the default was ours.
    fallback_default: str = "runc"


def _parse(text: str, path: str) -> TOMLDocument:
    try:
        return tomlkit.parse(text)
    except TOMLKitError as e:
        raise RuntimeConfigError(f"{path}: not valid TOML ({e}); fix the file first") from e


def config_version(doc: Mapping[str, Any], path: str = "config.toml") -> int:
    raw = doc.get("version", 1)
    if isinstance(raw, bool) or not isinstance(raw, int) or raw not in (1, 2, 3):
        raise RuntimeConfigError(
            f"{path}: version = {raw!r} is not a containerd config version (2: containerd"
            " 1.x, 3: containerd 2.x); is this containerd's config?"
        )
    if raw == 1:
        raise RuntimeConfigError(
            f"{path}: containerd config version 1 (no `version` key) is not supported:"
            " migrate it with `containerd config migrate` (or write `version = 2`)"
        )
    return raw


def check_containerd(doc: Mapping[str, Any], path: str) -> int:
    """A main file gpukit may edit: containerd's keys only, version 2 or 3, CRI enabled.
    Returns its version."""
    unknown = sorted(set(doc) - TOP_LEVEL_KEYS)
    if unknown:
        hint = " (a CRI-O config?)" if "crio" in unknown else ""
        raise RuntimeConfigError(
            f"{path}: not a containerd config{hint}: unknown top-level keys"
            f" {', '.join(unknown)}; point config_path at containerd's config.toml"
        )
    version = config_version(doc, path)
    disabled = doc.get("disabled_plugins", [])
    off = sorted({CRI_V2, CRI_RUNTIME_V3, CRI_IMAGES_V3} & set(map(str, disabled or [])))
    if off:
        raise RuntimeConfigError(
            f"{path}: disabled_plugins turns off the CRI plugin ({', '.join(off)}), so no"
            " kubelet can use this containerd; remove it from disabled_plugins first"
        )
    return version


def _main_doc(text: str | None, path: str, new_version: int) -> TOMLDocument:
    """The main file parsed and checked; a missing or empty one starts as `new_version`."""
    if text is None or not _parse(text, path):
        text = f"version = {new_version}\n{text or ''}"
    doc = _parse(text, path)
    check_containerd(doc, path)
    return doc


def _cri_root_key(version: int) -> str:
    return CRI_V2 if version == 2 else CRI_RUNTIME_V3


def _table(parent: Table | TOMLDocument, key: str, super_table: bool = False) -> Table:
    """parent[key] as a table, created (as a [section]) when missing."""
    if key not in parent:
        parent[key] = tomlkit.table(is_super_table=super_table)
    item = parent[key]
    if not isinstance(item, Table):
        raise RuntimeConfigError(f"`{key}` is not a table")
    return item


def _indent_like(new: Table, sibling: Table | None) -> None:
    """Give a new [section] the header and key indentation of an existing sibling section."""
    if sibling is None:
        return
    header = sibling.trivia.indent
    key_indent = header
    for _k, item in sibling.value.body:
        if _k is not None and not isinstance(item, Table):
            key_indent = item.trivia.indent
            break
    for k, item in new.value.body:
        if k is not None and not isinstance(item, Table):
            item.trivia.indent = key_indent
    new.trivia.indent = header
    for k, item in new.value.body:
        if isinstance(item, Table):
            sub_sibling = sibling.get(str(k)) if k is not None else None
            _indent_like(item, sub_sibling if isinstance(sub_sibling, Table) else None)


def _plain(value: Any) -> Any:
    return value.unwrap() if hasattr(value, "unwrap") else value


def _set(table: Table, key: str, value: Any, label: str, changes: list[str]) -> None:
    current = _plain(table.get(key))
    if current != value:
        table[key] = value
        changes.append(f"{label}: {current!r} -> {value!r}")


def _edit_cri(cri: Table, s: RuntimeSettings, version: int, changes: list[str]) -> None:
    prefix = f'plugins."{_cri_root_key(version)}"'
    containerd_table = _table(cri, "containerd", super_table=True)
    runtimes = _table(containerd_table, "runtimes", super_table=True)
    runc = runtimes.get("runc")
    runc_options = _plain(runc.get("options", {})) if isinstance(runc, Table) else {}
    options = {k: v for k, v in dict(runc_options).items() if k != "BinaryName"}
    options["BinaryName"] = s.binary
    existing = runtimes.get(s.runtime_name)
    where = f"{prefix}.containerd.runtimes.{s.runtime_name}"
    if not isinstance(existing, Table):
        new = tomlkit.table()
        new["runtime_type"] = RUNC_SHIM
        new.add(tomlkit.nl())
        opts = tomlkit.table()
        for k, v in options.items():
            opts[k] = v
        opts.add(tomlkit.nl())
        new["options"] = opts
        runtimes[s.runtime_name] = new
        _indent_like(new, runc if isinstance(runc, Table) else None)
        changes.append(f"{where}: added (runc v2 shim, BinaryName {s.binary})")
    else:
        _set(existing, "runtime_type", RUNC_SHIM, f"{where}.runtime_type", changes)
        opts_item = existing.get("options")
        if not isinstance(opts_item, Table):
            opts_item = tomlkit.table()
            existing["options"] = opts_item
        for k, v in options.items():
            _set(opts_item, k, v, f"{where}.options.{k}", changes)
    current_default = _plain(containerd_table.get("default_runtime_name"))
    if s.set_as_default:
        _set(containerd_table, "default_runtime_name", s.runtime_name,
             f"{prefix}.containerd.default_runtime_name", changes)  # fmt: skip
    elif current_default == s.runtime_name:
        _set(containerd_table, "default_runtime_name", s.fallback_default,
             f"{prefix}.containerd.default_runtime_name", changes)  # fmt: skip
    if s.enable_cdi:
        _set(cri, "enable_cdi", True, f"{prefix}.enable_cdi", changes)
        dirs = list(_plain(cri.get("cdi_spec_dirs", [])) or [])
        wanted = dirs + [d for d in s.cdi_spec_dirs if d not in dirs]
        _set(cri, "cdi_spec_dirs", wanted, f"{prefix}.cdi_spec_dirs", changes)


def configure_containerd(
    text: str | None, s: RuntimeSettings, path: str, new_version: int = 2
) -> Edit:
    """Edit containerd's main config in place (a missing or empty file starts as
    `version = new_version`: 3 for containerd 2, 2 for 1.7, which refuses 3)."""
    doc = _main_doc(text, path, new_version)
    version = config_version(doc, path)
    changes: list[str] = []
    try:
        plugins = _table(doc, "plugins", super_table=True)
        _edit_cri(_table(plugins, _cri_root_key(version)), s, version, changes)
    except RuntimeConfigError as e:
        raise RuntimeConfigError(f"{path}: {e}; fix the file first") from e
    after = tomlkit.dumps(doc) if text is None or changes else text
    return Edit(path=path, before=text, after=after, changes=tuple(changes))


def _loads(text: str, path: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise RuntimeConfigError(f"{path}: not valid TOML ({e}); fix the file first") from e


def _base_table(files: Sequence[tuple[str, str]], root: str) -> tuple[str, Table] | None:
    """containerd 1.7: the CRI table of the last file that has one (it replaces the others)."""
    for path, text in reversed(files):
        plugins = _parse(text, path).get("plugins")
        table = plugins.get(root) if isinstance(plugins, Table) else None
        if isinstance(table, Table):
            return path, copy.deepcopy(table)
    return None


def _seed_v3(files: Sequence[tuple[str, str]], s: RuntimeSettings) -> tuple[Table, str | None]:
    """containerd 2: what the files before the drop-in merge to, as far as the edit reads it
    (runc's options, the default runtime, the CDI spec dirs)."""
    merged = containerd.merge([_loads(t, p) for p, t in files], 3)
    base = merged.get("plugins", {}).get(CRI_RUNTIME_V3, {})
    base = base if isinstance(base, dict) else {}
    cri = tomlkit.table()
    runtimes = base.get("containerd", {}).get("runtimes", {})
    if isinstance(runtimes.get("runc"), dict):
        _table(_table(cri, "containerd", True), "runtimes", True)["runc"] = runtimes["runc"]
    default = base.get("containerd", {}).get("default_runtime_name")
    if isinstance(default, str):
        _table(cri, "containerd", True)["default_runtime_name"] = default
    if s.enable_cdi and isinstance(base.get("cdi_spec_dirs"), list):
        cri["cdi_spec_dirs"] = base["cdi_spec_dirs"]
    return cri, default if isinstance(default, str) else None


def _only_ours(cri: Table, s: RuntimeSettings, base_default: str | None) -> dict[str, Any]:
    """A version-3 drop-in holds only gpukit's settings: the seeded runc table served to copy
    its options; the base's default runtime is left to the base unless gpukit sets or resets
    it."""
    plain: dict[str, Any] = _plain(cri)
    ctd = plain.get("containerd", {})
    ctd.get("runtimes", {}).pop("runc", None)
    if not s.set_as_default and ctd.get("default_runtime_name") == base_default:
        ctd.pop("default_runtime_name", None)
    out: dict[str, Any] = {k: plain[k] for k in ("enable_cdi", "cdi_spec_dirs") if k in plain}
    out["containerd"] = dict(sorted(ctd.items(), key=lambda kv: kv[0] == "runtimes"))
    return out


def containerd_dropin(
    main_text: str,
    s: RuntimeSettings,
    main_path: str,
    path: str,
    before: Sequence[tuple[str, str]] = (),
) -> Edit:
    """The drop-in's planned content. `before`: the files containerd loads before the
    drop-in other than the main file, in its order (path, text); their CRI settings are the
    drop-in's base. `Edit.before` is left None here and filled in by :func:`with_current`."""
    version = check_containerd(_parse(main_text, main_path), main_path)
    root = _cri_root_key(version)
    files = [(main_path, main_text), *before]
    doc = tomlkit.document()
    doc.add(tomlkit.comment(f"{MANAGED[2:]}: the `{s.runtime_name}` runtime and CDI for"
                            " NVIDIA GPUs."))  # fmt: skip
    doc.add(tomlkit.comment(f"version = {version} as in {main_path}: containerd 2 merges files"
                            " of mixed versions wrongly."))  # fmt: skip
    changes: list[str] = []
    plugins = tomlkit.table(is_super_table=True)
    if version == 3:
        cri, base_default = _seed_v3(files, s)
        _edit_cri(cri, s, version, changes)
        plugins[root] = _only_ours(cri, s, base_default)
    else:
        base = _base_table(files, root)
        if base is not None:
            doc.add(tomlkit.comment("containerd 1.x replaces a plugin's table with an imported"
                                    f" one: this is {base[0]}'s"))  # fmt: skip
            doc.add(tomlkit.comment(f'plugins."{root}" table plus gpukit\'s edits.'))
        cri = base[1] if base is not None else tomlkit.table()
        _edit_cri(cri, s, version, changes)
        plugins[root] = cri
    doc["version"] = version
    doc["plugins"] = plugins
    return Edit(path=path, before=None, after=tomlkit.dumps(doc), changes=tuple(changes))


def ensure_import(main_text: str, pattern: str, path: str) -> Edit:
    """Make containerd's main config import `pattern` (e.g. /etc/containerd/conf.d/*.toml).
    containerd 2's dump lists that pattern by default, but reads it only when imported."""
    doc = _parse(main_text, path)
    check_containerd(doc, path)
    imports = list(_plain(doc.get("imports", [])) or [])
    if pattern in imports:
        return Edit(path=path, before=main_text, after=main_text)
    change = (f"imports: added {pattern!r}",)
    if "imports" in doc:
        doc["imports"] = [*imports, pattern]
        return Edit(path=path, before=main_text, after=tomlkit.dumps(doc), changes=change)
    # A new top-level key must come before the first [section]: right after `version`.
    line = f"imports = [{tomlkit.string(pattern).as_string()}]\n"
    lines = main_text.splitlines(keepends=True)
    at = next((i + 1 for i, ln in enumerate(lines) if ln.lstrip().startswith("version")), 0)
    if lines and at and not lines[at - 1].endswith("\n"):
        lines[at - 1] += "\n"
    lines.insert(at, line)
    return Edit(path=path, before=main_text, after="".join(lines), changes=change)


def crio_dropin(s: RuntimeSettings, path: str) -> Edit:
    """CRI-O's drop-in (crio.conf.d): the runtime, optionally the default, CDI spec dirs."""
    doc = tomlkit.document()
    doc.add(tomlkit.comment("Managed by gpukit (container_toolkit): NVIDIA runtime for CRI-O."))
    crio = tomlkit.table(is_super_table=True)
    runtime = tomlkit.table()
    if s.set_as_default:
        runtime["default_runtime"] = s.runtime_name
    if s.enable_cdi:
        runtime["cdi_spec_dirs"] = list(s.cdi_spec_dirs)
    runtimes = tomlkit.table(is_super_table=True)
    nvidia = tomlkit.table()
    nvidia["runtime_path"] = s.binary
    nvidia["runtime_type"] = "oci"
    nvidia["runtime_root"] = f"/run/{s.runtime_name}"
    runtimes[s.runtime_name] = nvidia
    runtime["runtimes"] = runtimes
    crio["runtime"] = runtime
    doc["crio"] = crio
    return Edit(path=path, before=None, after=tomlkit.dumps(doc), changes=(f"{path}: rendered",))


def with_current(edit: Edit, current: str | None) -> Edit:
    """A rendered file's Edit against what is on disk now."""
    if current == edit.after:
        changes: tuple[str, ...] = ()
    elif current is None:
        changes = (f"{edit.path}: created", *edit.changes)
    else:
        changes = (f"{edit.path}: updated", *edit.changes)
    return Edit(path=edit.path, before=current, after=edit.after, changes=changes)
