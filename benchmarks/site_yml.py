"""site.yml on the lab: wall time of a first run (bare nodes) and of a second run (nothing
left to change), and their ratio (target: the second run takes at most 40 % of the first).

    GPUKIT_LAB_INSTANCE=N .venv/bin/python benchmarks/site_yml.py [--no-reset] [--top 15]
        [--second-runs N] [--checkout DIR]

A first run needs nodes that were never provisioned, so the lab instance is reset before it:
`gpukit lab down --purge`, then `gpukit lab up` (fresh node roots from the cached Debian tree, a
new cluster). Instance 0 (`make lab`'s) is only reset with --force. --no-reset times the lab as
it is (the "first" run then does whatever is left to do). Not timed: the reset, the lab's apt
repository and gpukit's wheelhouse (built on the controller first and pinned for both runs, as
a cached `make lab` has it). The inventory is the instance's (`gpukit.lab.inventory`), as
`make provision` runs it.

Prints both wall times, the ratio, what each run changed, and each run's slowest tasks
(a task's time is until its last host answered; the ansible.posix.profile_tasks callback gives
the same view: ANSIBLE_CALLBACKS_ENABLED=ansible.posix.profile_tasks). --second-runs N repeats
the second run (the ratio uses their median: on a shared machine one run can be unlucky).
--checkout DIR times the playbooks and roles of another tree (e.g. `git archive <commit> | tar
-x -C DIR`) with this gpukit, to compare before and after a change.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gpukit import summary
from gpukit.lab import cluster
from gpukit.lab.config import cache_dir, load_spec
from gpukit.lab.inventory import for_instance

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
TARGET_RATIO = 0.40


def play(repo: Path, inventory: Path, wheelhouse: str, record: Path
         ) -> tuple[float, int, dict[str, Any]]:
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "ANSIBLE_CALLBACKS_ENABLED": "gpukit.gpu.play_record",
        "GPUKIT_PLAY_RECORD": str(record),
    }
    argv = [str(BIN / "ansible-playbook"), "-i", str(inventory), "site.yml",
            "-e", json.dumps({"gpukit_node_wheelhouse_archive": wheelhouse})]  # fmt: skip
    t0 = time.monotonic()
    proc = subprocess.run(argv, cwd=repo, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - t0
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-2000:])
    doc = json.loads(record.read_text()) if record.exists() else {}
    return seconds, proc.returncode, doc


def slowest(doc: dict[str, Any], top: int) -> list[tuple[float, str]]:
    out: list[tuple[float, str]] = []
    for p in doc.get("plays", []):
        for t in p.get("tasks", []):
            d = t["task"].get("duration", {})
            if "start" in d and "end" in d:
                span = dt.datetime.fromisoformat(d["end"]) - dt.datetime.fromisoformat(d["start"])
                out.append((span.total_seconds(), t["task"]["name"]))
    return sorted(out, reverse=True)[:top]


def describe(name: str, seconds: float, rc: int, doc: dict[str, Any]) -> None:
    run = summary.parse_play(doc) if doc else summary.PlayRun()
    changed = ", ".join(f"{h} {hp.changed}" for h, hp in sorted(run.hosts.items()))
    print(f"{name}: {seconds:.1f} s (rc {rc}; changed: {changed or 'no record'})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-reset", action="store_true", help="time the lab as it is")
    ap.add_argument("--force", action="store_true", help="allow resetting lab instance 0")
    ap.add_argument("--top", type=int, default=15, help="slowest tasks shown (default 15)")
    ap.add_argument("--second-runs", type=int, default=1, help="second runs (default 1)")
    ap.add_argument("--checkout", type=Path, default=REPO,
                    help="tree whose site.yml and roles are timed (default this one)")
    args = ap.parse_args()
    spec = load_spec()
    if not args.no_reset:
        if spec.instance == 0 and not args.force:
            sys.exit("instance 0 is `make lab`'s: reset it with --force, or use "
                     "GPUKIT_LAB_INSTANCE=N or --no-reset")  # fmt: skip
        t0 = time.monotonic()
        cluster.down(spec, say=lambda _m: None, purge=True)
        cluster.up(spec, say=lambda _m: None)
        print(f"reset lab instance {spec.instance} (down --purge, up): "
              f"{time.monotonic() - t0:.0f} s, not timed")  # fmt: skip
    elif not cluster.status(spec).up:
        sys.exit("the lab is not up: `gpukit lab up` (or drop --no-reset)")
    from gpukit.lab.packages import build_repo
    from gpukit.provision import wheelhouse

    build_repo()
    inventory = for_instance(spec)
    wh = wheelhouse.build(cache_dir(), "3.11")  # the lab's nodes are Debian 12 (Python 3.11)
    repo = args.checkout.resolve()
    with tempfile.TemporaryDirectory(prefix="gpukit-site-bench-") as tmp:
        first = play(repo, inventory, wh.archive, Path(tmp) / "first.json")
        seconds = [play(repo, inventory, wh.archive, Path(tmp) / f"second-{i}.json")
                   for i in range(max(1, args.second_runs))]  # fmt: skip
    if repo != REPO:
        print(f"playbooks and roles of {repo}")
    describe("first run (bare nodes)", *first)
    for i, second in enumerate(seconds):
        describe("second run (nothing to change)" + (f" #{i + 1}" if len(seconds) > 1 else ""),
                 *second)  # fmt: skip
    second_s = statistics.median(s[0] for s in seconds)
    ratio = second_s / first[0] if first[0] else float("nan")
    print(f"ratio second/first: {ratio:.2f}"
          + (f" (median second run {second_s:.1f} s)" if len(seconds) > 1 else "")
          + f" (target <= {TARGET_RATIO:.2f}; {'met' if ratio <= TARGET_RATIO else 'not met'})")
    fastest = min(seconds, key=lambda s: s[0])
    for what, doc in (("first run", first[2]), ("second run", fastest[2])):
        print(f"{what}, slowest {args.top} tasks (until the last host answered):")
        for secs, name in slowest(doc, args.top):
            print(f"  {secs:6.2f} s  {name}")


if __name__ == "__main__":
    main()
