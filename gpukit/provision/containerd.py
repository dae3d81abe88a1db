"""How containerd reads its config, checked against containerd 1.7.35 and 2.2.9: the files it
loads (the main file, then `imports`, breadth first), how it merges them, and its own verdict
(`containerd config dump`, run on a private copy of the planned files).

- Imports are loaded only when a loaded file names them: containerd 2's dump lists
  `/etc/containerd/conf.d/*.toml` among `imports` even when nothing imports it, but that
  directory is not read then (tried with a drop-in there). A relative import is relative to
  the importing file's directory; a pattern with `*` is a Go glob (hidden files included,
  matches sorted per directory level); a file is loaded once.
- containerd 1.7 (config version 2) replaces a plugin's whole table with the table of the
  file loaded last; containerd 2 merges plugin tables key by key (an array is replaced, not
  appended) and migrates version-2 files in memory to the version-3 layout.
- containerd 2 keeps the `version` of the last file that has one, so files of mixed versions
  merge wrongly (a version-3 main file with a version-2 drop-in loses the drop-in's runtimes;
  a version-2 main file with a version-3 drop-in loses the main file's CRI settings).
  containerd 1.7 refuses version 3 anywhere.
"""

from __future__ import annotations

import copy
import fnmatch
import glob
import os
import re
import subprocess
import tempfile
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import tomlkit
from tomlkit.exceptions import TOMLKitError

CRI_V2 = "io.containerd.grpc.v1.cri"
CRI_RUNTIME_V3 = "io.containerd.cri.v1.runtime"
CRI_IMAGES_V3 = "io.containerd.cri.v1.images"
# Top-level keys of containerd's config (1.7 and 2.x): anything else is not containerd's.
TOP_LEVEL_KEYS = frozenset({
    "version", "root", "state", "temp", "plugin_dir", "grpc", "ttrpc", "debug", "metrics",
    "disabled_plugins", "required_plugins", "plugins", "oom_score", "cgroup", "proxy_plugins",
    "timeouts", "imports", "stream_processors",
})  # fmt: skip

# The planned state of some files (None: the file is removed); other files are read from disk.
Files = Mapping[str, str | None]


class DumpError(RuntimeError):
    """`containerd config dump` refused the config; the message is containerd's."""


def read(path: str, files: Files | None = None) -> str | None:
    if files is not None and path in files:
        return files[path]
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None


def _matches(pattern: str, path: str) -> bool:
    pat, name = pattern.split("/"), path.split("/")
    return len(pat) == len(name) and all(map(fnmatch.fnmatchcase, name, pat))


def go_glob(pattern: str, files: Files | None = None) -> list[str]:
    """filepath.Glob as containerd uses it, over the disk with `files` laid on top."""
    found = set(glob.glob(pattern, include_hidden=True))
    for path, text in (files or {}).items():
        if text is None:
            found.discard(path)
        elif _matches(pattern, path):
            found.add(path)
    return sorted(found, key=lambda p: p.split("/"))


def resolve_imports(parent: str, imports: list[Any], files: Files | None = None) -> list[str]:
    out: list[str] = []
    for item in imports:
        path = os.path.normpath(str(item))
        if not os.path.isabs(path):
            path = os.path.normpath(os.path.join(os.path.dirname(parent), path))  # Go's Join
        out += go_glob(path, files) if "*" in path else [path]
    return out


def _imports_of(text: str) -> list[Any]:
    try:
        imports = tomllib.loads(text).get("imports", [])
    except tomllib.TOMLDecodeError:
        return []
    return imports if isinstance(imports, list) else []


def load_order(main_path: str, files: Files | None = None) -> list[tuple[str, str | None]]:
    """Every file containerd loads, in its order, with its text (None: missing, where
    containerd stops loading)."""
    out: list[tuple[str, str | None]] = []
    pending, loaded = [main_path], set()
    while pending:
        path = pending.pop(0)
        if path in loaded:
            continue
        loaded.add(path)
        text = read(path, files)
        out.append((path, text))
        if text is None:
            break
        pending += resolve_imports(path, _imports_of(text), files)
    return out


def _deep_merge(into: dict[str, Any], new: Mapping[str, Any]) -> None:
    for key, value in new.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _deep_merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)


def merge(docs: list[Mapping[str, Any]], version: int) -> dict[str, Any]:
    """The files' raw merged config (before containerd's defaults and migrations)."""
    out: dict[str, Any] = {}
    for doc in docs:
        for key, value in doc.items():
            if key == "plugins" and isinstance(value, Mapping):
                plugins = out.setdefault("plugins", {})
                for name, table in value.items():
                    if version == 2 or not isinstance(plugins.get(name), dict):
                        plugins[name] = copy.deepcopy(table)  # 1.7: the whole table
                    elif isinstance(table, Mapping):
                        _deep_merge(plugins[name], table)
            elif isinstance(value, list) and isinstance(out.get(key), list):
                out[key] += [v for v in value if v not in out[key]]
            elif isinstance(value, Mapping) and isinstance(out.get(key), dict):
                _deep_merge(out[key], value)
            else:
                out[key] = copy.deepcopy(value)
    return out


def stage(main_path: str, files: Files | None, into: Path) -> tuple[Path, dict[str, str]]:
    """Copy the files containerd would load into `into`, each file's imports rewritten to the
    copies (globs expanded), so that containerd can judge a plan that is not on disk.
    Returns the staged main file and {staged path: real path}."""
    names: dict[str, Path] = {}

    def staged(path: str) -> Path:
        if path not in names:
            names[path] = into / f"{len(names):03d}-{Path(path).name or 'config'}"
        return names[path]

    staged(main_path)
    for path, text in load_order(main_path, files):
        if text is None:
            continue  # stays absent in the copy too
        try:
            doc = tomlkit.parse(text)
        except TOMLKitError:
            staged(path).write_text(text, encoding="utf-8")  # containerd reports it
            continue
        imports = doc.get("imports")
        if isinstance(imports, list):
            real = resolve_imports(path, list(imports), files)
            doc["imports"] = [str(staged(p)) for p in real]
        staged(path).write_text(tomlkit.dumps(doc), encoding="utf-8")
    return names[main_path], {str(v): k for k, v in names.items()}


def binary_version(binary: str) -> tuple[int, int] | None:
    """containerd's (major, minor) from `containerd --version`."""
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"\sv?(\d+)\.(\d+)\.\d+", out.stdout)
    return (int(m.group(1)), int(m.group(2))) if m else None


def dump(binary: str, main_path: str, files: Files | None = None) -> dict[str, Any]:
    """containerd's effective config for `main_path` with `files` laid on top, as
    `containerd config dump` prints it, without `imports` (the copies' paths)."""
    with tempfile.TemporaryDirectory(prefix="gpukit-containerd-") as tmp:
        main, real = stage(main_path, files, Path(tmp))
        try:
            proc = subprocess.run([binary, "--config", str(main), "config", "dump"],
                                  capture_output=True, text=True, timeout=60, cwd=tmp)  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as e:
            raise DumpError(f"{binary} config dump: {e}") from e
    if proc.returncode != 0:
        msg = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        for staged_path, path in real.items():
            msg = msg.replace(staged_path, path)
        raise DumpError(f"{binary} config dump: {msg}")
    config = tomllib.loads(proc.stdout)
    config.pop("imports", None)
    return config


def _walk(before: Any, after: Any, where: str) -> Iterator[str]:
    if isinstance(before, dict) and isinstance(after, dict):
        for key in sorted(set(before) | set(after), key=str):
            at = f"{where}.{key}" if where else str(key)
            if key not in before:
                yield f"{at}: added"
            elif key not in after:
                yield f"{at}: removed"
            else:
                yield from _walk(before[key], after[key], at)
    elif before != after:
        yield f"{where}: {before!r} -> {after!r}"


def differences(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """What differs between two effective configs, one line per key (dotted path)."""
    return list(_walk(dict(before), dict(after), ""))

