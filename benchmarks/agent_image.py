"""The node agent's image as the lab builds it (Containerfile, buildah): size and build times.

    PYTHONPATH=. .venv/bin/python benchmarks/agent_image.py [--keep]

Builds into an empty temporary gpukit cache (its node root linked from the real cache, so no
debootstrap is timed) from a copy of the checkout's build context: cold (nothing in buildah's
storage: the base is imported, dependencies come from PyPI), warm with nothing changed (the
content key matches: no buildah call), and warm after a change to one of gpukit's files
(buildah's layer cache keeps the base and dependency layers). Prints each time and the
image's uncompressed size (buildah's and the archive's) with its ratio to the 150 MB target,
and what its parts hold: gpukit (the agent's packages only), the dependencies, the rest.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

from gpukit.lab import build_context, buildah, images
from gpukit.lab.config import cache_dir

REPO = Path(__file__).resolve().parent.parent
TARGET_BYTES = 150 * 10**6


def copy_context(dst: Path) -> None:
    """The files the build reads (and its Containerfile and ignore files), nothing else."""
    extra = [images.CONTAINERFILE, *build_context.IGNORE_FILES]
    build_context.copy_files(REPO, [*build_context.context_files(REPO), *extra], dst)


def parts(archive: Path) -> dict[str, tuple[int, int]]:
    """Files and bytes of the image's parts: gpukit's packages (by package), its
    dependencies, the Python root."""
    files: dict[str, int] = {}
    with tarfile.open(archive) as tar:
        manifest = tar.extractfile("manifest.json")
        assert manifest is not None
        for name in json.loads(manifest.read())[0]["Layers"]:
            layer_file = tar.extractfile(name)
            assert layer_file is not None
            with tarfile.open(fileobj=layer_file) as layer:
                files |= {m.name.removeprefix("./"): m.size for m in layer if m.isfile()}
    out: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for path, size in files.items():
        segments = path.split("/")
        if path.startswith("opt/gpukit/app/gpukit/"):
            key = "gpukit/" + (segments[4] if len(segments) > 5 else "*.py")
        elif path.startswith("opt/gpukit/lib/"):
            key = "dependencies (opt/gpukit/lib)"
        else:
            key = "python root and the rest"
        out[key][0] += 1
        out[key][1] += size
    return {k: (n, b) for k, (n, b) in sorted(out.items())}


def timed(out: Path, repo: Path, cache: Path) -> float:
    t0 = time.monotonic()
    images.build_agent(out, repo, cache)
    return time.monotonic() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--keep", action="store_true", help="keep the temporary cache")
    args = parser.parse_args()
    real_root = images.node_root(cache_dir())
    if not (real_root / ".complete").exists():
        raise SystemExit(f"no node root at {real_root}: run `make rootfs` first")
    work = Path(tempfile.mkdtemp(prefix="gpukit-agent-image-", dir=cache_dir()))
    cache, repo, out = work / "cache", work / "repo", work / "out"
    (cache / "rootfs").mkdir(parents=True)
    (cache / "rootfs" / "bookworm").symlink_to(real_root)
    out.mkdir()
    copy_context(repo)
    os.environ["GPUKIT_CACHE"] = str(cache)  # buildah's storage goes there too
    os.environ.pop(images.AGENT_MARKER_ENV, None)
    try:
        cold = timed(out, repo, cache)
        unchanged = timed(out, repo, cache)
        changed = repo / "gpukit" / "plugin" / "__init__.py"
        changed.write_text(changed.read_text() + "# a change\n")
        code_change = timed(out, repo, cache)
        size = images.layers_size(out / "node-agent.tar")
        held = parts(out / "node-agent.tar")
        archive = (out / "node-agent.tar").stat().st_size
        found = buildah.image(images.AGENT)
        buildah_says = str(found["size"]) if found else "?"
    finally:
        if not args.keep:
            subprocess.run(buildah.command("rmi", "--all", "--force"), capture_output=True)
            shutil.rmtree(work, ignore_errors=True)
    print(f"node-agent image ({images.AGENT}, built from {images.CONTAINERFILE} by buildah)")
    print(f"  build, cold (empty storage, dependencies from PyPI): {cold:.1f} s")
    print(f"  build, warm, nothing changed:                        {unchanged:.2f} s")
    print(f"  build, warm, one of gpukit's files changed:          {code_change:.1f} s")
    print(
        f"  size, uncompressed: {size / 1e6:.1f} MB (its layers; buildah images: {buildah_says},"
        f" archive file {archive / 1e6:.1f} MB); target {TARGET_BYTES / 1e6:.0f} MB,"
        f" ratio {size / TARGET_BYTES:.2f}"
    )
    for part, (n, b) in held.items():
        print(f"    {part:32} {n:5} files {b / 1e6:8.2f} MB")
    if args.keep:
        print(f"  kept: {work}")


if __name__ == "__main__":
    main()
