"""Copy Debian's python3 out of a Debian root into a new, minimal root.

    python3 deploy/python_root.py OUT [--root /] [--package python3-minimal ...]
                                      [--libraries-for DIR ...]

The node agent's image runs on this root (FROM scratch): the files of the named packages
and of every package they depend on (Depends and Pre-Depends, followed through the
installed alternatives and virtual packages), as dpkg recorded them. Essential packages
(dpkg, coreutils, bash, ...) are left out: Debian lets nothing depend on them, they are the
package manager's and the shell's tools, and a root without a package manager needs none.
Documentation is left out too, except each package's copyright file, and so are glibc's
iconv modules. With --libraries-for, the shared libraries that the ELF files under DIR (the
extension modules of the wheels to run here) link against and do not bundle are taken too,
with the packages that hold them (grpcio's, for one, links libstdc++). Then every ELF file
of the new root and of those directories must find each library it needs in the new root
or beside it, or the build fails naming them; and the new root's python3 must import every extension
module under those directories (run in it with chroot). Added beside the
packages' files: /etc/passwd and /etc/group with root's and nobody's entries only, and the
OS release files.

Run with the Debian stage's own python3 (standard library only).
"""

from __future__ import annotations

import argparse
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

DEFAULT_PACKAGES = ("python3-minimal", "libpython3-stdlib")
# Documentation and package-manager data no program reads at run time.
SKIP_PREFIXES = (
    "/usr/share/doc/", "/usr/share/man/", "/usr/share/info/", "/usr/share/lintian/",
    "/usr/share/bug/", "/usr/share/doc-base/", "/usr/share/locale/",
)  # fmt: skip
KEEP_UNDER_SKIPPED = ("/copyright",)
# glibc's iconv modules (8 MB): Python's codecs are its own, nothing in the image calls iconv.
SKIP_DIRS = ("/gconv/",)
USERS = ("root", "nobody")
GROUPS = ("root", "nogroup")
EXTRA_FILES = ("/etc/os-release", "/usr/lib/os-release", "/etc/debian_version")


class RootError(Exception):
    """The Debian root lacks something the closure needs."""


def parse_status(text: str) -> dict[str, dict[str, str]]:
    """dpkg's status file: package name -> its fields (installed packages only)."""
    packages: dict[str, dict[str, str]] = {}
    for stanza in text.split("\n\n"):
        fields: dict[str, str] = {}
        key = ""
        for line in stanza.splitlines():
            if line[:1] in (" ", "\t") and key:
                fields[key] += "\n" + line.strip()
            elif ":" in line:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        if fields.get("Package") and fields.get("Status", "").endswith(" installed"):
            packages[fields["Package"]] = fields
    return packages


def _alternatives(field: str) -> list[list[str]]:
    """'a (>= 1) | b, c:any' -> [['a', 'b'], ['c']]: names only, version and arch dropped."""
    groups = []
    for group in field.split(","):
        names = [alt.split("(")[0].strip().split(":")[0] for alt in group.split("|")]
        if names and names[0]:
            groups.append(names)
    return groups


def closure(packages: dict[str, dict[str, str]], roots: list[str]) -> list[str]:
    """The roots and every installed package they need, Essential ones left out."""
    provides: dict[str, list[str]] = {}
    for name, fields in packages.items():
        for (virtual,) in (g[:1] for g in _alternatives(fields.get("Provides", ""))):
            provides.setdefault(virtual, []).append(name)

    def installed(name: str) -> str | None:
        if name in packages:
            return name
        return next(iter(sorted(provides.get(name, []))), None)

    needed: set[str] = set()
    todo = list(roots)
    for root in roots:
        if installed(root) is None:
            raise RootError(f"package {root} is not installed in the Debian root")
    while todo:
        found = installed(todo.pop())
        if found is None or found in needed or packages[found].get("Essential") == "yes":
            continue
        name = found
        needed.add(name)
        fields = packages[name]
        for field in ("Pre-Depends", "Depends"):
            for group in _alternatives(fields.get(field, "")):
                chosen = next((n for n in map(installed, group) if n is not None), None)
                if chosen is None:
                    raise RootError(f"{name} depends on {' | '.join(group)}: none is installed")
                todo.append(chosen)
    return sorted(needed)


def package_files(root: Path, package: str, arch: str) -> list[str]:
    info = root / "var/lib/dpkg/info"
    for name in (f"{package}:{arch}.list", f"{package}.list"):
        if (info / name).is_file():
            return (info / name).read_text().splitlines()
    raise RootError(f"no file list for {package} in {info}")


def wanted(path: str) -> bool:
    if path in ("", "/.") or not path.startswith("/"):
        return False
    if any(d in path + "/" for d in SKIP_DIRS):
        return False
    skipped = any(path.startswith(p) for p in SKIP_PREFIXES)
    return not skipped or path.endswith(KEEP_UNDER_SKIPPED)


def copy_entry(root: Path, out: Path, path: str) -> None:
    """Copy one path (a directory, file or symlink) from root to out, its parents first."""
    src, dst = root / path.lstrip("/"), out / path.lstrip("/")
    if not os.path.lexists(src) or os.path.lexists(dst):
        return  # listed but removed (a dpkg diversion), or copied already
    parent = str(Path(path).parent)
    if parent != "/":
        copy_entry(root, out, parent)
    if src.is_symlink():
        os.symlink(os.readlink(src), dst)
    elif src.is_dir():
        dst.mkdir()
        shutil.copystat(src, dst)
    else:
        shutil.copy2(src, dst)


def needed_libraries(path: Path) -> list[str]:
    """The DT_NEEDED entries of an ELF file (64-bit little-endian; [] for anything else)."""
    with open(path, "rb") as f:
        if f.read(6) != b"\x7fELF\x02\x01":
            return []
    data = path.read_bytes()
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    # Section headers: (name, type, flags, addr, offset, size, link, info, align, entsize)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
                for i in range(shnum)]  # fmt: skip
    names = []
    for sec in sections:
        if sec[1] != 6:  # SHT_DYNAMIC
            continue
        strings = sections[sec[6]][4]
        for at in range(sec[4], sec[4] + sec[5], 16):
            tag, value = struct.unpack_from("<qQ", data, at)
            if tag == 0:
                break
            if tag == 1:  # DT_NEEDED
                start = strings + value
                names.append(data[start : data.index(b"\0", start)].decode())
    return names


def _elf_files(top: Path) -> list[Path]:
    found = []
    for dirpath, _dirs, files in os.walk(top):
        for name in files:
            path = Path(dirpath, name)
            is_file = path.is_file() and not path.is_symlink()
            if is_file and (".so" in name or os.access(path, os.X_OK)):
                found.append(path)
    return found


def _library_names(top: Path) -> set[str]:
    """The file names of shared libraries under top (what a soname resolves to)."""
    return {p.name for p in top.rglob("*.so*")}


def _library_owners(root: Path, packages: dict[str, dict[str, str]], arch: str) -> dict[str, str]:
    """Shared library file name -> the installed package holding it in a library directory."""
    owners: dict[str, str] = {}
    for name in sorted(packages):
        for path in package_files(root, name, arch):
            if "/lib" in path and ".so" in path.rsplit("/", 1)[-1]:
                owners.setdefault(path.rsplit("/", 1)[-1], name)
    return owners


def missing_libraries(out: Path, extra: list[Path]) -> dict[str, list[str]]:
    """Library -> the files needing it, for the libraries neither the new root nor the
    directories beside it hold."""
    have = _library_names(out) | {n for d in extra for n in _library_names(d)}
    missing: dict[str, list[str]] = {}
    for top in [out, *extra]:
        for path in _elf_files(top):
            for lib in needed_libraries(path):
                if lib not in have:
                    missing.setdefault(lib, []).append(str(path))
    return missing


# Run by the new root's python3 (chroot): import every extension module under a directory.
_IMPORT_EXTENSIONS = """
import importlib, importlib.machinery, os, sys
top = sys.argv[1]
sys.path.insert(0, top)
failed = []
for dirpath, _dirs, files in sorted(os.walk(top)):
    for name in sorted(files):
        suffix = next((s for s in importlib.machinery.EXTENSION_SUFFIXES if name.endswith(s)), "")
        if suffix:
            module = os.path.relpath(os.path.join(dirpath, name[: -len(suffix)]), top)
            try:
                importlib.import_module(module.replace(os.sep, "."))
            except Exception as exc:
                failed.append(f"{module}: {exc}")
print("\\n".join(failed))
sys.exit(1 if failed else 0)
"""


def check_imports(out: Path, directories: tuple[Path, ...]) -> None:
    """The new root's python3 imports every extension module under each directory (put into
    the root for the check, as hard links, and taken out again)."""
    for top in directories:
        inside = out / top.resolve().relative_to("/")
        first = next(p for p in [*reversed(inside.parents), inside] if not p.exists())
        inside.parent.mkdir(parents=True, exist_ok=True)
        try:
            shutil.copytree(top, inside, symlinks=True, copy_function=os.link)
            r = subprocess.run(
                ["chroot", str(out), "/usr/bin/python3", "-c", _IMPORT_EXTENSIONS, f"/{top}"],
                capture_output=True, text=True,
                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONDONTWRITEBYTECODE": "1"},
            )  # fmt: skip
        finally:
            shutil.rmtree(first)
        if r.returncode != 0:
            raise RootError(f"the new root's python3 cannot import from {top}: "
                            f"{(r.stdout + r.stderr).strip()}")  # fmt: skip


def _accounts(text: str, names: tuple[str, ...]) -> str:
    return "".join(f"{line}\n" for line in text.splitlines() if line.split(":")[0] in names)


def build(
    root: Path, out: Path, roots: list[str], libraries_for: tuple[Path, ...] = ()
) -> list[str]:
    """Write the minimal root into out (empty or missing); return the packages copied."""
    packages = parse_status((root / "var/lib/dpkg/status").read_text())
    arch = packages.get("dpkg", {}).get("Architecture", "amd64")
    roots = list(roots)
    if libraries_for:
        owners = _library_owners(root, packages, arch)
        bundled = {n for d in libraries_for for n in _library_names(d)}
        for top in libraries_for:
            for elf in _elf_files(top):
                for lib in needed_libraries(elf):
                    if lib not in bundled and lib in owners and owners[lib] not in roots:
                        roots.append(owners[lib])
    names = closure(packages, roots)
    out.mkdir(parents=True, exist_ok=True)
    # Merged /usr: /bin, /lib, /lib64, /sbin are symlinks no package lists; dpkg's paths
    # go through them.
    for top in sorted(root.iterdir()):
        if top.is_symlink() and not os.path.lexists(out / top.name):
            os.symlink(os.readlink(top), out / top.name)
            target = os.path.normpath(os.path.join("/", os.readlink(top)))
            copy_entry(root, out, target)  # so that paths through the link have a parent
    for name in names:
        for path in package_files(root, name, arch):
            if wanted(path):
                copy_entry(root, out, path)
    for path in EXTRA_FILES:
        copy_entry(root, out, path)
    (out / "etc").mkdir(exist_ok=True)
    (out / "etc/passwd").write_text(_accounts((root / "etc/passwd").read_text(), USERS))
    (out / "etc/group").write_text(_accounts((root / "etc/group").read_text(), GROUPS))
    missing = missing_libraries(out, list(libraries_for))
    if missing:
        raise RootError("libraries missing: " + "; ".join(
            f"{lib} (needed by {', '.join(sorted(users)[:3])})"
            for lib, users in sorted(missing.items())))  # fmt: skip
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("out", type=Path, help="the new root (created; must be empty)")
    parser.add_argument("--root", type=Path, default=Path("/"), help="the Debian root")
    default = " ".join(DEFAULT_PACKAGES)
    parser.add_argument("--package", action="append", dest="packages",
                        help=f"a package to take (repeatable; default {default})")  # fmt: skip
    parser.add_argument("--libraries-for", action="append", type=Path, default=[],
                        metavar="DIR", help="take the libraries ELF files under DIR need",
                        )  # fmt: skip
    args = parser.parse_args(argv)
    if args.out.exists() and any(args.out.iterdir()):
        parser.error(f"out: {args.out} is not empty")
    try:
        roots = args.packages or list(DEFAULT_PACKAGES)
        names = build(args.root, args.out, roots, tuple(args.libraries_for))
        check_imports(args.out, tuple(args.libraries_for))
    except (RootError, OSError) as exc:
        print(f"python_root: {exc}", file=sys.stderr)
        return 1
    print(f"python_root: {len(names)} packages: {' '.join(names)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
