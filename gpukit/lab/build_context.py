"""The files a container build reads from its context, as .containerignore lets them through.

Docker's rules (which buildah and podman follow): a pattern matches a path or any of its
parent directories; `*` and `?` stay within one path element, `**` spans any number of
them; a `!pattern` takes matched paths back in; the last matching pattern decides. The
lab keys its agent image on these files, so that a change the build cannot see (a test,
a README) rebuilds nothing.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

IGNORE_FILES = (".containerignore", ".dockerignore")


@dataclass(frozen=True)
class Pattern:
    text: str
    regex: re.Pattern[str]
    negated: bool

    @property
    def literal_prefix(self) -> str:
        """The pattern up to its first wildcard."""
        return re.split(r"[*?\[\\]", self.text, maxsplit=1)[0]


def _translate(pattern: str) -> str:
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**", i):
            i += 2
            if pattern.startswith("/", i):  # "**/": zero or more directories
                out.append("(?:.*/)?")
                i += 1
            else:
                out.append(".*")
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[" and "]" in pattern[i + 1 :]:
            end = pattern.index("]", i + 1)
            body = pattern[i + 1 : end]
            out.append("[" + ("^" + body[1:] if body[:1] in ("!", "^") else body) + "]")
            i = end
        elif c == "\\" and i + 1 < len(pattern):
            i += 1
            out.append(re.escape(pattern[i]))
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def parse_ignore(text: str) -> list[Pattern]:
    patterns = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        body = os.path.normpath(line.removeprefix("!").strip()).lstrip("/")
        if body in ("", "."):
            continue
        patterns.append(Pattern(body, re.compile(_translate(body)), negated))
    return patterns


def ignored(patterns: list[Pattern], rel: str) -> bool:
    parts = rel.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    result = False
    for p in patterns:
        if any(p.regex.fullmatch(x) for x in prefixes):
            result = not p.negated
    return result


def ignore_patterns(context: Path) -> list[Pattern]:
    for name in IGNORE_FILES:
        if (context / name).is_file():
            return parse_ignore((context / name).read_text())
    return []


def context_files(context: Path) -> list[str]:
    """Every file and symlink of the context the build sees, relative, sorted. Symlinks are
    not followed (a build copies them as links)."""
    patterns = ignore_patterns(context)
    takers = [p.literal_prefix for p in patterns if p.negated]
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(context):
        base = Path(dirpath).relative_to(context).as_posix()
        rel_dir = "" if base == "." else base + "/"
        keep = []
        for d in sorted(dirnames):
            rel = rel_dir + d
            if os.path.islink(os.path.join(dirpath, d)):
                filenames.append(d)
            elif not ignored(patterns, rel) or any(
                t.startswith(rel + "/") or (rel + "/").startswith(t) for t in takers
            ):  # something below may be taken back in
                keep.append(d)
        dirnames[:] = keep
        found += [rel_dir + f for f in filenames if not ignored(patterns, rel_dir + f)]
    return sorted(found)


def digest(context: Path, extra: tuple[Path, ...] = ()) -> str:
    """A content key of the context's files (path, kind, mode, bytes or link target) and of
    `extra` files outside the context's rules (the Containerfile, the ignore file)."""
    h = hashlib.sha256()
    for rel in context_files(context):
        path = context / rel
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode):
            h.update(f"L {rel}\0{os.readlink(path)}\0".encode())
        else:
            h.update(f"F {rel}\0{stat.S_IMODE(st.st_mode):o}\0".encode())
            h.update(hashlib.sha256(path.read_bytes()).digest())
    for path in extra:
        h.update(f"X {path.name}\0".encode())
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def copy_files(context: Path, files: Iterable[str], dst: Path) -> None:
    """Copy `files` (relative to `context`, e.g. context_files(context)) into `dst` as the
    build would see them: links stay links."""
    for rel in files:
        src, out = context / rel, dst / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            out.symlink_to(os.readlink(src))
        else:
            shutil.copy2(src, out)
