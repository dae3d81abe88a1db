"""Build one Debian binary package from a declarative spec, reproducibly.

Every file gets the same mtime (``SOURCE_DATE_EPOCH``) and root ownership
(``dpkg-deb --root-owner-group``), so building the same spec twice gives the same bytes:
a rebuilt repository that did not change is not a change for apt or for Ansible.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

# 2024-01-01T00:00:00Z: the timestamp of every file in every stand-in package.
EPOCH = 1704067200
ARCH = "amd64"

# Every maintainer script starts with this: a lab test makes a package's script fail on
# purpose by listing the package (or `*`) in /etc/gpukit-lab/fail-<script> on the node.
FAIL_HOOK = """\
if [ -f /etc/gpukit-lab/fail-{script} ] && \
grep -qxE "$DPKG_MAINTSCRIPT_PACKAGE|\\*" /etc/gpukit-lab/fail-{script}; then
  echo "$DPKG_MAINTSCRIPT_PACKAGE {script}: failing on purpose (/etc/gpukit-lab/fail-{script})" >&2
  exit 1
fi
"""


class PackageError(RuntimeError):
    """A package could not be built; the message names the package and the tool's output."""


@dataclass(frozen=True)
class File:
    """A file in a package: literal content, a copy of a host file, or a symbolic link (`link`:
    its target, as the driver's soname links `libcuda.so.1 -> libcuda.so.<version>`)."""

    content: bytes | None = None
    source: Path | None = None
    mode: int = 0o644
    conffile: bool = False
    link: str | None = None

    def data(self) -> bytes:
        if self.link is not None:
            return self.link.encode()
        if self.content is not None:
            return self.content
        if self.source is None:
            raise PackageError("a package file needs content or a source")
        return self.source.read_bytes()


def text(s: str, mode: int = 0o644, conffile: bool = False) -> File:
    return File(content=s.encode(), mode=mode, conffile=conffile)


def symlink(target: str) -> File:
    return File(link=target, mode=0o777)


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    description: str
    files: Mapping[str, File] = field(default_factory=dict)
    depends: tuple[str, ...] = ()
    provides: tuple[str, ...] = ()
    conflicts: tuple[str, ...] = ()
    replaces: tuple[str, ...] = ()
    section: str = "non-free/libs"
    # Maintainer scripts (shell bodies; the failure hook and `set -e` are added).
    postinst: str = ""
    prerm: str = ""
    postrm: str = ""
    # A package whose postinst always fails (e.g. a broken upgrade in the repository).
    postinst_fails: bool = False

    @property
    def filename(self) -> str:
        return f"{self.name}_{self.version}_{ARCH}.deb"

    def control(self) -> str:
        fields = [
            ("Package", self.name),
            ("Version", self.version),
            ("Architecture", ARCH),
            ("Maintainer", "gpukit lab <lab@gpukit.invalid>"),
            ("Section", self.section),
            ("Priority", "optional"),
            ("Depends", ", ".join(self.depends)),
            ("Provides", ", ".join(self.provides)),
            ("Conflicts", ", ".join(self.conflicts)),
            ("Replaces", ", ".join(self.replaces)),
        ]
        lines = [f"{k}: {v}" for k, v in fields if v]
        summary, _, body = self.description.partition("\n")
        lines.append(f"Description: {summary}")
        for line in body.strip().splitlines():
            lines.append(" " + (line if line.strip() else "."))
        lines.append(" (A stand-in package built by the gpukit lab; it drives no hardware.)")
        return "\n".join(lines) + "\n"

    def script(self, name: str) -> str:
        body = {"postinst": self.postinst, "prerm": self.prerm, "postrm": self.postrm}[name]
        if name == "postinst" and self.postinst_fails:
            body = f'echo "{self.name} postinst: this build is broken on purpose" >&2\nexit 1\n'
        # Every package has every script, so a test can make any of them fail.
        return "#!/bin/sh\nset -e\n" + FAIL_HOOK.format(script=name) + body


def build(pkg: Package, out_dir: Path, compression: str = "xz") -> Path:
    """Build `pkg` into `out_dir`; returns the .deb path. `compression`: dpkg-deb's -Z (gzip
    builds large binaries several times faster than xz)."""
    if shutil.which("dpkg-deb") is None:
        raise PackageError("dpkg-deb is missing: install the `dpkg` package")
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"gpukit-deb-{pkg.name}-") as tmp:
        root = Path(tmp) / "root"
        debian = root / "DEBIAN"
        debian.mkdir(parents=True)
        for path, f in sorted(pkg.files.items()):
            if not path.startswith("/"):
                raise PackageError(f"{pkg.name}: file path {path!r} must be absolute")
            target = root / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            if f.link is not None:
                target.symlink_to(f.link)
                continue
            target.write_bytes(f.data())
            target.chmod(f.mode)
        (debian / "control").write_text(pkg.control())
        conffiles = [p for p, f in sorted(pkg.files.items()) if f.conffile and f.link is None]
        if conffiles:
            (debian / "conffiles").write_text("\n".join(conffiles) + "\n")
        for name in ("postinst", "prerm", "postrm"):
            (debian / name).write_text(pkg.script(name))
            (debian / name).chmod(0o755)
        for dirpath, dirnames, filenames in os.walk(root):
            for d in dirnames:
                (Path(dirpath) / d).chmod(0o755)
            for n in (*dirnames, *filenames):
                os.utime(Path(dirpath) / n, (EPOCH, EPOCH), follow_symlinks=False)
        os.utime(root, (EPOCH, EPOCH))
        target = out_dir / pkg.filename
        env = {**os.environ, "SOURCE_DATE_EPOCH": str(EPOCH)}
        r = subprocess.run(
            ["dpkg-deb", "--root-owner-group", f"-Z{compression}", "--build", str(root),
             str(target)],
            capture_output=True, text=True, env=env,
        )  # fmt: skip
        if r.returncode != 0:
            raise PackageError(f"dpkg-deb --build {pkg.name} failed: {r.stderr.strip()}")
    return target
