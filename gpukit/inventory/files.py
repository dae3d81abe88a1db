"""The inventory's files read with bounds before Ansible parses them.

Ansible's parser has none: a YAML alias bomb in group_vars hung `gpukit inventory check` for
more than a minute (every expanded value is templated), a 10,000-level nested list, a NUL byte
or a binary file ended in a page of traceback. Each file Ansible would read as an inventory
source or a group_vars/host_vars file is checked here first: size, text (UTF-8, no NUL byte),
and, for YAML, nesting depth and alias expansion (contracts.bounded_yaml). A problem is one
line naming the file and, where known, the line.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import yaml

from gpukit.contracts import bounded_yaml

from .problems import MISSING, Problem

# A fleet's inventory: a hosts file of thousands of hosts, anchors shared between groups.
BOUNDS = bounded_yaml.Bounds(max_bytes=8 << 20, max_aliases=1_000, max_depth=100,
                             max_nodes=500_000)
MAX_FILES = 10_000  # files under one inventory directory
VARS_DIRS = ("group_vars", "host_vars")
YAML_SUFFIXES = ("", ".yml", ".yaml", ".json")  # what Ansible reads in *_vars directories
# Files Ansible skips in an inventory directory (its default INVENTORY_IGNORE_EXTS).
IGNORED_SUFFIXES = (".pyc", ".pyo", ".swp", ".bak", "~", ".rpm", ".md", ".txt", ".rst",
                    ".orig", ".cfg", ".retry", ".ini~")


def problems(sources: Sequence[str | Path]) -> list[Problem]:
    """One problem per inventory file that cannot be what Ansible expects (see the module)."""
    found: list[Problem] = []
    for index, (path, is_source, base) in enumerate(_files([Path(s) for s in sources])):
        if index >= MAX_FILES:
            found.append(Problem(None, "inventory", MISSING, f"has more than {MAX_FILES} files "
                                 "(is it the right directory?)"))
            break
        why = _problem(path, is_source)
        if why:
            line, message = why
            shown = path.relative_to(base) if path.is_relative_to(base) else path
            found.append(Problem(None, f"{shown}:{line}" if line else str(shown), MISSING,
                                 message))
    return found


def _files(sources: Sequence[Path]) -> Iterator[tuple[Path, bool, Path]]:
    """(file, is an inventory source, the directory messages name it from) Ansible reads for
    these sources, vars files included."""
    seen: set[Path] = set()
    for source in sources:
        if source.is_dir():
            base = source
            yield from ((p, True, base) for p in _walk(source))
        else:
            base = source.parent
            if source.is_file() and not _executable(source):
                yield source, True, base
        for name in VARS_DIRS:
            vars_dir = base / name
            if vars_dir.is_dir() and vars_dir not in seen:
                seen.add(vars_dir)
                yield from ((p, False, base) for p in _tree(vars_dir)
                            if p.suffix in YAML_SUFFIXES)


def _walk(directory: Path) -> Iterator[Path]:
    """The inventory sources of a directory: its files but vars directories, recursively."""
    for path in sorted(directory.iterdir()):
        if path.name.startswith(".") or path.name in VARS_DIRS:
            continue
        if path.is_dir():
            yield from _walk(path)
        elif path.is_file() and not path.name.endswith(IGNORED_SUFFIXES) \
                and not _executable(path):  # a script inventory is run, not read
            yield path


def _tree(directory: Path) -> Iterator[Path]:
    for root, dirs, names in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        yield from (Path(root) / n for n in sorted(names) if not n.startswith("."))


def _executable(path: Path) -> bool:
    return os.access(path, os.X_OK)


def _problem(path: Path, is_source: bool) -> tuple[int | None, str] | None:
    """(line if known, what is wrong) or None when Ansible may read it."""
    try:
        text = bounded_yaml.read_text(path, BOUNDS.max_bytes)
    except OSError as exc:
        return None, f"cannot be read: {exc.strerror or exc}"
    except bounded_yaml.UnreadableText as exc:
        return None, f"is refused: the file is {exc}"
    try:
        _node, loader = bounded_yaml.compose(text, BOUNDS)
        loader.dispose()
    except bounded_yaml.BoundExceeded as exc:
        return exc.line, f"is refused: the document is {exc}"
    except yaml.YAMLError as exc:
        if path.suffix == ".json" or (is_source and path.suffix not in (".yml", ".yaml")):
            return None  # JSON (tabs), an INI hosts file: Ansible's own parsers decide
        mark = getattr(exc, "problem_mark", None)
        what = " ".join(str(getattr(exc, "problem", None) or exc).split())[:200]
        return mark.line + 1 if mark else None, f"is not valid YAML: {what}"
    except RecursionError:
        return None, "is refused: the document nests too deep to parse"
    return None
