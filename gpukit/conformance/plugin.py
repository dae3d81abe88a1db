"""pytest plugin of the gpukit conformance suite (entry point `gpukit_conformance`).

    pytest gpukit/conformance --inventory inventories/<x> [--kubeconfig K] [--nodes a,b]
    pytest gpukit/conformance --lab                       # the gpukit lab, its inventory
    pytest --pyargs gpukit.conformance ...         # installed

Options, the area markers, the fixtures (`gpukit_suite`, `check`) and parametrization by node
and resource, the HTML report (`--report-html`) and JUnit properties (area, node, resource,
CNCF requirement id, and every expected/observed comparison). Inert unless the suite's own test
modules are collected: the plugin is installed for every pytest run of the environment.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpukit.contracts import label_names as ln

from .checks import AREAS, CNCF_BY_AREA, Check, Row
from .report import ALL_NODES, Result, write
from .schedule import DEFAULT_NODE_PARALLELISM, NEEDS, Use, plan

SUITE_DIR = Path(__file__).resolve().parent
SUITE_KEY = pytest.StashKey["Any"]()
CHECK_KEY = pytest.StashKey[Check]()
RESULTS_KEY = pytest.StashKey[list[Result]]()
STARTED_KEY = pytest.StashKey[float]()
AREA_KEY = pytest.StashKey[str]()  # the area of the test running last (a new area lists anew)
NO_TARGETS_KEY = pytest.StashKey[str]()  # why the cluster's GPU nodes cannot be listed
MARKERS = {
    "discovery": "node capacity/allocatable and kubelet view match the declaration",
    "labels": "GFD and declared node labels and taints",
    "host": "node host checks over SSH (pytest-testinfra, ansible backend)",
    "isolation": "allocation isolation: disjoint devices, visibility, PodResources, Pending",
    "mig": "MIG partitioning matches the declared layout",
    "timeslicing": "time-slicing replicas, rename, >1 rejection, spread",
    "mps": "MPS daemons on exactly the MPS GPUs; each client's pipe and limits",
    "workload": "workloads see exactly their devices (pynvml; CUDA on real GPUs)",
    "dra": "DRA: ResourceSlices, claims and their isolation match the declaration",
    "metrics": "GPU metrics per device, attributed to pods, agreeing with NVML",
    "tenancy": "GPU quotas, LimitRanges and PriorityClasses per namespace as declared",
    "restarts": "opt-in (--disruptive, restarts kubelets): a pod keeps its devices across "
                "container and kubelet restarts",
}
EXTRA_MARKERS = {
    "per_resource(kind)": "parametrize by (node, resource); kind: all, mig, shared",
    "exclusive": "needs the node's devices free (runs after the area's other tests)",
    "cncf(requirement_id)": "CNCF Kubernetes AI Conformance requirement id",
    "cuda": "needs a real NVIDIA GPU (skipped on the lab's mock NVML)",
    "needs_inventory": "compares with the inventory; skipped without --inventory",
    "applies_to(kind)": "only nodes declared so (kind: dra, mig, taints); the others are "
                        "skipped together, in one test that names them",
    "stages(*names)": "per-node work the test reads (conformance.schedule: probe, helper, "
                      "fill, release, gt1, workload), done ahead with --node-parallelism",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("gpukit conformance")
    g.addoption("--inventory", help="Ansible inventory declaring the GPU nodes (expectations)")
    g.addoption("--kubeconfig", help="kubeconfig of the cluster (default: the inventory's "
                "gpukit_kubeconfig, $KUBECONFIG, ~/.kube/config, in-cluster)")
    g.addoption("--nodes", default="", help="comma-separated node names to check (default all)")
    g.addoption("--host-vars", help="JSON {host: {variable: value}} (or @file) that wins over "
                "the inventory's files, as a play's -e does; the rolling upgrade passes what "
                "its play applied to the node")
    g.addoption("--lab", action="store_true", help="run against the gpukit lab (pytest-kubernetes "
                "lab provider; brings it up if needed; default inventory: the lab's)")
    g.addoption("--report-html", help="write the per-node HTML report to this file")
    g.addoption("--conformance-namespace", help="use this existing namespace (in-cluster Job) "
                "instead of creating one per run")
    g.addoption("--no-host", action="store_true", help="do not reach the nodes over SSH: "
                "host checks and comparisons with NVML on the node are skipped")
    g.addoption("--pod-host-network", action="store_true", help="run test pods with "
                "hostNetwork (clusters without a pod network, like the lab)")
    g.addoption("--shell-image", help="image with a POSIX shell for device pods "
                "(default busybox:1.36; lab: its local shell image)")
    g.addoption("--agent-image", help="gpukit node-agent image: reads the PodResources API and "
                "runs the pynvml workload (lab default: its local node-agent image)")
    g.addoption("--cuda-image", help="CUDA sample image for the real-GPU smoke test")
    g.addoption("--runtime-class", help="RuntimeClass of every test pod (where NVIDIA's runtime "
                "is not the nodes' default, so the GPU-less pod meets the runtime GPU pods do)")
    g.addoption("--pod-timeout", type=float, default=90.0, help="seconds a test pod may take to "
                "reach the state waited for (default 90)")
    g.addoption("--max-fill-pods", type=int, default=32, help="most pods used to fill one "
                "resource of a node (default 32)")
    g.addoption("--disruptive", action="store_true", help="also run the restarts area, which "
                "restarts each checked node's kubelet (not collected otherwise)")
    g.addoption("--api-only", action="store_true", help="the nodes have no kubelet (a "
                "simulated fleet): checks that need one, or the host, are skipped naming what "
                "they need; the API-side checks (discovery, labels) run")
    g.addoption("--node-parallelism", type=_parallelism, default=DEFAULT_NODE_PARALLELISM,
                help="nodes whose pods, probes and exclusive workloads are worked at once, "
                f"ahead of the tests (default {DEFAULT_NODE_PARALLELISM}; 1: each at the test "
                "that first needs it); the report is the same")


def pytest_configure(config: pytest.Config) -> None:
    for name, text in {**MARKERS, **EXTRA_MARKERS}.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    config.stash[RESULTS_KEY] = []
    if config.getoption("--inventory", None) or config.getoption("--lab", False):
        get_suite(config)  # a bad inventory is a usage error, before anything is collected


def _is_suite_path(path: Any) -> bool:
    return _in_suite_dir(str(path))


@functools.lru_cache(maxsize=256)
def _in_suite_dir(path: str) -> bool:
    # Asked for every test at each hook: resolving the path each time cost seconds per run.
    try:
        return Path(path).resolve().parent == SUITE_DIR
    except OSError:
        return False


def _options(config: pytest.Config) -> Any:
    from .suite import DEFAULT_CUDA_IMAGE, DEFAULT_SHELL_IMAGE, Options

    nodes = [n.strip() for n in (config.getoption("--nodes") or "").split(",") if n.strip()]
    return Options(
        inventory=config.getoption("--inventory"),
        host_vars=_host_vars(config.getoption("--host-vars")),
        kubeconfig=config.getoption("--kubeconfig"),
        nodes=nodes,
        lab=_lab(config),
        namespace=config.getoption("--conformance-namespace"),
        host_network=bool(config.getoption("--pod-host-network")),
        host_access=not config.getoption("--no-host"),
        shell_image=config.getoption("--shell-image") or DEFAULT_SHELL_IMAGE,
        agent_image=config.getoption("--agent-image"),
        cuda_image=config.getoption("--cuda-image") or DEFAULT_CUDA_IMAGE,
        pod_timeout=float(config.getoption("--pod-timeout")),
        max_fill_pods=int(config.getoption("--max-fill-pods")),
        report_html=config.getoption("--report-html"),
        runtime_class=config.getoption("--runtime-class") or None,
        node_parallelism=int(config.getoption("--node-parallelism")),
    )


def _parallelism(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(
            f"--node-parallelism: {text!r} is not a whole number of nodes >= 1")
    return int(text)


def stage_uses(items: list[pytest.Item]) -> list[Use]:
    """The suite's collected tests (in run order) as uses of per-node stages."""
    uses: list[Use] = []
    for item in items:
        mark = item.get_closest_marker("stages")
        callspec = getattr(item, "callspec", None)
        node = callspec.params.get("node") if callspec else None
        if mark is None or not _is_suite_path(item.path) or not isinstance(node, str):
            continue
        if item.get_closest_marker("skip") is not None:  # --api-only: nothing to work ahead
            continue
        assert callspec is not None
        uses.append(Use(node, str(callspec.params.get("resource", "")),
                        tuple(str(a) for a in mark.args)))
    return uses


def lab_inventory() -> Path | None:
    """The inventory a running gpukit lab wrote for itself (`<lab dir>/inventory`, the lab dir
    being gpukit.lab.config.state_dir's: GPUKIT_LAB_DIR, else /var/lib/gpukit-lab[-N] for
    GPUKIT_LAB_INSTANCE=N), None when there is none; found without gpukit.lab (not in the
    wheel). Its gpukit_kubeconfig is the lab's, which selects the lab's settings."""
    import os

    n = os.environ.get("GPUKIT_LAB_INSTANCE", "").strip()
    default = "/var/lib/gpukit-lab" + (f"-{n}" if n not in ("", "0") else "")
    path = Path(os.environ.get("GPUKIT_LAB_DIR", default)) / "inventory"
    return path if (path / "hosts.yml").is_file() else None


def _lab(config: pytest.Config) -> bool:
    lab = bool(config.getoption("--lab"))
    if lab and importlib.util.find_spec("gpukit.lab") is None:  # the wheel leaves the lab out
        found = lab_inventory()
        hint = (f"; against the running lab give its inventory: --inventory {found} (the lab's "
                "kubeconfig in it selects host networking and the lab's local images)"
                if found else "; give --inventory (and --kubeconfig) for another cluster")
        raise pytest.UsageError("--lab: gpukit's lab is not installed: it runs from a checkout "
                                f"of gpukit's repository (pip install -e '.[dev]' there){hint}")
    return lab


def _host_vars(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        raw = Path(text[1:]).read_text() if text.startswith("@") else text
        value = json.loads(raw)
    except (OSError, ValueError) as exc:
        raise pytest.UsageError(f"--host-vars: {text[:80]!r} is not JSON or @file: {exc}") from exc
    if not isinstance(value, dict):
        raise pytest.UsageError(f"--host-vars: {text[:80]!r} is not a JSON object of hosts")
    return value


def get_suite(config: pytest.Config) -> Any:
    """The run's Suite, made on first use (inventory errors are usage errors)."""
    suite = config.stash.get(SUITE_KEY, None)
    if suite is None:
        from gpukit.inventory import InventoryError

        from .suite import Suite

        try:
            suite = Suite(_options(config))
        except InventoryError as exc:
            raise pytest.UsageError(f"--inventory: {exc}") from exc
        config.stash[SUITE_KEY] = suite
    return suite


def _resources(suite: Any, node: str, kind: str) -> list[str]:
    from gpukit import inventory as inv
    from gpukit.conformance import expect

    resources = sorted(suite.resources(node))
    if kind == "all":
        return resources
    decl = suite.decl(node)
    if decl is None:
        if kind != "mig":
            return []
        return [r for r in resources if r.startswith(ln.MIG_RESOURCE_PREFIX)]
    if decl.dra:  # the device plugin's resources: a DRA node has none (the dra area's)
        return []
    try:
        units = expect.expected_units(decl)
    except inv.InventoryError:
        return []
    if kind == "mig":
        return sorted({u.resource for u in units if u.mig_profile})
    if kind == "shared":
        return sorted({u.resource for u in units if u.replicas > 1})
    raise ValueError(f"unknown per_resource kind {kind!r}")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if not _is_suite_path(metafunc.definition.path):
        return
    suite = get_suite(metafunc.config)
    try:
        nodes = suite.targets()
    except Exception as exc:  # one line for the run (collection_finish), not one per module
        why = suite.unreachable() or " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        metafunc.config.stash[NO_TARGETS_KEY] = f"cannot list the cluster's GPU nodes: {why}"
        nodes = []
    why = needs_a_node(metafunc.definition) if metafunc.config.getoption("--api-only",
                                                                         False) else ""
    if why and nodes and "node" in metafunc.fixturenames:
        # Skipped on every node alike: one test that says so, not one per node (a fleet of
        # 1000 made 35000 skipped tests, most of the run's time).
        every = [f"every-node-of-{len(nodes)}"]
        if "resource" in metafunc.fixturenames:
            metafunc.parametrize(["node", "resource"], [(ALL_NODES, "")], ids=every)
        else:
            metafunc.parametrize("node", [ALL_NODES], ids=every)
        return
    nodes, others = _applicable(metafunc, suite, nodes)
    if "resource" in metafunc.fixturenames:
        marker = metafunc.definition.get_closest_marker("per_resource")
        kind = marker.args[0] if marker and marker.args else "all"
        pairs = [(n, r) for n in nodes for r in _resources(suite, n, kind)]
        metafunc.parametrize(["node", "resource"], [*pairs, *others], ids=[
            *(f"{n}-{r.removeprefix(ln.RESOURCE_PREFIX)}" for n, r in pairs),
            *(p.id for p in others)])
    elif "node" in metafunc.fixturenames:
        metafunc.parametrize("node", [*nodes, *others], ids=[*nodes, *(p.id for p in others)])


# applies_to kinds: whether a node's declaration has it, and what the others lack.
APPLIES_TO: dict[str, tuple[Callable[[Any], bool], str]] = {
    "dra": (lambda d: bool(d.dra), "not on DRA (gpukit_gpu_allocation is not dra)"),
    "mig": (lambda d: bool(d.mig_declared), "declare no MIG layout (gpukit_mig_config is null)"),
    "taints": (lambda d: bool(d.taints), "declare no taints (gpukit_node_taints)"),
}


def _applicable(metafunc: pytest.Metafunc, suite: Any, nodes: list[str]
                ) -> tuple[list[str], list[Any]]:
    """The nodes an applies_to test checks, and one skipped parameter set that names the
    declared others (at 1000 nodes, 10 DRA checks skipping one by one were 10000 tests)."""
    mark = metafunc.definition.get_closest_marker("applies_to")
    if mark is None or not nodes:
        return nodes, []
    has, lacks = APPLIES_TO[str(mark.args[0])]
    decls = {n: suite.decl(n) for n in nodes}
    others = [n for n, d in decls.items() if d is not None and not has(d)]
    if not others:
        return nodes, []
    shown = ", ".join(others[:5]) + (f", ... {others[-1]}" if len(others) > 5 else "")
    skip = pytest.mark.skip(reason=f"{len(others)} node(s) {lacks}: {shown}")
    values = (ALL_NODES, "") if "resource" in metafunc.fixturenames else (ALL_NODES,)
    gone = set(others)
    return [n for n in nodes if n not in gone], [pytest.param(
        *values, marks=skip, id=f"{len(others)}-nodes-{mark.args[0]}-does-not-apply")]


def pytest_collection_finish(session: pytest.Session) -> None:
    """One usage error for an unusable cluster, before any test runs (not one traceback per
    test); --collect-only needs no cluster."""
    config = session.config
    no_targets = config.stash.get(NO_TARGETS_KEY, "")
    if no_targets:
        pytest.exit(f"conformance: {no_targets}", returncode=pytest.ExitCode.USAGE_ERROR)
    if config.option.collectonly or not any(_is_suite_path(i.path) for i in session.items):
        return
    why = get_suite(config).unreachable()
    if why:
        pytest.exit(f"conformance: {why}", returncode=pytest.ExitCode.USAGE_ERROR)


def area_of(item: pytest.Item) -> str:
    for mark in item.iter_markers():
        if mark.name in AREAS:
            return mark.name
    return "other"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    positions = [i for i, it in enumerate(items) if _is_suite_path(it.path)]
    if not positions:
        return
    if not config.getoption("--disruptive", False):
        # Opt-in, left out rather than skipped: a healthy cluster's run has no such skip.
        dropped = [items[i] for i in positions if area_of(items[i]) == "restarts"]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            gone = {id(it) for it in dropped}
            items[:] = [it for it in items if id(it) not in gone]
            positions = [i for i, it in enumerate(items) if _is_suite_path(it.path)]
            if not positions:
                return
    order = {a: i for i, a in enumerate(AREAS)}
    mine = [items[i] for i in positions]
    ranked = sorted(enumerate(mine), key=lambda p: (
        order.get(area_of(p[1]), len(AREAS)),
        p[1].get_closest_marker("exclusive") is not None,
        p[0],
    ))
    for pos, (_, item) in zip(positions, ranked, strict=True):
        items[pos] = item
    if config.getoption("--api-only", False):
        for item in mine:
            why = needs_a_node(item)
            if why:
                callspec = getattr(item, "callspec", None)
                node = callspec.params.get("node", ALL_NODES) if callspec else ALL_NODES
                where = (f"every node ({_node_count(config)})"
                         if callspec and callspec.params.get("node") == ALL_NODES
                         else f"node {node}")
                item.add_marker(pytest.mark.skip(
                    reason=f"{where}: --api-only (no kubelet): needs {why}"))


def _node_count(config: pytest.Config) -> int:
    try:
        return len(get_suite(config).targets())
    except Exception:  # collection already said why the nodes cannot be listed
        return 0


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A new area reads the cluster's nodes and ResourceSlices anew (one list each), as they
    are after the previous areas' work."""
    if not _is_suite_path(item.path):
        return
    area, config = area_of(item), item.config
    if config.stash.get(AREA_KEY, None) != area:
        config.stash[AREA_KEY] = area
        suite = config.stash.get(SUITE_KEY, None)
        if suite is not None:
            suite.forget_listings()


def needs_a_node(item: pytest.Item) -> str:
    """What of a real node a test needs beyond the API ("" when nothing): its stages', the
    host area's SSH, the CUDA sample's GPU."""
    mark = item.get_closest_marker("stages")
    needs = [NEEDS[s] for s in (mark.args if mark else ()) if s in NEEDS]
    if area_of(item) == "host":
        needs.insert(0, "the host over SSH")
    if item.get_closest_marker("cuda"):
        needs.append("a real GPU")
    return ", ".join(dict.fromkeys(needs))


@pytest.fixture(scope="session")
def gpukit_suite(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The conformance run; its namespace is deleted at the end, also on Ctrl-C or SIGTERM."""
    suite = get_suite(request.config)
    previous: Any = None
    if threading.current_thread() is threading.main_thread():
        def on_term(signum: int, frame: Any) -> None:
            raise KeyboardInterrupt(f"signal {signum}")

        previous = signal.signal(signal.SIGTERM, on_term)
    try:
        suite.start_workers(plan(stage_uses(request.session.items)))
        yield suite
    finally:
        try:
            suite.close()
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome: Any = yield
    if not _is_suite_path(item.path):
        return
    report: pytest.TestReport = outcome.get_result()
    if report.when != "call" and not (report.when == "setup" and not report.passed):
        return
    callspec = getattr(item, "callspec", None)
    params = callspec.params if callspec else {}
    if not isinstance(params.get("node", ALL_NODES), str):
        return  # an empty parameter set (no node to test): pytest's NOTSET is no node
    area = area_of(item)
    mark = item.get_closest_marker("cncf")
    cncf = str(mark.args[0]) if mark and mark.args else CNCF_BY_AREA.get(area, "")
    props: list[tuple[str, object]] = [("area", area), ("node", params.get("node", ALL_NODES))]
    if "resource" in params:
        props.append(("resource", params["resource"]))
    if cncf:
        props.append(("cncf_ai_conformance", cncf))
    c = item.stash.get(CHECK_KEY, None)
    for row in c.rows if c else []:
        props.append(("check", row.to_json()))
    report.user_properties.extend(props)
    item.user_properties.extend(props)  # JUnit writes those of the teardown report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    props = dict(p for p in report.user_properties if p[0] != "check")
    if "area" not in props:
        return
    wanted = report.when == "call" or (report.when == "setup" and not report.passed) or (
        report.when == "teardown" and report.failed)
    if not wanted:
        return
    outcome: str = report.outcome
    if report.when != "call" and report.failed:
        outcome = "error"
    message = ""
    if report.skipped and isinstance(report.longrepr, tuple):
        message = str(report.longrepr[2])
    elif report.failed:
        message = report.longreprtext
    rows = [Row.from_json(str(v)) for k, v in report.user_properties if k == "check"]
    name = report.nodeid.split("::")[-1].split("[")[0]
    results = _results_for(report)
    if results is None:
        return
    results.append(Result(
        nodeid=report.nodeid, name=name, area=str(props["area"]), node=str(props["node"]),
        resource=str(props.get("resource", "")), outcome=outcome, duration=report.duration,
        message=message, cncf=str(props.get("cncf_ai_conformance", "")), rows=rows,
    ))


_CONFIG: list[pytest.Config] = []


def _results_for(report: pytest.TestReport) -> list[Result] | None:
    return _CONFIG[-1].stash.get(RESULTS_KEY, None) if _CONFIG else None


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    _CONFIG.append(session.config)
    session.config.stash[STARTED_KEY] = time.monotonic()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if _CONFIG and _CONFIG[-1] is config:
        _CONFIG.pop()
    path = config.getoption("--report-html", None)
    results = config.stash.get(RESULTS_KEY, [])
    if not path:
        return
    suite = config.stash.get(SUITE_KEY, None)
    started = config.stash.get(STARTED_KEY, time.monotonic())
    meta = {"exit status": str(int(exitstatus)),
            "duration": f"{time.monotonic() - started:.1f}s"}
    if suite is not None:
        meta["inventory"] = suite.inventory_path or "none (checks that need none)"
        meta["nodes"] = ", ".join(suite.targets()) if suite.inventory is not None else "cluster"
    write(path, results, meta)
