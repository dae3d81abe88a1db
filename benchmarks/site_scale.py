"""site.yml on many hosts: wall time and controller work per node count, forks and strategy.

    GPUKIT_LAB_INSTANCE=N GPUKIT_LAB_NODES=<4 or 8 nodes> \
      .venv/bin/python benchmarks/site_scale.py [--nodes 2,4] [--forks 5,10,20] \
      [--strategies linear] [--no-converge] [--checkout DIR] [--json FILE]

The lab must be up with at least the largest node count (`gpukit lab up`; the benchmark does
not boot it). It first converges every node with site.yml (not timed), then times site.yml on
the converged lab (nothing left to change: what a fleet pays on every run) for each node count
(an inventory of the instance's first N nodes, the same declarations) x strategy x forks.

Per run it prints the wall time, the controller's CPU time (the ansible-playbook process and
everything it forks: workers, ssh clients; the nodes' side runs in the nodes), whether
anything changed or failed, and the declaration model's entries counted through the play
(tests/roles/counted_playbook.py: host validations and device plugin config parses): these
must not grow faster than the hosts (one validation per host; one parse per distinct config).
Then the growth per node count (time(N) / time(smallest)) for each configuration, and the
slowest tasks of the largest run (a task's time is until its last host answered).

Strategy: gpukit's plays with run_once tasks pin `strategy: linear` (under `free` Ansible runs a
run_once task on every host: the preflight validated every host once per host), so
ANSIBLE_STRATEGY=free changes nothing in this tree; `--strategies free --checkout DIR` times the
playbooks and roles of a tree from before that pin (`git archive 390e806 | tar -x -C DIR`) with
this gpukit. Forks: Ansible never runs more workers than a task has hosts, so forks at or above
the node count are the same configuration (5, 10 and 20 on 4 nodes); fewer forks than nodes
queue hosts.

Figures of a run on the 4-node lab (2 x a100-sxm4-40gb-x8, 2 x t4-x2; 2 cores under load 10-30
from other labs), tabled in the README's "Scale" section: wall 67.0-107.7 s on 2 nodes and
43.6-98.5 s on 4 (forks 20 to 2), controller CPU 34.5-38.9 s and 46.0-56.6 s (x1.33-1.46 for x2
nodes), 2 and 4 host validations, 6 config parses at both sizes; free, unpinned: 32.8 s and
92.0 s, CPU 42.3 s and 94.3 s, 4 and 16 host validations, 12 and 24 parses.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import site_yml  # benchmarks/site_yml.py, beside this script
import yaml

from gpukit.lab import cluster
from gpukit.lab.config import LabSpec, cache_dir, load_spec
from gpukit.lab.inventory import for_instance, hosts_document

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
COUNTED = REPO / "tests" / "roles" / "counted_playbook.py"


@dataclass
class Run:
    nodes: int
    strategy: str
    forks: int
    seconds: float
    cpu: float  # controller CPU seconds (user + system of the play and its children)
    rc: int
    changed: int
    failed: int
    calls: dict[str, int] = field(default_factory=dict)
    slowest: list[tuple[float, str]] = field(default_factory=list)


def inventory_of(spec: LabSpec, n: int, root: Path) -> Path:
    """The instance's inventory (declarations unchanged) with its first `n` nodes."""
    out = root / f"inventory-{n}"
    shutil.copytree(for_instance(spec), out)
    sub = LabSpec(nodes=spec.nodes[:n], instance=spec.instance)
    (out / "hosts.yml").write_text(yaml.safe_dump(hosts_document(sub), sort_keys=False))
    return out


def _children_cpu() -> float:
    u = resource.getrusage(resource.RUSAGE_CHILDREN)
    return u.ru_utime + u.ru_stime


Played = tuple[float, float, int, dict[str, Any], Counter[str]]


def play(inventory: Path, wheelhouse: str, strategy: str, forks: int, tmp: Path,
         counted: bool = True, repo: Path = REPO) -> Played:
    record, calls = tmp / "record.json", tmp / "calls.txt"
    for f in (record, calls):
        f.unlink(missing_ok=True)
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "ANSIBLE_CALLBACKS_ENABLED": "gpukit.gpu.play_record",
        "GPUKIT_PLAY_RECORD": str(record),
        "ANSIBLE_STRATEGY": strategy,
        "ANSIBLE_FORKS": str(forks),
    }
    head = [sys.executable, str(COUNTED), str(calls)] if counted else [
        str(BIN / "ansible-playbook")]  # fmt: skip
    argv = [*head, "-i", str(inventory), "site.yml",
            "-e", json.dumps({"gpukit_node_wheelhouse_archive": wheelhouse})]  # fmt: skip
    cpu0, t0 = _children_cpu(), time.monotonic()
    proc = subprocess.run(argv, cwd=repo, env=env, capture_output=True, text=True)
    seconds, cpu = time.monotonic() - t0, _children_cpu() - cpu0
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-1500:])
    doc = json.loads(record.read_text()) if record.exists() else {}
    # counted_playbook's lines: `<function> <host or source>` per call.
    lines = calls.read_text().splitlines() if calls.exists() else []
    return seconds, cpu, proc.returncode, doc, Counter(ln.split(" ", 1)[0] for ln in lines)


def totals(doc: dict[str, Any]) -> tuple[int, int]:
    """Changed and failed task results over all hosts."""
    changed = failed = 0
    for p in doc.get("plays", []):
        for t in p.get("tasks", []):
            for res in (t.get("hosts") or {}).values():
                changed += bool(res.get("changed"))
                failed += bool(res.get("failed") or res.get("unreachable"))
    return changed, failed


def slowest(doc: dict[str, Any], top: int) -> list[tuple[float, str]]:
    """site_yml.py's slowest tasks of a play record, rounded for this report's JSON."""
    return [(round(secs, 2), name) for secs, name in site_yml.slowest(doc, top)]


def report(runs: list[Run], top: int) -> None:
    print("\nsite.yml on the converged lab (nothing to change), per node count x strategy x forks")
    print(f"  {'nodes':>5} {'strategy':>8} {'forks':>5} {'wall s':>7} {'s/node':>7}"
          f" {'ctl cpu s':>9} {'cpu/node':>8} {'changed':>7} {'failed':>6} {'rc':>3}"
          "  validations parses")  # fmt: skip
    for r in runs:
        print(f"  {r.nodes:>5} {r.strategy:>8} {r.forks:>5} {r.seconds:>7.1f}"
              f" {r.seconds / r.nodes:>7.1f} {r.cpu:>9.1f} {r.cpu / r.nodes:>8.1f}"
              f" {r.changed:>7} {r.failed:>6} {r.rc:>3}"
              f"  {r.calls.get('node_from_vars', 0):>11} {r.calls.get('parse_config', 0):>6}")
    counts = sorted({r.nodes for r in runs})
    if len(counts) > 1:
        print("\n  growth from the smallest node count (time ratio, cpu ratio):")
        for strategy, forks in sorted({(r.strategy, r.forks) for r in runs}):
            by = {r.nodes: r for r in runs if (r.strategy, r.forks) == (strategy, forks)}
            if counts[0] not in by:
                continue
            base = by[counts[0]]
            parts = [f"{n}/{counts[0]} nodes: x{by[n].seconds / base.seconds:.2f} time,"
                     f" x{by[n].cpu / base.cpu:.2f} cpu" for n in counts[1:] if n in by]
            print(f"    {strategy:>6} forks {forks:>2}: " + "; ".join(parts))
    biggest = max(runs, key=lambda r: (r.nodes, r.strategy == "linear", r.forks))
    print(f"\n  slowest {top} tasks, {biggest.nodes} nodes {biggest.strategy} forks"
          f" {biggest.forks} (until the last host answered):")
    for secs, name in biggest.slowest[:top]:
        print(f"    {secs:6.2f} s  {name}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", default="2,4", help="node counts (default 2,4)")
    ap.add_argument("--forks", default="5,10,20", help="forks (default 5,10,20)")
    ap.add_argument("--strategies", default="linear", help="default linear (see above)")
    ap.add_argument("--checkout", type=Path, default=REPO,
                    help="tree whose site.yml and roles are timed (default this one)")
    ap.add_argument("--no-converge", action="store_true", help="the lab is converged already")
    ap.add_argument("--top", type=int, default=12, help="slowest tasks shown (default 12)")
    ap.add_argument("--json", type=Path, help="write the runs here too")
    args = ap.parse_args()
    spec = load_spec()
    counts = sorted(int(n) for n in args.nodes.split(","))
    if counts[-1] > len(spec.nodes):
        sys.exit(f"--nodes {counts[-1]}: the lab has {len(spec.nodes)} nodes (GPUKIT_LAB_NODES)")
    if not cluster.status(spec).up:
        sys.exit("the lab is not up: `gpukit lab up` with GPUKIT_LAB_NODES")
    from gpukit.lab.packages import build_repo
    from gpukit.provision import wheelhouse

    build_repo()
    wh = str(wheelhouse.build(cache_dir(), "3.11").archive)
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="gpukit-site-scale-") as name:
        tmp = Path(name)
        invs = {n: inventory_of(spec, n, tmp) for n in counts}
        if not args.no_converge:
            s, _, rc, doc, _ = play(invs[counts[-1]], wh, "linear", 20, tmp, counted=False)
            print(f"converge {counts[-1]} nodes (not timed below): {s:.0f} s, rc {rc},"
                  f" changed {totals(doc)[0]}")  # fmt: skip
        for n in counts:
            for strategy in args.strategies.split(","):
                for forks in (int(f) for f in args.forks.split(",")):
                    s, cpu, rc, doc, calls = play(invs[n], wh, strategy, forks, tmp,
                                                  repo=args.checkout.resolve())
                    changed, failed = totals(doc)
                    runs.append(Run(n, strategy, forks, s, cpu, rc, changed, failed,
                                    dict(calls), slowest(doc, args.top)))  # fmt: skip
                    print(f"  {n} nodes {strategy} forks {forks}: {s:.1f} s, cpu {cpu:.1f} s,"
                          f" rc {rc}, changed {changed}, {dict(calls)}", flush=True)
    report(runs, args.top)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in runs], indent=1))


if __name__ == "__main__":
    main()
