"""Time a driver branch upgrade rolled through the lab by playbooks/upgrade.yml.

    GPUKIT_LAB_INSTANCE=N .venv/bin/python benchmarks/rolling_upgrade.py [--to 570]
        [--activation reload-else-reboot|reload|reboot]

Needs a provisioned lab (`make lab`, or the instance's site.yml run). Works on a copy of the
lab's inventory with `nvidia_driver_branch` changed, rolls it (serial 1 per group), and
prints the whole rollout's wall time, each node's unschedulable time (cordon to uncordon,
from a watch on the nodes, against UNSCHEDULABLE_TARGET_S) and the ratio to the target. Then
rolls the lab back to the inventory's branch (timed too). `--activation` sets
nvidia_driver_activation (`reboot`: the driver role's behaviour before module reloads).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from kubernetes import client, config

from gpukit.lab import cluster
from gpukit.lab.config import load_spec
from gpukit.lab.controlplane import paths
from gpukit.lab.inventory import for_instance
from gpukit.lab.observe import Timeline

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
# Per node: drain, driver packages, module reload (or reboot), MIG/labels, conformance.
TARGET_PER_NODE_S = 180.0
# A node's cordon-to-uncordon time in a driver upgrade without a reboot (issue #31).
UNSCHEDULABLE_TARGET_S = 30.0


def roll(inventory: Path, branch: str, core: client.CoreV1Api,
         activation: str | None = None) -> tuple[float, Timeline, int]:  # fmt: skip
    path = inventory / "group_vars" / "gpu_nodes.yml"
    doc = yaml.safe_load(path.read_text())
    doc["nvidia_driver_branch"] = branch
    if activation:
        doc["nvidia_driver_activation"] = activation
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    with Timeline(core) as seen:
        t0 = time.monotonic()
        r = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inventory),
                            "playbooks/upgrade.yml"], cwd=REPO, capture_output=True,
                           text=True)  # fmt: skip
        elapsed = time.monotonic() - t0
    if r.returncode != 0:
        print(r.stdout[-3000:], file=sys.stderr)
    return elapsed, seen, r.returncode


def show(label: str, elapsed: float, seen: Timeline, nodes: list[str], rc: int) -> None:
    rolled = [n for n in nodes if seen.unschedulable_periods(n)]
    target = TARGET_PER_NODE_S * max(1, len(rolled))
    print(f"{label}: {elapsed:.1f} s for {len(rolled)} node(s), rc {rc}"
          f" (target {target:.0f} s, ratio {elapsed / target:.2f});"
          f" at most {seen.max_unschedulable()} node(s) unschedulable at once")  # fmt: skip
    for n in rolled:
        spans = [(b - a) if b is not None else float("nan")
                 for a, b in seen.unschedulable_periods(n)]  # fmt: skip
        print(f"  {n}: unschedulable {' + '.join(f'{s:.1f}' for s in spans)} s"
              f" (target <= {UNSCHEDULABLE_TARGET_S:.0f} s)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--to", default="570", help="branch to roll to (default 570)")
    parser.add_argument("--activation", choices=("reload-else-reboot", "reload", "reboot"),
                        help="nvidia_driver_activation for both rollouts (default: the role's)")
    args = parser.parse_args()
    spec = load_spec()
    if not cluster.status(spec).up:
        sys.exit("the lab is not up: run `make lab` first")
    config.load_kube_config(str(paths().admin_kubeconfig))
    core = client.CoreV1Api()
    with tempfile.TemporaryDirectory() as tmp:
        inventory = Path(tmp) / "inventory"
        shutil.copytree(for_instance(spec), inventory)
        declared = str(yaml.safe_load((inventory / "group_vars/gpu_nodes.yml").read_text())
                       ["nvidia_driver_branch"])  # fmt: skip
        nodes = spec.node_names()
        elapsed, seen, rc = roll(inventory, args.to, core, args.activation)
        show(f"rollout {declared} -> {args.to}", elapsed, seen, nodes, rc)
        elapsed, seen, rc = roll(inventory, declared, core, args.activation)
        show(f"rollout back {args.to} -> {declared}", elapsed, seen, nodes, rc)


if __name__ == "__main__":
    main()
