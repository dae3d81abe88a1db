"""Container runtime configuration for NVIDIA GPUs: containerd (config versions 2 and 3) and
CRI-O, edited with tomlkit so the rest of the file, its comments and its layout survive.

containerd, in place (the default): the runtime `nvidia` (runc v2 shim running
nvidia-container-runtime, with runc's options copied so cgroup settings match), optionally
the default runtime, CDI enabled with its spec directories.

containerd, drop-in: the same settings in a file of their own under `imports`, so a main
file owned by another tool (kubespray's template) is left alone, except that it must import
the drop-in directory. containerd 1.x (config version 2) replaces a plugin's whole table
with an imported one, so the drop-in carries the main file's complete CRI table plus the
edits (re-rendered from the main file on every run); containerd 2.x (version 3) merges
tables, so its drop-in holds only the edits.

CRI-O: always a drop-in in /etc/crio/crio.conf.d (CRI-O merges those natively).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import tomlkit
from tomlkit.exceptions import TOMLKitError
from tomlkit.items import Table
from tomlkit.toml_document import TOMLDocument

from gpukit.provision.edit import Edit

__all__ = ["Edit", "RuntimeConfigError", "RuntimeSettings"]

CRI_V2 = "io.containerd.grpc.v1.cri"
CRI_RUNTIME_V3 = "io.containerd.cri.v1.runtime"
RUNC_SHIM = "io.containerd.runc.v2"
DEFAULT_BINARY = "/usr/bin/nvidia-container-runtime"
DEFAULT_CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
DEFAULT_DROPIN_DIR = "/etc/containerd/conf.d"


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
    if not isinstance(raw, int) or raw not in (1, 2, 3):
        raise RuntimeConfigError(f"{path}: version = {raw!r} is not a containerd config version")
    if raw == 1:
        raise RuntimeConfigError(
            f"{path}: containerd config version 1 (no `version` key) is not supported:"
            " migrate it with `containerd config migrate` (or write `version = 2`)"
        )
    return raw


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
    containerd = _table(cri, "containerd", super_table=True)
    runtimes = _table(containerd, "runtimes", super_table=True)
    runc = runtimes.get("runc")
    runc_options = _plain(runc.get("options", {})) if isinstance(runc, Table) else {}
    options = {k: v for k, v in dict(runc_options).items() if k != "BinaryName"}
    options["BinaryName"] = s.binary
    want_runtime: dict[str, Any] = {"runtime_type": RUNC_SHIM, "options": options}
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
        for k, v in want_runtime["options"].items():
            _set(opts_item, k, v, f"{where}.options.{k}", changes)
    current_default = _plain(containerd.get("default_runtime_name"))
    if s.set_as_default:
        _set(containerd, "default_runtime_name", s.runtime_name,
             f"{prefix}.containerd.default_runtime_name", changes)  # fmt: skip
    elif current_default == s.runtime_name:
        _set(containerd, "default_runtime_name", s.fallback_default,
             f"{prefix}.containerd.default_runtime_name", changes)  # fmt: skip
    if s.enable_cdi:
        _set(cri, "enable_cdi", True, f"{prefix}.enable_cdi", changes)
        dirs = list(_plain(cri.get("cdi_spec_dirs", [])) or [])
        wanted = dirs + [d for d in s.cdi_spec_dirs if d not in dirs]
        _set(cri, "cdi_spec_dirs", wanted, f"{prefix}.cdi_spec_dirs", changes)


def configure_containerd(text: str | None, s: RuntimeSettings, path: str) -> Edit:
    """Edit containerd's main config in place (a missing file starts as `version = 2`)."""
    before = text
    doc = _parse(text if text is not None else "version = 2\n", path)
    version = config_version(doc, path)
    plugins = _table(doc, "plugins", super_table=True)
    cri = _table(plugins, _cri_root_key(version))
    changes: list[str] = []
    _edit_cri(cri, s, version, changes)
    after = tomlkit.dumps(doc)
    if text is not None and not changes:
        after = text
    return Edit(path=path, before=before, after=after, changes=tuple(changes))


def containerd_dropin(main_text: str, s: RuntimeSettings, main_path: str, path: str) -> Edit:
    """The drop-in's planned content (its current text is read by the caller: `Edit.before`
    is left None here and filled in by :func:`with_current`)."""
    main = _parse(main_text, main_path)
    version = config_version(main, main_path)
    root = _cri_root_key(version)
    doc = tomlkit.document()
    doc.add(tomlkit.comment(f"Managed by gpukit (container_toolkit): the `{s.runtime_name}`"
                            " runtime and CDI for NVIDIA GPUs."))  # fmt: skip
    if version == 2:
        doc.add(tomlkit.comment(
            f"containerd 1.x replaces a plugin's table with an imported one: this is {main_path}'s"
        ))  # fmt: skip
        doc.add(tomlkit.comment(f'plugins."{root}" table plus gpukit\'s edits.'))
    doc["version"] = version
    plugins = tomlkit.table(is_super_table=True)
    main_plugins = main.get("plugins")
    main_cri = main_plugins.get(root) if isinstance(main_plugins, Table) else None
    cri = copy.deepcopy(main_cri) if version == 2 and isinstance(main_cri, Table) else None
    if cri is None:
        cri = tomlkit.table()
        # containerd 2.x merges: only the runc options the nvidia runtime copies are needed.
        if isinstance(main_cri, Table):
            runc = main_cri.get("containerd", {}).get("runtimes", {}).get("runc")
            if isinstance(runc, Table):
                c = _table(cri, "containerd", super_table=True)
                r = _table(c, "runtimes", super_table=True)
                r["runc"] = copy.deepcopy(runc)
    plugins[root] = cri
    doc["plugins"] = plugins
    changes: list[str] = []
    _edit_cri(cri, s, version, changes)
    if version == 3:
        # Only keep what gpukit sets; the copied runc table served to derive the options.
        runtimes = cri["containerd"]["runtimes"]
        if isinstance(runtimes, Table) and "runc" in runtimes:
            del runtimes["runc"]
    return Edit(path=path, before=None, after=tomlkit.dumps(doc), changes=tuple(changes))


def ensure_import(main_text: str, pattern: str, path: str) -> Edit:
    """Make containerd's main config import `pattern` (e.g. /etc/containerd/conf.d/*.toml)."""
    doc = _parse(main_text, path)
    config_version(doc, path)
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
