"""gpukit's release: one version for the wheel, the sdist, the collection and the agent image.

The version's single source is pyproject.toml's [project] version. The collection's galaxy.yml
must say the same, the collection's CHANGELOG.md must have a `## VERSION` entry, and the agent
image is tagged with it (image_ref). `make dist` runs, in this order:

    python deploy/release.py check          # the versions agree (else exit 2, one line each)
    python deploy/release.py build dist/    # wheel, sdist, collection tarball
    (buildah bud + push oci-archive, see README "Releasing")
    python deploy/release.py sums dist/     # dist/SHA256SUMS over every file in dist/, and
                                            # the agent image's manifest digest (one line)

Run by path from a checkout (no gpukit import: it needs only the standard library and PyYAML).
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
COLLECTION = Path("collections/ansible_collections/gpukit/gpu")
IMAGE_NAME = "gpukit-node-agent"
SUMS = "SHA256SUMS"


def version(repo: Path = REPO) -> str:
    """The release's version: pyproject.toml's [project] version."""
    with (repo / "pyproject.toml").open("rb") as f:
        return str(tomllib.load(f)["project"]["version"])


def galaxy_version(repo: Path = REPO) -> str:
    doc = yaml.safe_load((repo / COLLECTION / "galaxy.yml").read_text())
    return str(doc["version"])


def changelog_versions(repo: Path = REPO) -> list[str]:
    text = (repo / COLLECTION / "CHANGELOG.md").read_text()
    return re.findall(r"^## +v?(\S+)\s*$", text, flags=re.MULTILINE)


def image_ref(ver: str) -> str:
    """The agent image's name and tag for a release: its tag is the release's version."""
    return f"{IMAGE_NAME}:{ver}"


def problems(repo: Path = REPO) -> list[str]:
    """One line per place that does not carry pyproject.toml's version."""
    ver = version(repo)
    out = []
    gv = galaxy_version(repo)
    if gv != ver:
        out.append(f"{COLLECTION}/galaxy.yml: version is {gv}, pyproject.toml's is {ver}")
    if ver not in changelog_versions(repo):
        out.append(f"{COLLECTION}/CHANGELOG.md: has no '## {ver}' entry")
    return out


def build(out: Path, repo: Path = REPO) -> list[Path]:
    """The wheel, the sdist and the collection tarball into OUT (made if missing)."""
    out.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    ver = version(repo)
    # pip wheel builds from a copy, so generated stubs in the checkout do not leak in.
    subprocess.run([py, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(out), str(repo)], check=True)  # fmt: skip
    # The sdist from the tracked (and untracked, not ignored) sources only: no generated stubs.
    with tempfile.TemporaryDirectory() as tmp:
        files = (
            subprocess.run(
                ["git", "ls-files", "-co", "--exclude-standard", "-z"],
                cwd=repo,
                check=True,
                capture_output=True,
            )
            .stdout.decode()
            .split("\0")
        )
        for name in filter(None, files):
            src, dst = repo / name, Path(tmp) / name
            if src.is_file():
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dst)
        subprocess.run([py, "setup.py", "-q", "sdist", "-d", str(out.resolve())], cwd=tmp,
                       check=True, capture_output=True)  # fmt: skip
    # The environment's ansible-galaxy (beside its python), else the one on PATH.
    galaxy = Path(py).parent / "ansible-galaxy"
    cmd = [str(galaxy) if galaxy.exists() else "ansible-galaxy", "collection", "build", "--force",
           "--output-path", str(out), str(repo / COLLECTION)]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True)
    made = [out / f"gpukit-{ver}-py3-none-any.whl", out / f"gpukit-{ver}.tar.gz",
            out / f"gpukit-gpu-{ver}.tar.gz"]  # fmt: skip
    missing = [p.name for p in made if not p.is_file()]
    if missing:
        raise SystemExit(f"release build: {', '.join(missing)} not made in {out}")
    return made


def image_digest(archive: Path) -> str:
    """The manifest digest of the agent image in an OCI archive (its index.json's one
    manifest): what a registry serves it as, `REGISTRY/gpukit-node-agent@<digest>`, once the
    archive is copied there as it is (skopeo copy oci-archive:... docker://...)."""
    import json
    import tarfile

    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        if member is None:
            raise SystemExit(f"{archive}: no index.json: not an OCI archive")
        manifests = json.loads(member.read())["manifests"]
    if len(manifests) != 1:
        raise SystemExit(f"{archive}: {len(manifests)} manifests in index.json, expected one")
    return str(manifests[0]["digest"])


def digest_lines(out: Path) -> list[str]:
    """One line per agent image archive in OUT: its tag and the digest to deploy it by."""
    return [f"{p.name}: {IMAGE_NAME}:{version()} is manifest {image_digest(p)}"
            f" (gpukit_device_plugin_image: REGISTRY/{IMAGE_NAME}@{image_digest(p)})"
            for p in sorted(out.glob(f"{IMAGE_NAME}-*.oci.tar"))]  # fmt: skip


def sums(out: Path) -> Path:
    """OUT/SHA256SUMS over every other file in OUT, in `sha256sum -c` format."""
    lines = []
    for p in sorted(out.iterdir()):
        if p.is_file() and p.name != SUMS:
            lines.append(f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.name}\n")
    target = out / SUMS
    target.write_text("".join(lines))
    return target


def main(argv: list[str]) -> int:
    cmd = argv[0] if argv else ""
    if cmd == "version":
        print(version())
        return 0
    if cmd == "image":
        print(image_ref(version()))
        return 0
    if cmd == "check":
        found = problems()
        for line in found:
            print(line, file=sys.stderr)
        return 2 if found else 0
    if cmd == "build" and len(argv) == 2:
        for p in build(Path(argv[1])):
            print(p)
        return 0
    if cmd == "sums" and len(argv) == 2:
        print(sums(Path(argv[1])))
        for line in digest_lines(Path(argv[1])):  # the image's digest beside the sums
            print(line)
        return 0
    print("usage: release.py version | image | check | build DIR | sums DIR", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
