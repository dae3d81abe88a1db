"""Lab figures per stack, measured side by side in one run: cold build times (if asked),
`lab up` to all nodes Ready with binaries cached (target <= 90 s), `lab down`, and the
lab's peak and steady memory.

    GPUKIT_LAB_INSTANCE=5 .venv/bin/python benchmarks/lab_up.py [--cold] [--stack K8S/CTD ...]

Stacks default to the lab's default (Kubernetes 1.37 on containerd 2) and the oldest
supported one (1.35 on containerd 1.7); each is built first if its cache lacks it. --cold
also builds each stack's Kubernetes and containerd into an empty temporary cache, timed.
The figures of the lab before its move to the current stack (Kubernetes 1.33 on Debian's
containerd 1.6), recorded on this machine type by an earlier run of this benchmark, are
printed beside them: that stack can no longer be brought up.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from gpukit.lab import cgroups, cluster
from gpukit.lab.config import (
    DEFAULT_CONTAINERD_VERSION,
    DEFAULT_K8S_VERSION,
    LabSpec,
    check_versions,
    load_spec,
)

REPO = Path(__file__).resolve().parent.parent
TARGET_UP_S = 90.0
OLDEST = "v1.35.4/v1.7.35"
# Recorded (session 1 note): lab up 22.7 s, 830 MiB RSS, Kubernetes cold build ~6 min.
BEFORE = {"stack": "v1.33.13/1.6.20 (Debian)", "up_s": 22.7, "rss_mib": 830.0, "k8s_build_s": 360.0}


def lab_rss_mib(spec: LabSpec) -> float:
    """Resident memory of every lab process: control plane plus all node cgroups."""
    t = cluster.table()
    pids = {p.pid for n in t.names() if (p := t.get(n)) is not None and p.alive()}
    for n in spec.nodes:
        try:
            pids |= cgroups.procs(n.name)
        except OSError:  # a cgroup going away under the scan (a node stopping)
            continue
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


def build(k8s: str, ctd: str, cache: str | None = None) -> dict[str, float]:
    """Build the stack's Kubernetes and containerd (a no-op when cached); seconds each."""
    env = {**os.environ, "GPUKIT_K8S_VERSION": k8s, "GPUKIT_CONTAINERD_VERSION": ctd}
    if cache:
        env["GPUKIT_CACHE"] = cache
    out = {}
    for what in ("kubernetes", "containerd"):
        t0 = time.monotonic()
        subprocess.run(["bash", str(REPO / f"gpukit/lab/scripts/build-{what}.sh")], env=env,
                       check=True, stdout=subprocess.DEVNULL)  # fmt: skip
        out[what] = time.monotonic() - t0
    return out


def measure(spec: LabSpec) -> dict[str, float]:
    if cluster.status(spec).anything:
        cluster.down(spec, say=lambda _m: None)
    peak = 0.0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, lab_rss_mib(spec))
            time.sleep(1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.monotonic()
    try:
        cluster.up(spec, say=lambda _m: None)
        up_s = time.monotonic() - t0
        time.sleep(10)  # let the nodes settle before reading their steady memory
        steady = lab_rss_mib(spec)
    finally:
        done.set()
        sampler.join()
        t0 = time.monotonic()
        cluster.down(spec, say=lambda _m: None)
    return {"up_s": up_s, "down_s": time.monotonic() - t0, "peak_mib": max(peak, steady),
            "rss_mib": steady}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cold", action="store_true", help="also time cold builds")
    ap.add_argument("--stack", action="append", metavar="K8S/CONTAINERD",
                    help=f"a stack to measure (default: the lab's default and {OLDEST})")
    args = ap.parse_args()
    stacks = args.stack or [f"{DEFAULT_K8S_VERSION}/{DEFAULT_CONTAINERD_VERSION}", OLDEST]
    base = load_spec()
    print(f"nodes: {len(base.nodes)} ({', '.join(n.profile for n in base.nodes)})")
    for stack in stacks:
        k8s, _, ctd = stack.partition("/")
        check_versions(k8s, ctd)
        if args.cold:
            with tempfile.TemporaryDirectory(prefix="gpukit-cold-") as cache:
                cold = build(k8s, ctd, cache)
            print(f"{stack}: cold build: kubernetes {cold['kubernetes']:.0f} s,"
                  f" containerd {cold['containerd']:.0f} s")  # fmt: skip
        build(k8s, ctd)
        # The lab's own subprocesses (node supervisors) read the stack from the environment.
        os.environ.update(GPUKIT_K8S_VERSION=k8s, GPUKIT_CONTAINERD_VERSION=ctd)
        m = measure(dataclasses.replace(base, k8s_version=k8s, containerd_version=ctd))
        print(f"{stack}: lab up to all nodes Ready (cached) {m['up_s']:.1f} s"
              f" (target {TARGET_UP_S:.0f} s, ratio {m['up_s'] / TARGET_UP_S:.2f};"
              f" {BEFORE['stack']}: {BEFORE['up_s']:.1f} s, ratio to it"
              f" {m['up_s'] / BEFORE['up_s']:.2f}); lab down {m['down_s']:.1f} s")  # fmt: skip
        print(f"{stack}: lab memory peak {m['peak_mib']:.0f} MiB, steady {m['rss_mib']:.0f} MiB"
              f" ({BEFORE['stack']}: {BEFORE['rss_mib']:.0f} MiB, ratio to it"
              f" {m['rss_mib'] / BEFORE['rss_mib']:.2f})")  # fmt: skip
    print(f"{BEFORE['stack']} (recorded): Kubernetes cold build ~{BEFORE['k8s_build_s']:.0f} s")


if __name__ == "__main__":
    main()
