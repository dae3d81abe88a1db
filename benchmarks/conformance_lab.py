"""Time the conformance suite against the provisioned lab (after `make lab`).

    .venv/bin/python benchmarks/conformance_lab.py

Prints the suite's wall time per run and per node, with the ratio to the target.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from gpukit.lab import cluster
from gpukit.lab.config import load_spec

REPO = Path(__file__).resolve().parent.parent
TARGET_S = 120.0


def main() -> None:
    spec = load_spec()
    if not cluster.status(spec).up:
        sys.exit("the lab is not up: run `make lab` first")
    t0 = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "gpukit/conformance", "--lab", "-q",
         "-p", "no:cacheprovider"],
        cwd=REPO, capture_output=True, text=True,
    )  # fmt: skip
    elapsed = time.monotonic() - t0
    summary = (r.stdout.strip().splitlines() or ["(no output)"])[-1]
    print(
        f"conformance suite on {len(spec.nodes)} lab nodes: {elapsed:.1f} s"
        f" ({elapsed / len(spec.nodes):.1f} s per node; target {TARGET_S:.0f} s,"
        f" ratio {elapsed / TARGET_S:.2f})"
    )
    print(f"result: {summary}")


if __name__ == "__main__":
    main()
