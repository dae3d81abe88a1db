"""python -m gpukit.lab.fleet inventory|up|down: a simulated fleet on a lab instance.

    python -m gpukit.lab.fleet inventory --hosts 500 -o /tmp/fleet500
    GPUKIT_LAB_INSTANCE=9 python -m gpukit.lab.fleet up --inventory /tmp/fleet500
    GPUKIT_LAB_INSTANCE=9 python -m gpukit.lab.fleet down

`up` starts the instance's control plane alone (no lab node boots), registers a stand-in node
per host and renews their Leases until interrupted; `down` deletes them and stops the lab.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path
from typing import Any

from kubernetes import client

from gpukit import inventory as inv
from gpukit.k8s import connect
from gpukit.lab import cluster
from gpukit.lab.config import load_spec
from gpukit.lab.controlplane import paths
from gpukit.lab.fleet import inventory, standin


def clients() -> tuple[Any, Any]:
    api = connect.api_client(paths().admin_kubeconfig)
    return client.CoreV1Api(api), client.CoordinationV1Api(api)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpukit.lab.fleet")
    sub = ap.add_subparsers(dest="command", required=True)
    g = sub.add_parser("inventory", help="write an inventory of N simulated hosts")
    g.add_argument("--hosts", type=int, required=True)
    g.add_argument("--profiles", default=",".join(inventory.DEFAULT_MIX))
    g.add_argument("-o", "--output", type=Path, required=True)
    u = sub.add_parser("up", help="control plane and a stand-in node per host; renews leases")
    u.add_argument("--inventory", type=Path, required=True)
    sub.add_parser("down", help="delete the stand-ins and stop the instance")
    args = ap.parse_args(argv)
    lab = load_spec()
    if args.command == "inventory":
        try:
            out = inventory.generate(
                args.output, args.hosts, [p for p in args.profiles.split(",") if p],
                kubeconfig=paths().admin_kubeconfig,
            )  # fmt: skip
        except inventory.FleetError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(out)
        return 0
    if args.command == "up":
        fleet = inv.load(args.inventory)
        cluster.start_control_plane(lab)
        core, coordination = clients()
        nodes = standin.StandIns(core, coordination)
        nodes.start_renewing()
        nodes.register(fleet)
        took = standin.wait_registered(core, len(fleet.nodes))
        print(
            f"{len(fleet.nodes)} simulated nodes Ready in {took:.1f}s; kubeconfig:"
            f" {paths().admin_kubeconfig}; Ctrl-C stops renewing",
            file=sys.stderr,
        )
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            nodes.stop()
            return 0
    if cluster.status(lab).components.get("apiserver-ready"):
        core, _ = clients()
        for n in core.list_node(label_selector=f"{standin.SIMULATED}=true").items:
            core.delete_node(n.metadata.name)
    cluster.down(lab)
    return 0


if __name__ == "__main__":
    sys.exit(main())
