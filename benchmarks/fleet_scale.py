"""Fleet scale: wall time and peak memory against node count, with the growth ratio.

    # the controller-side parts, on generated inventories (no cluster): seconds
    .venv/bin/python benchmarks/fleet_scale.py --parts inventory,upgrade
    # a real lab of 2, 4, 8 mixed nodes (boots, provisions, runs the suite, takes it down)
    GPUKIT_LAB_INSTANCE=8 .venv/bin/python benchmarks/fleet_scale.py --parts lab,suite --real 2,4,8
    # a simulated fleet of 100, 500 and 1000 API-only nodes on a control plane alone
    GPUKIT_LAB_INSTANCE=9 .venv/bin/python benchmarks/fleet_scale.py --parts simulated

Parts:
  lab        per node count: `lab up` to all Ready (nodes added to a running lab), the RSS of each
             node (its systemd, journald, containerd, kubelet, the node agent's pod), per node.
  suite      the conformance suite on the provisioned real lab, nodes one at a time
             (--node-parallelism 1) and --node-parallelism P; target: time(8) <= 2 x time(2).
  simulated  stand-in nodes (gpukit.lab.fleet) registered and Ready; the suite's API-side checks
             (--api-only: discovery, labels, the MIG/time-slicing resource checks), the upgrade
             plan from the API's nodes, the HTML report from the suite's JUnit; the suite's
             tests, its per-test overhead ((wall - the run's fixed part) / tests) and its
             growth. Targets: 1000 nodes in <= 60 s, sub-linear from 100 to 1000 nodes,
             the upgrade plan from the API's 1000 nodes in <= 10 s.
  inventory  `gpukit inventory check` on a generated inventory of N hosts.
  upgrade    gpukit.provision.upgrade.plan + report for N hosts (25% serial per group, 10% budget).

Each measurement runs in a child process: wall time, CPU time (user + system, wait4's
rusage: on a shared machine the steadier figure) and its peak RSS (ru_maxrss).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
# The real lab's nodes by count: the default lab first, then the other profiles.
LAB_NODES = [
    ("gpu-a100", "a100-sxm4-40gb-x8"), ("gpu-t4", "t4-x2"), ("gpu-h100", "h100-80gb-x8"),
    ("gpu-a100-80", "a100-80gb-x4"), ("gpu-a100-b", "a100-sxm4-40gb-x8"), ("gpu-t4-b", "t4-x2"),
    ("gpu-h100-b", "h100-80gb-x8"), ("gpu-a100-80-b", "a100-80gb-x4"),
]  # fmt: skip
SUITE_GROWTH_TARGET = 2.0  # time(8 nodes) <= 2 x time(2 nodes)
SIMULATED_TARGET_S = 60.0  # the suite's --api-only run over 1000 stand-in nodes


@dataclass
class Run:
    seconds: float
    peak_mib: float
    rc: int
    out: str
    cpu: float = 0.0


def measure(argv: Sequence[str], env: dict[str, str] | None = None, timeout: float = 1800) -> Run:
    """Run a child; its wall time and peak resident memory."""
    t0 = time.monotonic()
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(list(argv), cwd=REPO, env={**os.environ, **(env or {})},
                                stdout=log, stderr=subprocess.STDOUT, text=True)  # fmt: skip
        deadline = t0 + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                proc.kill()
            time.sleep(0.05)
        proc.returncode = os.waitstatus_to_exitcode(status)
        log.seek(0)
        out = log.read()
    return Run(time.monotonic() - t0, usage.ru_maxrss / 1024, proc.returncode, out,
               usage.ru_utime + usage.ru_stime)


def growth(rows: list[tuple[int, float]]) -> str:
    """'x<ratio> for x<nodes>' from the smallest count to each larger one."""
    (n0, t0), out = rows[0], []
    for n, t in rows[1:]:
        out.append(f"{n}/{n0} nodes: x{t / t0:.2f} time for x{n / n0:.0f} nodes")
    return "; ".join(out)


def table(
    title: str, rows: list[tuple[int, Run]], extra: Callable[[Run], str] = lambda _r: ""
) -> None:
    print(f"\n{title}")
    print(f"  {'nodes':>6} {'wall s':>8} {'cpu s':>7} {'peak MiB':>9} {'s/node':>8}  rc")
    for n, r in rows:
        print(
            f"  {n:>6} {r.seconds:>8.2f} {r.cpu:>7.2f} {r.peak_mib:>9.0f} {r.seconds / n:>8.3f}"
            f"  {r.rc}  {extra(r)}"
        )
    if len(rows) > 1:
        print("  growth (wall): " + growth([(n, r.seconds) for n, r in rows]))
        print("  growth (cpu):  " + growth([(n, r.cpu) for n, r in rows]))


# ---- controller side, no cluster


def generated(n: int, root: Path, kubeconfig: Path | None = None) -> Path:
    from gpukit.lab.fleet import inventory

    return inventory.generate(root / f"fleet{n}", n, kubeconfig=kubeconfig)


PLAN_CHILD = r"""
import json, sys, time
from gpukit import inventory as inv
from gpukit.provision import upgrade
t0 = time.monotonic()
fleet = inv.load(sys.argv[1])
t1 = time.monotonic()
nodes = []
if len(sys.argv) > 2:  # the nodes as the API has them (the planning play reads them too)
    from gpukit.k8s import connect
    # One list, read as the plain JSON the planning play gets (no client models).
    resp = connect.core(sys.argv[2]).list_node(_preload_content=False)
    objs = {o["metadata"]["name"]: o for o in json.loads(resp.data)["items"]}
else:
    objs = {}
for d in fleet.nodes:
    nodes.append(upgrade.node_state({
        "host": d.host, "node": objs.get(d.node_name, {}), "group": d.gpu.product,
        "serial": "25%",
        "max_failed": "10%", "changes": ["driver: install nvidia-driver 570"]}))
t2 = time.monotonic()
plan = upgrade.plan(nodes)
results = {h: "done" for h in plan.order[: len(plan.order) // 2]}
results[plan.order[-1]] = "failed"
rep = upgrade.report(plan.as_dict(), results, {plan.order[-1]: "validation failed"})
t3 = time.monotonic()
print(json.dumps({"load": t1 - t0, "states": t2 - t1, "plan+report": t3 - t2,
                  "batches": len(plan.batches), "budget": plan.max_failed,
                  "summary": rep.summary}))
"""


def part_inventory(counts: Sequence[int], root: Path) -> None:
    rows = []
    for n in counts:
        path = generated(n, root)
        rows.append((n, measure([PY, "-m", "gpukit", "inventory", "check", str(path)])))
    table(
        "gpukit inventory check on a generated inventory",
        rows,
        lambda r: r.out.strip().splitlines()[-1][:70] if r.out.strip() else "",
    )


def part_upgrade(counts: Sequence[int], root: Path, kubeconfig: Path | None = None) -> None:
    rows = []
    for n in counts:
        path = generated(n, root, kubeconfig)
        argv = [PY, "-c", PLAN_CHILD, str(path)] + ([str(kubeconfig)] if kubeconfig else [])
        rows.append((n, measure(argv)))

    def detail(r: Run) -> str:
        try:
            d = json.loads(r.out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return r.out[-300:]
        return (
            f"load {d['load']:.2f}s, states {d['states']:.2f}s, plan+report "
            f"{d['plan+report'] * 1000:.1f}ms, {d['batches']} batches, budget {d['budget']}"
        )

    where = "nodes from the API" if kubeconfig else "from the inventory"
    table(f"upgrade plan (gpukit.provision.upgrade, {where})", rows, detail)


# ---- the real lab


def lab_nodes(n: int) -> str:
    if not 1 <= n <= len(LAB_NODES):
        sys.exit(f"--real: {n} nodes: the benchmark's lab has 1 to {len(LAB_NODES)}")
    return ",".join(f"{name}={profile}" for name, profile in LAB_NODES[:n])


def node_rss_mib(env: dict[str, str]) -> dict[str, float]:
    """RSS of every process in each running node's cgroups (systemd, journald, containerd,
    kubelet, containers), per node."""
    code = (
        "import json; from pathlib import Path; from gpukit.lab import cgroups;"
        " from gpukit.lab.config import load_spec\n"
        "out = {}\n"
        "for n in load_spec().nodes:\n"
        "    kib = 0\n"
        "    for pid in cgroups.procs(n.name):\n"
        "        try:\n"
        "            s = Path(f'/proc/{pid}/status').read_text()\n"
        "        except OSError:\n"
        "            continue\n"
        "        kib += next((int(x.split()[1]) for x in s.splitlines()"
        " if x.startswith('VmRSS:')), 0)\n"
        "    out[n.name] = kib / 1024\n"
        "print(json.dumps(out))\n"
    )
    r = subprocess.run([PY, "-c", code], cwd=REPO, env={**os.environ, **env},
                       capture_output=True, text=True, check=True)  # fmt: skip
    data: dict[str, float] = json.loads(r.stdout)
    return data


def lab_up(n: int) -> tuple[dict[str, str], Run]:
    env = {"GPUKIT_LAB_NODES": lab_nodes(n)}
    return env, measure([PY, "-m", "gpukit", "lab", "up"], env)


PROVISION = (
    "import sys; sys.path.insert(0, 'tests/conformance'); import labprovision as lp;"
    " from gpukit import inventory as inv; from gpukit.lab.config import load_spec;"
    " from gpukit.lab.inventory import for_instance; s = load_spec();"
    " lp.provision(s, inv.load(for_instance(s)), timeout=300)"
)


def part_lab_and_suite(
    counts: Sequence[int], parts: set[str], parallelism: int, sequential: bool
) -> None:
    ups: list[tuple[int, Run]] = []
    per_node: dict[int, dict[str, float]] = {}
    seq: list[tuple[int, Run]] = []
    par: list[tuple[int, Run]] = []
    for n in counts:
        env, up = lab_up(n)
        ups.append((n, up))
        if up.rc != 0:
            print(up.out[-3000:], file=sys.stderr)
            break
        if "suite" in parts:
            prov = measure([PY, "-c", PROVISION], env)
            if prov.rc != 0:
                print(prov.out[-3000:], file=sys.stderr)
                break
            runs = ((1, seq), (parallelism, par)) if sequential else ((parallelism, par),)
            for p, rows in runs:
                rows.append((n, measure([PY, "-m", "pytest", "gpukit/conformance", "--lab", "-q",
                                         "-p", "no:cacheprovider",
                                         f"--node-parallelism={p}"], env)))  # fmt: skip
        per_node[n] = node_rss_mib(env)
    if "lab" in parts or ups:
        table("lab up (nodes added to the running lab; the first count from down)", ups)
        for n, rss in per_node.items():
            each = ", ".join(f"{k} {v:.0f}" for k, v in rss.items())
            print(
                f"  {n} nodes: node RSS MiB {each}; mean {sum(rss.values()) / len(rss):.0f}"
                f" per node"
            )

    def summary(r: Run) -> str:
        return (r.out.strip().splitlines() or [""])[-1][:80]

    if seq:
        table("conformance suite, one node at a time (--node-parallelism 1)", seq, summary)
    if par:
        table(f"conformance suite, --node-parallelism {parallelism}", par, summary)
        (n0, t0), (n1, t1) = (par[0][0], par[0][1].seconds), (par[-1][0], par[-1][1].seconds)
        if n1 > n0:
            ratio = t1 / t0
            print(
                f"  target time({n1}) <= {SUITE_GROWTH_TARGET:.0f} x time({n0}):"
                f" x{ratio:.2f} ({'met' if ratio <= SUITE_GROWTH_TARGET else 'NOT met'})"
            )


# ---- the simulated fleet


STANDIN_CHILD = r"""
import sys, time
from kubernetes import client
from gpukit import inventory as inv
from gpukit.k8s import connect
from gpukit.lab.fleet import standin
api = connect.api_client(sys.argv[2])
nodes = standin.StandIns(client.CoreV1Api(api), client.CoordinationV1Api(api))
fleet = inv.load(sys.argv[1])
t0, c0 = time.monotonic(), time.process_time()
nodes.start_renewing()  # the first nodes' Leases stay fresh while the last register
nodes.register(fleet)
print(f"registered {len(fleet.nodes)} in {time.monotonic() - t0:.1f}s"
      f" (cpu {time.process_time() - c0:.1f}s)", flush=True)
standin.wait_registered(nodes.core, len(fleet.nodes), timeout=300)
print(f"all Ready {time.monotonic() - t0:.1f}s after the first", flush=True)
t1, c1 = time.monotonic(), time.process_time()
nodes.renew_once()
print(f"one renewal round {time.monotonic() - t1:.1f}s (cpu {time.process_time() - c1:.1f}s)",
      flush=True)
open(sys.argv[3], "w").write("ready")
while True:
    time.sleep(3600)
"""


def renewer_lines(log: Path) -> str:
    """What the stand-ins' process said so far (registration and renewal times)."""
    return "  " + "; ".join(log.read_text().strip().splitlines()[-3:])


def per_test(run: Run, junit: Path) -> str:
    """Tests, their own time (JUnit) and the rest of the run per test: pytest's overhead."""
    import xml.etree.ElementTree as ET

    try:
        cases = list(ET.parse(junit).getroot().iter("testcase"))
    except (OSError, ET.ParseError) as exc:
        return f"no JUnit ({exc})"
    own = sum(float(c.get("time") or 0) for c in cases)
    n = max(len(cases), 1)
    return (f"{len(cases)} tests, their own time {own:.1f}s ({own / n * 1000:.2f} ms/test),"
            f" the rest of the run (start, collection, reporting) {run.seconds - own:.1f}s"
            f" ({(run.seconds - own) / n * 1000:.2f} ms/test)")


def part_simulated(counts: Sequence[int], root: Path) -> None:
    from gpukit.lab import cluster
    from gpukit.lab.config import load_spec
    from gpukit.lab.controlplane import paths

    lab = load_spec()
    if cluster.status(lab).anything and any(
        cluster.status(lab).nodes[n]["init"] for n in lab.node_names()
    ):
        sys.exit("simulated: this lab instance runs real nodes: use another GPUKIT_LAB_INSTANCE")
    t0 = time.monotonic()
    cluster.start_control_plane(lab, say=lambda _m: None)
    print(f"control plane alone up in {time.monotonic() - t0:.1f}s")
    kc = paths().admin_kubeconfig
    suite_rows: list[tuple[int, Run]] = []
    report_rows: list[tuple[int, Run]] = []
    overheads: list[tuple[int, str]] = []
    try:
        for n in counts:
            inv_path = generated(n, root, kc)
            flag = root / f"ready{n}"
            t1 = time.monotonic()
            log_path = root / f"standins{n}.log"
            with log_path.open("w") as log:
                renewer = subprocess.Popen([PY, "-c", STANDIN_CHILD, str(inv_path), str(kc),
                                            str(flag)], cwd=REPO, stdout=log,
                                           stderr=subprocess.STDOUT, text=True)  # fmt: skip
            while not flag.exists() and renewer.poll() is None:
                time.sleep(0.2)
            if renewer.poll() is not None:
                sys.exit(f"stand-ins for {n} nodes failed: {log_path.read_text()[-2000:]}")
            print(f"\n{n} stand-in nodes registered and Ready: {time.monotonic() - t1:.1f}s")
            print(renewer_lines(root / f"standins{n}.log"))
            junit = root / f"junit{n}.xml"
            suite_rows.append((n, measure([
                PY, "-m", "pytest", "gpukit/conformance", "--inventory", str(inv_path),
                "--kubeconfig", str(kc), "--api-only", "--no-host", "-q", "-p",
                "no:cacheprovider", f"--junitxml={junit}"])))  # fmt: skip
            overheads.append((n, per_test(suite_rows[-1][1], junit)))
            report_rows.append((n, measure([PY, "-m", "gpukit", "report", str(junit), "-o",
                                            str(root / f"report{n}.html")])))  # fmt: skip
            part_upgrade([n], root, kc)
            renewer.terminate()
            renewer.wait()
            subprocess.run([PY, "-c", (
                "import sys; from gpukit.k8s import connect; from gpukit.lab.fleet import standin;"
                " c = connect.core(sys.argv[1]);"
                " [c.delete_node(x.metadata.name) for x in"
                " c.list_node(label_selector=standin.SIMULATED + '=true').items]"), str(kc)],
                cwd=REPO, check=True)  # fmt: skip
    finally:
        cluster.down(lab, say=lambda _m: None)

    def summary(r: Run) -> str:
        return (r.out.strip().splitlines() or [""])[-1][:90]

    table(
        "conformance suite --api-only on stand-in nodes (discovery, labels, MIG and"
        " time-slicing resources; kubelet checks skipped by name)",
        suite_rows,
        summary,
    )
    for n, line in overheads:
        print(f"  {n} nodes: {line}")
    if len(suite_rows) > 1:
        (n0, r0), (n1, r1) = suite_rows[0], suite_rows[-1]
        ratio = r1.seconds / r0.seconds
        print(f"  sub-linear {n0} -> {n1} nodes (x{n1 / n0:.0f}): wall x{ratio:.2f}, cpu"
              f" x{r1.cpu / r0.cpu:.2f} ({'met' if ratio < n1 / n0 else 'NOT met'});"
              f" {n1} nodes <= {SIMULATED_TARGET_S:.0f}s:"
              f" {'met' if r1.seconds <= SIMULATED_TARGET_S else 'NOT met'}")
    table("gpukit report junit.xml -o report.html", report_rows, summary)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default="inventory,upgrade")
    ap.add_argument("--real", default="2,4,8")
    ap.add_argument("--simulated", default="100,500,1000")
    ap.add_argument(
        "--controller",
        default="2,4,8,100,500",
        help="host counts for the inventory and upgrade parts",
    )
    ap.add_argument("--node-parallelism", type=int, default=4)
    ap.add_argument(
        "--no-sequential",
        action="store_true",
        help="suite part: skip the --node-parallelism 1 runs",
    )
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    counts = [int(x) for x in args.controller.split(",")]
    with tempfile.TemporaryDirectory(prefix="fleet-scale-") as tmp:
        root = Path(tmp)
        if "inventory" in parts:
            part_inventory(counts, root)
        if "upgrade" in parts:
            part_upgrade(counts, root)
        if parts & {"lab", "suite"}:
            part_lab_and_suite(
                [int(x) for x in args.real.split(",")], parts, args.node_parallelism,
                not args.no_sequential,
            )  # fmt: skip
        if "simulated" in parts:
            part_simulated([int(x) for x in args.simulated.split(",")], root)


if __name__ == "__main__":
    main()
