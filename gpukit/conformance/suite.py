"""One conformance run: options, the inventory's expectations, the cluster, the run's namespace
and what was already measured (NVML on each node, filled nodes, helper pods)."""

from __future__ import annotations

import atexit
import datetime as dt
import json
import logging
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes.client.exceptions import ApiException

from gpukit import inventory as inv
from gpukit.conformance import expect
from gpukit.inventory.metrics import DEFAULT_PORT as DEFAULT_METRICS_PORT
from gpukit.k8s.names import dns_name
from gpukit.k8s.nodes import allocatable

from . import attribution as attribution_mod
from . import exclusive, runtime_path
from . import fill as fill_mod
from . import scraper as scraper_mod
from .cluster import Kube, load_api_client, pod_manifest
from .host import HostView, NvmlSeen, connect, read_view, run_probe
from .schedule import DEFAULT_NODE_PARALLELISM, StageKey, Stages, key_for

log = logging.getLogger(__name__)

LAB_SHELL_IMAGE = "localhost/gpukit-lab/shell:1"
LAB_AGENT_IMAGE = "localhost/gpukit-lab/node-agent:dev"
DEFAULT_SHELL_IMAGE = "busybox:1.36"
DEFAULT_CUDA_IMAGE = "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0"
POD_RESOURCES_DIR = "/var/lib/kubelet/pod-resources"
NAMESPACE_TTL = dt.timedelta(hours=2)

PODRESOURCES_SCRIPT = """
import json, grpc
from gpukit.plugin.api import podresources_grpc as g, podresources_pb2 as pb
ch = grpc.insecure_channel("unix://%s/kubelet.sock")
stub = g.PodResourcesListerStub(ch)
lst = stub.List(pb.ListPodResourcesRequest(), timeout=10)
alloc = stub.GetAllocatableResources(pb.AllocatableResourcesRequest(), timeout=10)
print(json.dumps({
  "pods": [{"namespace": p.namespace, "name": p.name, "containers": [
      {"name": c.name, "devices": [{"resource": d.resource_name, "ids": list(d.device_ids)}
                                   for d in c.devices]} for c in p.containers]}
           for p in lst.pod_resources],
  "allocatable": [{"resource": d.resource_name, "ids": list(d.device_ids)}
                  for d in alloc.devices]}))
""".replace("%s", POD_RESOURCES_DIR)


@dataclass
class Options:
    inventory: str | None = None
    host_vars: dict[str, Any] = field(default_factory=dict)
    kubeconfig: str | None = None
    nodes: list[str] = field(default_factory=list)
    lab: bool = False
    namespace: str | None = None
    host_network: bool = False
    host_access: bool = True
    shell_image: str = DEFAULT_SHELL_IMAGE
    agent_image: str | None = None
    cuda_image: str = DEFAULT_CUDA_IMAGE
    pod_timeout: float = 90.0
    max_fill_pods: int = 32
    report_html: str | None = None
    runtime_class: str | None = None
    node_parallelism: int = DEFAULT_NODE_PARALLELISM


@dataclass
class PodResourcesView:
    """The kubelet's PodResources answer on one node."""

    pods: dict[tuple[str, str], dict[str, list[str]]]  # (namespace, pod) -> resource -> IDs
    allocatable: dict[str, list[str]]

    def devices(self, namespace: str, pod: str) -> dict[str, list[str]]:
        return self.pods.get((namespace, pod), {})

    @staticmethod
    def parse(doc: dict[str, Any]) -> PodResourcesView:
        pods: dict[tuple[str, str], dict[str, list[str]]] = {}
        for p in doc.get("pods", []):
            per: dict[str, list[str]] = {}
            for c in p.get("containers", []):
                for d in c.get("devices", []):
                    per.setdefault(d["resource"], []).extend(d["ids"])
            pods[(p["namespace"], p["name"])] = per
        alloc: dict[str, list[str]] = {}
        for d in doc.get("allocatable", []):
            alloc.setdefault(d["resource"], []).extend(d["ids"])
        return PodResourcesView(pods=pods, allocatable=alloc)


def is_lab_kubeconfig(path: str | None) -> bool:
    """The kubeconfig of a gpukit lab instance (`/var/lib/gpukit-lab[-N]/kubeconfig`)."""
    return bool(path) and re.fullmatch(r"gpukit-lab(-\d)?", Path(str(path)).parent.name) is not None


class Suite:
    def __init__(self, options: Options) -> None:
        self.options = options
        self.inventory_path: str | None = None
        self.inventory: inv.GpuInventory | None = None
        self.cluster: Any = None  # the pytest-kubernetes cluster manager
        self._kube: Kube | None = None
        self._namespace: str | None = None
        self._own_namespace = False
        self._lock = threading.RLock()  # the run's own state; nodes' work is in self.stages
        self._scraper_account = False  # conformance.scraper.ensure_account done
        self.stages = Stages()
        self._hosts: dict[str, Any] = {}
        self._names: dict[str, int] = {}
        self._expect_errors: dict[str, str] = {}
        self._collection_nodes: dict[str, Any] | None = None
        # The API-side checks read the cluster's nodes and ResourceSlices from one list each
        # (per area: plugin.py lists again when the next area starts), not one GET per test.
        self._listed_nodes: dict[str, Any] | None = None
        self._listed_slices: dict[str, list[dict[str, Any]]] | None = None
        self._decls: dict[str, inv.NodeDecl] | None = None
        self._expected: dict[str, dict[str, int] | None] = {}
        self._planned: dict[str, list[StageKey]] = {}  # the run's tests' stages, per node
        self.closed = False
        # node -> how the inventory says its GPU pods reach the NVIDIA runtime (none without
        # an inventory: the pods run as --runtime-class says, else under the default)
        self.runtime_paths: dict[str, runtime_path.RuntimePath] = {}
        if options.lab and not options.inventory:
            from gpukit.lab.config import load_spec
            from gpukit.lab.inventory import for_instance

            options.inventory = str(for_instance(load_spec()))
        if options.inventory:
            self.inventory_path = options.inventory
            # --host-vars may also name the runtime path's role variables (runtime_path reads
            # them); the model takes only the declaration's.
            declared = {h: {k: v for k, v in hv.items() if k not in runtime_path.DEFAULTS}
                        for h, hv in (options.host_vars or {}).items()}  # fmt: skip
            self.inventory = inv.load(options.inventory, hosts=options.nodes or None,
                                      host_vars=declared)
            self.runtime_paths = runtime_path.declared(
                options.inventory, {n.host: n.node_name for n in self.inventory.nodes},
                options.host_vars)
        kubeconfig = options.kubeconfig or (self.inventory.kubeconfig if self.inventory else None)
        if options.lab or is_lab_kubeconfig(kubeconfig):
            # The lab: no pod network (host networking), images are local, nothing is pulled.
            options.host_network = True
            if options.shell_image == DEFAULT_SHELL_IMAGE:
                options.shell_image = LAB_SHELL_IMAGE
            if options.agent_image is None:
                options.agent_image = LAB_AGENT_IMAGE

    # ---- what to test

    def targets(self) -> list[str]:
        if self.inventory is not None:
            return self.inventory.node_names()
        nodes = self._nodes_at_collection()
        names = [n for n, obj in nodes.items() if any(v > 0 for v in allocatable(obj).values())]
        if self.options.nodes:
            names = [n for n in self.options.nodes if n in nodes]
        return sorted(names)

    def _nodes_at_collection(self) -> dict[str, Any]:
        if self._collection_nodes is None:
            self._collection_nodes = self.kube.nodes()
        return self._collection_nodes

    def listed_node(self, node: str) -> Any | None:
        """The node as the current area's one list of nodes has it (None: not registered)."""
        with self._lock:
            if self._listed_nodes is None:
                self._listed_nodes = self.kube.nodes()
            return self._listed_nodes.get(node)

    def listed_slices(self, node: str, driver: str) -> list[dict[str, Any]]:
        """The node's ResourceSlices of `driver` (plain JSON) from the area's one list."""
        with self._lock:
            if self._listed_slices is None:
                self._listed_slices = {}
                for s in self.kube.resource_slices():
                    spec = s.get("spec") or {}
                    key = f"{spec.get('nodeName')}/{spec.get('driver')}"
                    self._listed_slices.setdefault(key, []).append(s)
            return list(self._listed_slices.get(f"{node}/{driver}", []))

    def forget_listings(self) -> None:
        """The next listed_node/listed_slices lists again (a new area starts)."""
        with self._lock:
            self._listed_nodes = None
            self._listed_slices = None

    def decl(self, node: str) -> inv.NodeDecl | None:
        if self.inventory is None:
            return None
        if self._decls is None:  # by node and host name: inventory.node() scans the fleet
            self._decls = {k: n for n in self.inventory.nodes for k in (n.host, n.node_name)}
        found = self._decls.get(node)
        return found if found is not None else self.inventory.node(node)

    def expected_resources(self, node: str) -> dict[str, int] | None:
        """What the declaration implies the node advertises (worked out once per node)."""
        if node in self._expected:
            got = self._expected[node]
            return dict(got) if got is not None else None
        decl = self.decl(node)
        if decl is None:
            return None
        try:
            found: dict[str, int] | None = expect.expected_resources(decl)
        except inv.InventoryError as exc:
            self._expect_errors[node] = str(exc)
            found = None
        self._expected[node] = found
        return dict(found) if found is not None else None

    def expectation_error(self, node: str) -> str:
        return self._expect_errors.get(node, "")

    def resources(self, node: str) -> dict[str, int]:
        """Resources to exercise on the node: the declared ones, else what it advertises."""
        expected = self.expected_resources(node)
        if expected is not None:
            return {r: n for r, n in expected.items() if n > 0}
        if self.inventory is not None:
            return {}
        obj = self._nodes_at_collection().get(node)
        return {r: n for r, n in allocatable(obj).items() if n > 0}

    def shared_resources(self, node: str) -> dict[str, tuple[int, ...]]:
        decl = self.decl(node)
        if decl is None:
            return {}
        try:
            return expect.shared_resources(decl)
        except inv.InventoryError:
            return {}

    # ---- cluster

    def unreachable(self, timeout: float = 15.0) -> str:
        """Why the cluster cannot be used ("" when it answers): a missing or broken
        kubeconfig, or an API server that does not answer /version."""
        from kubernetes import client

        try:
            kube = self.kube
            client.VersionApi(kube.api_client).get_code(_request_timeout=timeout)
        except Exception as exc:  # kubeconfig, TLS, connection: all one usage error
            where = self.kubeconfig_origin()
            path = self.options.kubeconfig or (self.inventory.kubeconfig if self.inventory
                                               else None)
            if path and not Path(path).expanduser().is_file():
                return f"cannot reach the cluster: {where} does not exist"
            detail = " ".join(str(exc).split())[:300]
            return f"cannot reach the cluster through {where}: {type(exc).__name__}: {detail}"
        return ""

    def kubeconfig_origin(self) -> str:
        """Where the run's kubeconfig comes from, as the user wrote it (errors name it)."""
        if self.options.kubeconfig:
            return f"--kubeconfig {self.options.kubeconfig}"
        if self.options.lab:
            return "the lab's kubeconfig"
        if self.inventory is not None and self.inventory.kubeconfig:
            return (f"the inventory's gpukit_kubeconfig ({self.inventory.kubeconfig}, "
                    f"{self.inventory_path})")
        return "$KUBECONFIG, ~/.kube/config or in-cluster (no --inventory, no --kubeconfig)"

    @property
    def kube(self) -> Kube:
        with self._lock:
            if self._kube is None:
                self._kube = Kube(load_api_client(self._kubeconfig()),
                                  runtime_class=self.options.runtime_class,
                                  node_runtime_classes={
                                      dns_name(n): p.pod_class
                                      for n, p in self.runtime_paths.items()})
            return self._kube

    def _kubeconfig(self) -> str | None:
        if self.options.kubeconfig:
            path = self.options.kubeconfig
        elif self.options.lab:
            from gpukit.lab.pytest_provider import LabManager

            self.cluster = LabManager()
            self.cluster.create()
            return str(self.cluster.kubeconfig)
        elif self.inventory is not None and self.inventory.kubeconfig:
            path = self.inventory.kubeconfig
        else:
            return None  # $KUBECONFIG, ~/.kube/config, or in-cluster
        from pytest_kubernetes.providers import select_provider_manager

        manager_class = select_provider_manager("external", {"kubeconfig": path})
        self.cluster = manager_class("gpukit-conformance", None, Path(path))
        self.cluster._created = False  # never delete what we did not create
        return path

    @property
    def namespace(self) -> str:
        with self._lock:
            if self._namespace is None:
                kube = self.kube
                if self.options.namespace:
                    self._namespace = self.options.namespace
                else:
                    gone = kube.delete_expired_namespaces()
                    if gone:
                        log.warning("deleted expired namespaces of killed runs: %s", gone)
                    name = f"gpukit-conformance-{kube.run_id}"
                    kube.create_namespace(name, NAMESPACE_TTL)
                    self._own_namespace = True
                    self._namespace = name
                    atexit.register(self._atexit)
                kube.ensure_workload_account(self._namespace)
            return self._namespace

    def pod_name(self, role: str, node: str, resource: str = "", extra: str = "") -> str:
        with self._lock:
            base = dns_name(*fill_mod.pod_name_parts(role, node, resource), extra, limit=56)
            n = self._names.get(base, 0)
            self._names[base] = n + 1
            return base if n == 0 else dns_name(base, str(n))

    # ---- nodes as hosts

    def host(self, node: str) -> Any:
        decl = self.decl(node)
        if not self.options.host_access:
            raise LookupError("host access is off (--no-host)")
        if decl is None or self.inventory_path is None:
            raise LookupError("host checks need --inventory (the nodes are reached through it)")
        with self._lock:
            if node not in self._hosts:
                self._hosts[node] = connect(self.inventory_path, decl.host)
            return self._hosts[node]

    def probe(self, node: str) -> NvmlSeen | None:
        """NVML on the node (once); None when the node cannot be probed (see probe_error)."""
        got = self._probed(node)
        return got if isinstance(got, NvmlSeen) else None

    def probe_error(self, node: str) -> str:
        if not self.stages.done(node, key_for("probe")):
            return ""
        got = self._probed(node)
        return got if isinstance(got, str) else ""

    def _probed(self, node: str) -> NvmlSeen | str:
        def compute() -> NvmlSeen | str:
            try:
                return run_probe(self.host(node))
            except Exception as exc:  # SSH, inventory, python3 missing: a reason, not a crash
                return f"{type(exc).__name__}: {exc}"

        return self.stages.once(node, key_for("probe"), compute)

    def host_view(self, node: str) -> HostView:
        """What the host checks read on the node (once; after its probe: the lab's mock has
        no kernel module to read)."""
        def compute() -> HostView:
            decl = self.decl(node)
            if decl is None:
                raise LookupError("host checks need --inventory (the nodes are reached through "
                                  "it)")
            probe = self.probe(node)
            return read_view(self.host(node), decl, self.expected_resources(node) or {},
                             mock=bool(probe and probe.mock))

        return self.stages.once(node, key_for("host"), compute)

    # ---- the kubelet's PodResources API, read on the node

    def helper(self, node: str) -> str:
        """A pod on the node that can read the PodResources socket (gpukit's agent image)."""
        return self.stages.once(node, key_for("helper"), lambda: self._start_helper(node))

    def _start_helper(self, node: str) -> str:
        if not self.options.agent_image:
            raise LookupError("reading the kubelet's PodResources API needs --agent-image "
                              "(gpukit's node-agent image: python3, grpcio, gpukit)")
        name = self.pod_name("podresources", node)
        self.kube.create_pod(self.namespace, pod_manifest(
            name, run_id=self.kube.run_id, role="helper", node=node,
            image=self.options.agent_image,
            # PID 1 ignores SIGTERM unless it handles it: exit at once when deleted.
            command=["python3", "-c", "import signal, sys, time; signal.signal("
                     "signal.SIGTERM, lambda *a: sys.exit(0)); time.sleep(10**7)"],
            host_network=self.options.host_network,
            host_paths=[("pod-resources", POD_RESOURCES_DIR, "Directory")],
        ))
        state = self.kube.wait_pods(self.namespace, [name], self.options.pod_timeout,
                                    node=node)[name]
        if state.state != "Running":
            raise RuntimeError(f"PodResources reader pod {name} is {state} (expected Running)")
        return name

    def podresources(self, node: str) -> tuple[PodResourcesView | None, str]:
        try:
            pod = self.helper(node)
        except (LookupError, RuntimeError) as exc:
            return None, str(exc)
        res = self.kube.exec(self.namespace, pod, ["python3", "-c", PODRESOURCES_SCRIPT])
        if res.rc != 0:
            return None, f"PodResources API on {node}: rc {res.rc}: {res.stderr.strip()}"
        try:
            return PodResourcesView.parse(json.loads(res.stdout.strip().splitlines()[-1])), ""
        except (ValueError, IndexError, KeyError) as exc:
            return None, f"PodResources API on {node}: unreadable answer {res.stdout!r}: {exc}"

    # ---- the agent's metrics, read from a pod on the node (conformance.scraper)

    def scraper(self, node: str) -> tuple[str, str]:
        """(the node's scraper pod, the agent's endpoint: http://host:port)."""
        return self.stages.once(node, key_for("scraper"), lambda: self._start_scraper(node))

    def _start_scraper(self, node: str) -> tuple[str, str]:
        try:
            with self._lock:  # one account for the run, bound before any node's pod scrapes
                if not self._scraper_account:
                    scraper_mod.ensure_account(self.kube, self.namespace)
                    self._scraper_account = True
            address = scraper_mod.node_address(self.kube, node)
        except ApiException as exc:
            raise scraper_mod.ScrapeError(
                f"the scraper's account or node {node}'s address: HTTP {exc.status} "
                f"{exc.reason}") from exc
        decl = self.decl(node)
        target = (decl.metrics.target(address) if decl is not None
                  else f"{address}:{DEFAULT_METRICS_PORT}")
        name = self.pod_name("scraper", node)
        self.kube.create_pod(self.namespace, scraper_mod.pod(
            name, run_id=self.kube.run_id, node=node, image=self.options.shell_image,
            host_network=self.options.host_network))
        state = self.kube.wait_pods(self.namespace, [name], self.options.pod_timeout,
                                    node=node)[name]
        if state.state != "Running":
            raise scraper_mod.ScrapeError(f"scraper pod {name} on node {node} is {state} "
                                          "(expected Running)")
        return name, f"http://{target}"

    def scrape(self, node: str, authorised: bool = True, path: str = "/metrics"
               ) -> scraper_mod.Answer:
        """GET `path` of the agent's endpoint on `node`, with the scraper's token or without."""
        pod, base = self.scraper(node)
        return scraper_mod.get(self.kube, self.namespace, pod, node, base + path, authorised)

    # ---- filled nodes

    def fill(self, node: str) -> fill_mod.NodeFill:
        """The node filled with pods (once): the record stays after release."""
        return self.stages.once(node, key_for("fill"), lambda: fill_mod.run(self, node))

    def release(self, node: str) -> None:
        """Give the node's devices back (delete its fill pods, once) before tests that need
        them."""
        self.stages.once(node, key_for("release"), lambda: self._release(node))

    def attribution(self, node: str) -> attribution_mod.Attribution:
        """The agent's pod labels on the fill's devices, observed while the fill runs (once)."""
        return self.stages.once(node, key_for("attribution"),
                                lambda: attribution_mod.observe(self, node))

    def _release(self, node: str) -> None:
        if not self.stages.done(node, key_for("fill")):
            return
        try:
            done = self.fill(node)
        except Exception:  # the fill failed: whatever it created goes with the run's pods
            return
        if key_for("attribution") in self._planned.get(node, ()):
            # Its tests come after the release (the metrics area): observe before the pods go.
            try:
                self.attribution(node)
            except Exception:  # kept in the stage for its test
                pass
        if done.pods:
            left = self.kube.delete_pods(self.namespace, done.pods, self.options.pod_timeout,
                                         node=node)
            if left:
                raise RuntimeError(f"node {node}: pods {left} were not deleted within "
                                   f"{self.options.pod_timeout:.0f}s")

    # ---- pods that need the node's devices free

    def request_above_one(self, node: str, resource: str) -> exclusive.PodRun:
        def compute() -> exclusive.PodRun:
            self.release(node)
            return exclusive.request_above_one(self, node, resource)

        return self.stages.once(node, key_for("gt1", resource), compute)

    def workload(self, node: str, resource: str, lab: bool) -> exclusive.PodRun:
        def compute() -> exclusive.PodRun:
            self.release(node)
            return exclusive.workload(self, node, resource, lab)

        return self.stages.once(node, key_for("workload", resource), compute)

    # ---- working nodes ahead of the tests

    def run_stage(self, node: str, key: StageKey) -> object:
        """One stage of the plan, for a node worker (conformance.schedule)."""
        from .common import lab_mode

        if key.stage == "probe":
            return self.probe(node)
        if key.stage == "host":
            return self.host_view(node)
        if key.stage == "helper":
            return self.helper(node)
        if key.stage == "scraper":
            return self.scraper(node)
        if key.stage == "fill":
            return self.fill(node)
        if key.stage == "attribution":
            return self.attribution(node)
        if key.stage == "release":
            self.release(node)
            return None
        if key.stage == "gt1":
            return self.request_above_one(node, key.resource)
        if key.stage == "workload":
            return self.workload(node, key.resource, lab_mode(self, node))
        raise ValueError(f"unknown stage {key}")

    def start_workers(self, steps: dict[str, list[StageKey]]) -> None:
        """Work the nodes' stages ahead of the tests, --node-parallelism nodes at once; only
        what their tests will ask for (those skip before the exclusive pods on an undeclared
        node, and before the workload without an agent image)."""
        def wanted(node: str, key: StageKey) -> bool:
            if key.stage in ("probe", "host", "gt1", "workload") and self.decl(node) is None:
                return False
            if key.stage in ("probe", "host") and not self.options.host_access:
                return False
            return not (key.stage == "workload" and not self.options.agent_image)

        steps = {n: [k for k in keys if wanted(n, k)] for n, keys in steps.items()}
        self._planned = steps
        self.stages.start({n: k for n, k in steps.items() if k}, self.run_stage,
                          self.options.node_parallelism)

    # ---- the end

    def close(self) -> None:
        """Delete every pod of the run (waiting until they are gone, so their devices are
        free), then the run's namespace (the API finishes that on its own, in seconds)."""
        if self.closed:
            return
        self.closed = True
        self.stages.stop()
        try:
            if self._namespace is not None and self._kube is not None:
                left = self._kube.delete_run_pods(self._namespace, self.options.pod_timeout)
                if left:
                    log.warning("pods %s still terminating", left)
                if self._own_namespace:
                    self._kube.delete_namespace(self._namespace, timeout=0)
        finally:
            if self.cluster is not None:
                self.cluster.delete()  # a no-op unless the provider created the cluster

    def _atexit(self) -> None:
        if not self.closed and self._namespace and self._kube and self._own_namespace:
            try:
                self._kube.core.delete_namespace(self._namespace,
                                                 propagation_policy="Background")
            except Exception:
                pass
