"""Lab figures: cold build time (if asked), `lab up` to all nodes Ready with
binaries cached (target <= 90 s), `lab down` time, and the lab's peak memory.

    .venv/bin/python benchmarks/lab_up.py [--cold]

--cold rebuilds Kubernetes and the node root into a temporary cache first.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from gpukit.lab import cgroups, cluster
from gpukit.lab.config import load_spec

REPO = Path(__file__).resolve().parent.parent
TARGET_UP_S = 90.0


def lab_rss_mib() -> float:
    """Resident memory of every lab process: control plane plus all node cgroups."""
    spec = load_spec()
    t = cluster.table()
    pids = {p.pid for n in t.names() if (p := t.get(n)) is not None and p.alive()}
    for n in spec.nodes:
        pids |= cgroups.procs(n.name)
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cold", action="store_true", help="also time a cold build")
    args = ap.parse_args()
    spec = load_spec()
    if args.cold:
        env = {**os.environ, "GPUKIT_CACHE": tempfile.mkdtemp(prefix="gpukit-cold-")}
        t0 = time.monotonic()
        subprocess.run(["bash", str(REPO / "lab/scripts/build-kubernetes.sh")], env=env, check=True)
        k8s = time.monotonic() - t0
        t0 = time.monotonic()
        subprocess.run(["bash", str(REPO / "lab/scripts/build-rootfs.sh")], env=env, check=True)
        print(f"cold build: kubernetes {k8s:.0f} s, node root {time.monotonic() - t0:.0f} s")
    if cluster.status(spec).anything:
        cluster.down(spec, say=lambda _m: None)
    peak = 0.0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, lab_rss_mib())
            time.sleep(1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.monotonic()
    cluster.up(spec, say=lambda _m: None)
    up_s = time.monotonic() - t0
    time.sleep(10)  # let the nodes settle before reading their steady memory
    steady = lab_rss_mib()
    done.set()
    sampler.join()
    t0 = time.monotonic()
    cluster.down(spec, say=lambda _m: None)
    down_s = time.monotonic() - t0
    print(f"nodes: {len(spec.nodes)} ({', '.join(n.profile for n in spec.nodes)})")
    print(
        f"lab up to all nodes Ready (cached): {up_s:.1f} s  (target {TARGET_UP_S:.0f} s,"
        f" ratio {up_s / TARGET_UP_S:.2f})"
    )
    print(f"lab down: {down_s:.1f} s")
    print(f"lab memory: peak {max(peak, steady):.0f} MiB, steady {steady:.0f} MiB (RSS sum)")


if __name__ == "__main__":
    main()
