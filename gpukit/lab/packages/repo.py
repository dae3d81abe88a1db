"""A local, signed, flat apt repository of the stand-in packages.

Layout (``deb [signed-by=<keyring>] file:<dir> ./``, or in deb822 ``Suites: ./``)::

    <dir>/*.deb  Packages  Packages.gz  Release  Release.gpg  InRelease
    <dir>/gpukit-lab-archive.asc       the public key nodes trust (a keyring for signed-by)

The lab serves it read-only into every node at ``/opt/gpukit-lab/apt`` (the lab's shared
directory). The index is built with ``dpkg-scanpackages --multiversion`` (several versions
of one package, as vendor repositories have) and ``apt-ftparchive release``; the Release
file is signed with a key kept in the lab's state directory, so nodes verify the repository
through a keyring like any vendor repository, without ``trusted=yes``.

Builds are reproducible and skipped when nothing changed (the inputs' digest is stored in
``<dir>/.inputs``), so a node's apt sees the same repository until a package changes.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from gpukit.lab.packages import catalog, deb

KEY_NAME = "gpukit-lab-archive.asc"
KEY_UID = "gpukit lab archive <lab@gpukit.invalid>"
ORIGIN = "gpukit-lab"


class RepoError(RuntimeError):
    """The repository could not be built; the message names the step and what to install."""


def _require(tool: str, package: str) -> None:
    if shutil.which(tool) is None:
        raise RepoError(f"{tool} is missing: install the Debian package `{package}` on this host")


def _run(argv: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise RepoError(f"{' '.join(argv)} failed: {(r.stderr or r.stdout).strip()}")
    return r.stdout


def _inputs_digest(packages: list[deb.Package], prebuilt: tuple[Path, ...]) -> str:
    h = hashlib.sha256()
    for deb_file in prebuilt:
        h.update(deb_file.name.encode())
        h.update(hashlib.sha256(deb_file.read_bytes()).digest())
    for pkg in sorted(packages, key=lambda p: (p.name, p.version)):
        h.update(pkg.control().encode())
        for name in ("postinst", "prerm", "postrm"):
            h.update(pkg.script(name).encode())
        for path, f in sorted(pkg.files.items()):
            h.update(path.encode())
            h.update(f"{f.mode:o}{f.conffile}".encode())
            h.update(hashlib.sha256(f.data()).digest())
    h.update(Path(deb.__file__).read_bytes())
    h.update(Path(__file__).read_bytes())
    return h.hexdigest()


def signing_home(state: Path) -> Path:
    """The GnuPG home holding the lab's archive key (created on first use)."""
    home = state / "apt-signing"
    if not (home / ".created").exists():
        _require("gpg", "gnupg")
        shutil.rmtree(home, ignore_errors=True)
        home.mkdir(parents=True, mode=0o700)
        try:
            _run(
                ["gpg", "--batch", "--homedir", str(home), "--pinentry-mode", "loopback",
                 "--passphrase", "", "--quick-gen-key", KEY_UID, "ed25519", "sign", "never"],
            )  # fmt: skip
        finally:
            _stop_agent(home)
        (home / ".created").touch()
    return home


def _stop_agent(home: Path) -> None:
    """gpg starts a gpg-agent for the key; the lab leaves no process behind."""
    subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"],
                   capture_output=True, check=False)  # fmt: skip


def _sign(home: Path, repo: Path) -> None:
    gpg = ["gpg", "--batch", "--yes", "--homedir", str(home), "--local-user", KEY_UID]
    try:
        _run([*gpg, "--clearsign", "-o", str(repo / "InRelease"), str(repo / "Release")])
        _run([*gpg, "--armor", "--detach-sign", "-o", str(repo / "Release.gpg"),
              str(repo / "Release")])  # fmt: skip
        key = _run(["gpg", "--batch", "--homedir", str(home), "--armor", "--export", KEY_UID])
    finally:
        _stop_agent(home)
    (repo / KEY_NAME).write_text(key)


def build(
    out: Path,
    state: Path,
    src: catalog.Sources,
    force: bool = False,
    prebuilt: tuple[Path, ...] = (),
) -> Path:
    """Build (or keep) the repository at `out`; the signing key lives under `state`.
    `prebuilt`: .deb files served as they are (built elsewhere, e.g. containerd's)."""
    _require("dpkg-scanpackages", "dpkg-dev")
    _require("apt-ftparchive", "apt-utils")
    if not src.nvml_lib.exists():
        raise RepoError(f"{src.nvml_lib} is missing: run `make nvml` (the driver package ships it)")
    packages = catalog.all_packages(src)
    digest = _inputs_digest(packages, prebuilt)
    home = signing_home(state)
    stamp = out / ".inputs"
    if not force and stamp.exists() and stamp.read_text() == digest and (out / KEY_NAME).exists():
        return out
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for pkg in packages:
        deb.build(pkg, tmp)
    for path in prebuilt:
        shutil.copyfile(path, tmp / path.name)
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(deb.EPOCH)}
    index = _run(["dpkg-scanpackages", "--multiversion", ".", "/dev/null"], cwd=tmp, env=env)
    (tmp / "Packages").write_text(index)
    with (
        open(tmp / "Packages.gz", "wb") as raw,
        gzip.GzipFile(fileobj=raw, mode="wb", filename="", mtime=0) as gz,
    ):
        gz.write(index.encode())
    release = _run(
        ["apt-ftparchive",
         "-o", f"APT::FTPArchive::Release::Origin={ORIGIN}",
         "-o", f"APT::FTPArchive::Release::Label={ORIGIN}",
         "-o", "APT::FTPArchive::Release::Suite=./",
         "-o", "APT::FTPArchive::Release::Architectures=amd64",
         "release", "."],
        cwd=tmp, env=env,
    )  # fmt: skip
    # apt-ftparchive would index a Release file it is writing: write it from its output.
    (tmp / "Release").write_text(release)
    _sign(home, tmp)
    (tmp / ".inputs").write_text(digest)
    for p in tmp.iterdir():
        p.chmod(0o644)
    tmp.chmod(0o755)
    old = out.with_name(out.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if out.exists():
        out.rename(old)
    tmp.rename(out)
    shutil.rmtree(old, ignore_errors=True)
    return out
