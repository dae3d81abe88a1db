"""The conformance suite against the lab: it passes on a lab provisioned from the lab
inventory, and fails, naming node, resource, expected and observed, when the lab is broken on
purpose (wrong replicas, a different MIG layout, a GPU handed out twice, a missing label, an XID,
a stopped plugin). The lab instance comes from the environment (GPUKIT_LAB_INSTANCE)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import labprovision as lp
import pytest
import yaml
from kubernetes import client

from gpukit import inventory as inv
from gpukit.conformance import expect, scraper
from gpukit.lab import agent, cluster
from gpukit.lab.config import LabSpec, load_spec
from gpukit.lab.inventory import for_instance

pytestmark = pytest.mark.lab
MANAGED = "app.kubernetes.io/managed-by=gpukit-conformance"
HERE = Path(__file__).resolve().parent
# What a skip on the healthy lab may name: a declaration (a variable, a config and its
# settings, a declared absence) or the lab's lack of a real GPU and kernel driver.
ALLOWED_SKIP = re.compile(r"gpukit_\w+|nvidia_\w+|declares no|config '[^']+'|migStrategy is"
                          r"|no real GPU|the gpukit lab mock")


@dataclass
class Run:
    rc: int
    seconds: float
    output: str
    passed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    skip_reasons: dict[str, str] = field(default_factory=dict)
    html: str = ""

    def messages(self) -> str:
        return "\n".join(self.failed.values())


def run_suite(tmp: Path, *args: str) -> Run:
    junit, html = tmp / "junit.xml", tmp / "report.html"
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "gpukit/conformance", "--lab", "-q", "-p", "no:cacheprovider",
         f"--junitxml={junit}", f"--report-html={html}", *args],
        cwd=lp.REPO, capture_output=True, text=True, timeout=300,
    )
    run = Run(proc.returncode, time.monotonic() - t0, proc.stdout[-6000:] + proc.stderr[-3000:])
    if junit.exists():
        for case in ET.parse(junit).getroot().iter("testcase"):
            name = case.get("name", "")
            bad = case.find("failure")
            if bad is None:
                bad = case.find("error")
            if bad is not None:
                run.failed[name] = (bad.get("message") or "") + "\n" + (bad.text or "")
            elif (skip := case.find("skipped")) is not None:
                run.skipped.append(name)
                run.skip_reasons[name] = skip.get("message") or ""
            else:
                run.passed.append(name)
    if html.exists():
        run.html = html.read_text()
    return run


@dataclass
class Lab:
    spec: LabSpec
    fleet: inv.GpuInventory
    tmp: Path

    def decl(self, name: str) -> inv.NodeDecl:
        return self.fleet.node(name)


@pytest.fixture(scope="module")
def lab(lab_cluster: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    spec = load_spec()
    fleet = inv.load(for_instance(spec))
    lp.provision(spec, fleet)
    yield Lab(spec, fleet, tmp_path_factory.mktemp("suite"))
    lp.unprovision(spec, fleet)  # leave the lab as bare as the lab tests expect it


def test_suite_passes_on_the_provisioned_lab(lab: Lab, tmp_path: Path) -> None:
    run = run_suite(tmp_path)
    for node in lab.fleet.node_names():  # the agent says it serves its declaration (issue 30)
        assert f"test_the_agent_s_declaration_condition_agrees[{node}]" in run.passed, node
        # ... and answers only an authorised scraper (gpukit_metrics_auth's default)
        assert f"test_only_an_authorised_scraper_reads_the_metrics[{node}]" in run.passed, node
    print(f"conformance suite on the {len(lab.fleet.nodes)}-node lab: {run.seconds:.1f}s, "
          f"{len(run.passed)} passed, {len(run.skipped)} skipped")
    assert run.rc == 0, run.output
    assert not run.failed
    assert len(run.passed) >= 60, run.output
    # No check skips on a healthy cluster because its own setup is gone (the metrics area's
    # attribution once skipped in every run: the fill was released before it ran): every skip
    # names a declaration or the missing real GPU.
    vacuous = {n: m for n, m in run.skip_reasons.items() if not ALLOWED_SKIP.search(m)}
    assert not vacuous, vacuous
    assert any(n.startswith("test_a_running_gpu_pod_s_series_carry_its_labels")
               for n in run.passed), run.skip_reasons
    # every area ran on every node it applies to, and the report shows the grid
    for area in ("discovery", "labels", "host", "isolation", "mig", "timeslicing", "workload"):
        assert f"<th>{area}</th>" in run.html
    for node in lab.fleet.node_names():
        assert f"id='node-{node}'" in run.html
    assert "secure_accelerator_access" in run.html
    # nothing left behind: the run's namespace goes (the API finishes it within seconds)
    api = lp.core()
    for ns in api.list_namespace(label_selector=MANAGED).items:
        assert lp.wait_gone_namespace(ns.metadata.name, timeout=60), ns.metadata.name
    # ... and with it the scraper's ClusterRoleBinding (owned by the namespace)
    rbac = client.RbacAuthorizationV1Api(api.api_client)

    def bindings() -> list[str]:
        return [b.metadata.name for b in rbac.list_cluster_role_binding().items
                if b.metadata.name.startswith(f"{scraper.SCRAPER_ROLE}-")]

    deadline = time.monotonic() + 60
    while bindings() and time.monotonic() < deadline:
        time.sleep(1)
    assert not bindings(), bindings()


def test_job_manifests_are_accepted_by_the_apiserver(lab: Lab) -> None:
    docs = list(yaml.safe_load_all((lp.REPO / "gpukit/conformance/deploy/job.yaml").read_text()))
    namespace, rest = docs[0], docs[1:]
    name = namespace["metadata"]["name"]
    cluster.kubectl(lab.spec, "apply", "-f", "-", stdin=yaml.safe_dump(namespace))
    try:
        out = cluster.kubectl(lab.spec, "apply", "--dry-run=server", "-f", "-",
                            stdin=yaml.safe_dump_all(rest))
        assert out.count("(server dry run)") == len(rest), out
    finally:
        cluster.kubectl(lab.spec, "delete", "namespace", name, "--wait=false")


def _expect_failures(run: Run, *needles: str) -> None:
    assert run.rc == 1, run.output
    text = run.messages()
    for needle in needles:
        assert needle in text, f"{needle!r} not in failures:\n{text}\n{run.output}"


@pytest.fixture(scope="module")
def relabelled(lab: Lab) -> Run:
    """gpu-t4 switched to a config with 2 replicas (the inventory says 4); gpu-a100 to one that
    hands every whole GPU out twice (the inventory shares nothing): one suite run over both,
    then the lab is put back."""
    t4, a100 = lab.decl("gpu-t4"), lab.decl("gpu-a100")
    lp.set_labels(t4.node_name, {inv.DEVICE_PLUGIN_CONFIG_LABEL: "time-sliced-2"})
    lp.set_labels(a100.node_name, {inv.DEVICE_PLUGIN_CONFIG_LABEL: "mig-mixed-overlap"})
    try:
        lp.wait_resources(t4.node_name, {"nvidia.com/gpu": 4})
        lp.wait_node(a100.node_name, lambda o: lp.advertised(o).get("nvidia.com/gpu") == 12,
                     "12 nvidia.com/gpu (6 GPUs advertised twice)", 60)
        return run_suite(lab.tmp / "relabelled", "-m",
                        "discovery or labels or timeslicing or isolation",
                        "-k", "not (a100 and mig) and not without_gpu")
    finally:
        for decl in (t4, a100):
            lp.set_labels(decl.node_name, decl.selection_labels())
        for decl in (t4, a100):
            lp.wait_resources(decl.node_name, expect.expected_resources(decl))


def test_wrong_replica_count_fails(relabelled: Run) -> None:
    # The agent says so too: its condition True agrees with what the suite finds (issue 30).
    assert "test_the_agent_s_declaration_condition_agrees[gpu-t4]" in relabelled.passed
    _expect_failures(
        relabelled,
        "node gpu-t4: nvidia.com/gpu: capacity: expected 8, observed 4",
        "node gpu-t4: nvidia.com/gpu: allocatable: expected 8, observed 4",
        "node gpu-t4: label nvidia.com/gpu.replicas: expected 4, observed 2",
        "node gpu-t4: label nvidia.com/device-plugin.config: expected time-sliced, "
        "observed time-sliced-2",
        "node gpu-t4: nvidia.com/gpu: replicas per device: expected [4, 4], observed [2, 2]",
        "node gpu-t4: nvidia.com/gpu: pods per physical device: expected [4, 4], observed [2, 2]",
    )


def test_a_gpu_handed_out_twice_fails(relabelled: Run) -> None:
    _expect_failures(
        relabelled,
        "node gpu-a100: nvidia.com/gpu: physical devices shared by containers: expected [], "
        "observed [GPU-",
        "node gpu-a100: nvidia.com/gpu: capacity: expected 6, observed 12",
    )


@pytest.fixture(scope="module")
def relaid(lab: Lab) -> Run:
    """gpu-a100 with MIG off on GPU 1 (the layout enables it) and its mig.config label gone."""
    decl = lab.decl("gpu-a100")
    gpus = list(decl.mig_gpus)
    gpus[1] = inv.GpuMig(1, mig_enabled=False)
    lp.apply_mig(lab.spec, decl.node_name, lp.mig_plan(decl, gpus))
    lp.set_labels(decl.node_name, {inv.MIG_CONFIG_LABEL: None})
    try:
        lp.wait_resources(decl.node_name, {
            "nvidia.com/gpu": 7, "nvidia.com/mig-1g.5gb": 2, "nvidia.com/mig-2g.10gb": 1,
            "nvidia.com/mig-3g.20gb": 1}, timeout=60)
        return run_suite(lab.tmp / "relaid", "--nodes", decl.node_name, "-m", "mig or labels")
    finally:
        lp.set_labels(decl.node_name, decl.selection_labels())
        lp.apply_mig(lab.spec, decl.node_name, lp.mig_plan(decl))
        lp.wait_resources(decl.node_name, expect.expected_resources(decl), timeout=60)
        lp.declare(inv.load(for_instance(lab.spec)), decl.node_name)


def test_mig_layout_that_differs_fails(relaid: Run) -> None:
    _expect_failures(
        relaid,
        "node gpu-a100: GPU 1 MIG mode: expected enabled, observed disabled",
        "node gpu-a100: GPU 1 MIG devices: expected [1g.5gb, 1g.5gb, 2g.10gb, 3g.20gb], "
        "observed []",
        "node gpu-a100: nvidia.com/mig-3g.20gb: allocatable: expected 2, observed 1",
        "node gpu-a100: nvidia.com/mig-1g.5gb: devices per parent GPU: expected {0=2, 1=2}, "
        "observed {0=2}",
        "node gpu-a100: label nvidia.com/mig-1g.5gb.count: expected 4, observed 2",
    )


def test_a_missing_label_fails(relaid: Run) -> None:
    _expect_failures(relaid, "node gpu-a100: label nvidia.com/mig.config: expected mixed-a100, "
                             "observed none")


def test_an_xid_that_takes_a_gpu_out_fails(lab: Lab, tmp_path: Path) -> None:
    node = "gpu-t4"
    lp.mock_cli(lab.spec, node, "inject-xid", "--gpu", "0", "--xid", "79")
    try:
        lp.wait_resources(node, {"nvidia.com/gpu": 4})  # GPU 0's 4 replicas are Unhealthy
        run = run_suite(tmp_path, "--nodes", node, "-m", "discovery")
        _expect_failures(run, "node gpu-t4: nvidia.com/gpu: allocatable: expected 8, observed 4")
        # The kubelet's GetAllocatableResources lists healthy devices only: it agrees.
        assert "test_kubelet_sees_the_same_devices[gpu-t4]" in run.passed
        # The agent's served-vs-declared condition says True: it agrees too (issue 30).
        assert "test_the_agent_s_declaration_condition_agrees[gpu-t4]" in run.passed
        # A condition that does not say what the suite finds fails, naming node, expected and
        # observed (the agent writes it only when its verdict changes: this one stays).
        lp.core().patch_node_status(node, {"status": {"conditions": [{
            "type": "GpuDeclarationMismatch", "status": "False", "reason": "ServesDeclaration",
            "message": "stale"}]}})
        stale = run_suite(tmp_path / "stale", "--nodes", node, "-m", "discovery",
                          "-k", "declaration_condition")
        _expect_failures(stale, "node gpu-t4: condition GpuDeclarationMismatch: expected True "
                                "(allocatable {nvidia.com/gpu=4}, declared {nvidia.com/gpu=8}), "
                                "observed False (ServesDeclaration: stale)")
    finally:
        lp.restart_agent_on(node)  # the lab agent keeps XID'd devices out until it restarts
        lp.wait_resources(node, expect.expected_resources(lab.decl(node)))


def test_a_pinned_driver_version_that_does_not_run_fails(lab: Lab, tmp_path: Path) -> None:
    """Issue 14 point 10: host_vars pin a driver version of the declared branch that the node
    does not run (given as --host-vars, as upgrade.yml passes `-e` values): the suite fails,
    naming node, expected and observed; pinning the version the node runs passes."""
    node, pinned = "gpu-t4", "550.127.05"
    (tmp_path / "other").mkdir()
    (tmp_path / "same").mkdir()
    run = run_suite(tmp_path / "other", "--nodes", node, "-m", "host", "-k", "driver_version",
                    "--host-vars", json.dumps({node: {"nvidia_driver_version": pinned}}))
    assert run.rc == 1, run.output
    found = re.search(rf"node {node}: driver version \(nvmlSystemGetDriverVersion\): "
                      rf"expected {re.escape(pinned)}, observed (\S+)", run.messages())
    assert found, f"no failure naming node, expected and observed:\n{run.messages()}"
    running = found.group(1)
    assert running != pinned and running.startswith("550."), running
    run = run_suite(tmp_path / "same", "--nodes", node, "-m", "host", "-k", "driver_version",
                    "--host-vars", json.dumps({node: {"nvidia_driver_version": running}}))
    assert run.rc == 0 and f"test_driver_version[{node}]" in run.passed, run.output


def test_a_stopped_plugin_fails(lab: Lab, tmp_path: Path) -> None:
    d = lp.deployment(lab.fleet)
    agent.remove(lab.spec, d)
    try:
        for decl in lab.fleet.nodes:
            lp.wait_resources(decl.node_name, {})
        run = run_suite(tmp_path, "--nodes", "gpu-t4", "-m", "discovery or host",
                        "-k", "capacity or sockets")
        _expect_failures(
            run,
            "node gpu-t4: nvidia.com/gpu: allocatable: expected 8, observed 0",
            "node gpu-t4: nvidia.com/gpu: device plugin socket "
            "/var/lib/kubelet/device-plugins/gpukit-gpu.sock: expected listening, observed absent",
        )
    finally:
        lp.provision(lab.spec, lab.fleet)


def test_a_runtime_class_gone_fails(lab: Lab, tmp_path: Path) -> None:
    """Issue 28: the runtime check reads containerd's effective config on the lab too, and a
    cluster without a RuntimeClass for the nvidia handler (containerd's default is runc
    here) fails naming the node, as does the check of the route the inventory declares; with
    it back, both pass."""
    from kubernetes import client

    (tmp_path / "gone").mkdir()
    (tmp_path / "back").mkdir()
    nodes_api = client.NodeV1Api(lp.core().api_client)
    nodes_api.delete_runtime_class(lp.RUNTIME_CLASS)
    try:
        run = run_suite(tmp_path / "gone", "--nodes", "gpu-t4", "-m", "host",
                        "-k", "runtime_configured or declared_runtime_path")
        _expect_failures(run, "node gpu-t4: a RuntimeClass with an NVIDIA runtime handler "
                              "(default runtime 'runc'): expected handler one of ['nvidia'], "
                              "observed none",
                         "node gpu-t4: RuntimeClass 'nvidia' handler (container_toolkit_"
                         "runtime_class): expected nvidia, observed no such RuntimeClass")
    finally:
        lp.runtime_class()
    run = run_suite(tmp_path / "back", "--nodes", "gpu-t4", "-m", "host", "-k",
                    "runtime_configured or declared_runtime_path")
    assert run.rc == 0 and {"test_runtime_configured_for_nvidia[gpu-t4]",
                            "test_declared_runtime_path[gpu-t4]"} <= set(run.passed), run.output


def test_the_disruptive_area_keeps_a_pod_s_devices(lab: Lab, tmp_path: Path) -> None:
    """Issue 28: the opt-in restarts area on gpu-t4 (its kubelet restarted) passes, a pod keeping
    its device across a container and a kubelet restart; without --disruptive it is not
    collected (no skip in a healthy run)."""
    run = run_suite(tmp_path, "--nodes", "gpu-t4", "--disruptive", "-m", "restarts")
    assert run.rc == 0, run.output
    assert run.passed == ["test_a_pod_keeps_its_devices_across_restarts[gpu-t4]"], run.output
    lp.wait_resources("gpu-t4", expect.expected_resources(lab.decl("gpu-t4")))


def test_single_strategy_node_passes(lab: Lab, tmp_path: Path) -> None:
    """An inventory that gives gpu-a100 migStrategy single over 2x 3g.20gb on every GPU: the
    node advertises 16 nvidia.com/gpu with the MIG product label, and the suite agrees."""
    decl = lab.decl("gpu-a100")
    inventory = tmp_path / "inventory"
    shutil.copytree(for_instance(lab.spec), inventory)
    (inventory / "host_vars").mkdir(exist_ok=True)
    (inventory / "host_vars" / "gpu-a100.yml").write_text(yaml.safe_dump({
        "gpukit_device_plugin_configs": {**decl.plugin_configs,
                                         "mig-single": lp.EXTRA_CONFIGS["mig-single"]},
        "gpukit_device_plugin_config": "mig-single",
        "gpukit_mig_config": "all-3g.20gb",
    }))
    single = inv.load(inventory).node(decl.node_name)
    assert expect.expected_resources(single) == {"nvidia.com/gpu": 16}
    lp.apply_mig(lab.spec, decl.node_name, lp.mig_plan(single))
    lp.set_labels(decl.node_name, single.selection_labels())
    try:
        lp.wait_resources(decl.node_name, {"nvidia.com/gpu": 16}, timeout=60)
        lp.declare(inv.load(inventory), decl.node_name)  # as site.yml would after the edit
        run = run_suite(tmp_path, "--inventory", str(inventory), "--nodes", decl.node_name,
                        "-m", "discovery or labels or mig")
        assert run.rc == 0, run.output
        assert "test_single_strategy_labels[gpu-a100]" in run.passed
        assert "test_mig_devices_belong_to_declared_parents[gpu-a100-gpu]" in run.passed
    finally:
        lp.set_labels(decl.node_name, decl.selection_labels())
        lp.apply_mig(lab.spec, decl.node_name, lp.mig_plan(decl))
        lp.wait_resources(decl.node_name, expect.expected_resources(decl), timeout=60)
        lp.declare(inv.load(for_instance(lab.spec)), decl.node_name)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_run_leaves_nothing_behind(
    lab: Lab, sig: signal.Signals, tmp_path: Path
) -> None:
    """Stopped while its pods hold a node's devices, the suite still deletes its namespace."""
    api = lp.core()
    selector = MANAGED
    before = {n.metadata.name for n in api.list_namespace(label_selector=selector).items}
    held = tmp_path / "held"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "gpukit/conformance", "--lab", "-q", "-p", "no:cacheprovider",
         "-p", "hold_after_first_test", "--nodes", "gpu-t4", "-m", "isolation"],
        cwd=lp.REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        # As from a terminal: a background job of a shell (make test's lanes) ignores SIGINT,
        # and a Python started with SIGINT ignored keeps ignoring it.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        env={**os.environ, "GPUKIT_TEST_HOLD_FILE": str(held),
             "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not held.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert held.exists(), "the child run never reached its first test's end"
        namespace = _running_fill_namespace(api, selector, before)
        proc.send_signal(sig)
        # The run's cleanup waits up to its pod timeout (90 s) for its pods to be gone.
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0, out
    # every pod is gone (the devices are free) and the namespace is going or gone
    assert not api.list_namespaced_pod(namespace).items, out
    gone = lp.wait_gone_namespace(namespace, timeout=60)
    assert gone, f"namespace {namespace} still there after the interrupted run:\n{out}"


def _running_fill_namespace(api: object, selector: str, before: set[str]) -> str:
    """The new run's namespace, where its fill pods are Running (the node's devices held)."""
    pods = api.list_pod_for_all_namespaces(  # type: ignore[attr-defined]
        label_selector=f"{selector},gpukit.io/role=fill").items
    running = {p.metadata.namespace for p in pods
               if p.metadata.namespace not in before and p.status.phase == "Running"}  # fmt: skip
    assert len(running) == 1, f"fill pods Running in {running or 'no namespace'}"
    return running.pop()
