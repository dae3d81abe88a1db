"""The upstream decoder of DRA device metadata files, as a program the tests run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from gpukit.lab.config import DEFAULT_K8S_VERSION

HERE = Path(__file__).resolve().parent
# k8s.io/dynamic-resource-allocation is released with Kubernetes as v0.<minor>.<patch>.
MODULE = "k8s.io/dynamic-resource-allocation"
VERSION = "v0" + DEFAULT_K8S_VERSION.removeprefix("v1")


def binary() -> Path:
    """The reader built from the module (cached; about a minute the first time). A failed
    build raises with go's output: the tests fail, they never skip."""
    cache = Path(os.environ.get("GPUKIT_CACHE") or Path.home() / ".cache" / "gpukit")
    out = cache / "tools" / f"dra-metadata-reader-{VERSION}"
    if os.access(out, os.X_OK):
        return out
    go = shutil.which("go") or "/usr/local/go/bin/go"
    with tempfile.TemporaryDirectory(prefix="gpukit-metadata-reader-") as tmp:
        shutil.copy(HERE / "main.go", tmp)
        env = {**os.environ, "GOFLAGS": "-mod=mod", "CGO_ENABLED": "0"}
        for cmd in ([go, "mod", "init", "gpukit.test/metadatareader"],
                    [go, "get", f"{MODULE}@{VERSION}"],
                    [go, "build", "-o", str(out) + ".new", "."]):  # fmt: skip
            r = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=600)
            if r.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr[-2000:]}")
    os.replace(str(out) + ".new", out)
    return out


def read(*paths: Path) -> list[dict[str, Any]]:
    r = subprocess.run([str(binary()), *map(str, paths)], capture_output=True, text=True,
                       timeout=60, check=True)  # fmt: skip
    return [json.loads(line) for line in r.stdout.splitlines()]
