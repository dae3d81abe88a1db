"""The suite's parts without a cluster: collection from an inventory, the NVML probe against the
mock library, pod states, manifests, observations, messages, the HTML report, the Job."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any

import labprovision as lp
import pytest
import yaml

from gpukit import inventory as inv
from gpukit.conformance import cluster, host, report
from gpukit.conformance.checks import Check, Row, fmt
from gpukit.conformance.cluster import PodState
from gpukit.conformance.fill import VOLUME_MOUNTS_ROOT, Seen, _requests
from gpukit.conformance.suite import PodResourcesView
from gpukit.k8s.names import dns_name

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "gpukit" / "conformance" / "deploy"


def _pytest(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=120)


# ---- collection


def test_collects_per_node_and_resource_from_the_inventory_alone() -> None:
    r = _pytest("gpukit/conformance", "--inventory", "inventories/lab", "--collect-only", "-q")
    assert r.returncode == 0, r.stdout + r.stderr
    ids = [ln for ln in r.stdout.splitlines() if "::" in ln]
    assert "gpukit/conformance/test_isolation.py::test_devices_are_disjoint[gpu-a100-mig-1g.5gb]" in ids
    assert "gpukit/conformance/test_timeslicing.py::test_request_above_one[gpu-t4-gpu]" in ids
    assert not any("test_request_above_one[gpu-a100" in i for i in ids)  # nothing shared there
    assert not any("test_mig_devices_belong_to_declared_parents[gpu-t4" in i for i in ids)
    # areas in order; within an area, tests that need free devices last
    areas = [i.split("::")[0] for i in ids]
    assert areas.index("gpukit/conformance/test_discovery.py") < areas.index(
        "gpukit/conformance/test_workload.py")
    ts = [i for i in ids if "test_timeslicing" in i]
    assert "test_request_above_one" in ts[-1]


def test_markers_select_areas_and_nodes() -> None:
    r = _pytest("gpukit/conformance", "--inventory", "inventories/lab", "--nodes", "gpu-t4",
                "-m", "timeslicing", "--collect-only", "-q")
    ids = [ln for ln in r.stdout.splitlines() if "::" in ln]
    assert ids and all("test_timeslicing" in i and "gpu-t4" in i for i in ids), r.stdout


def test_host_vars_override_the_inventory_files(tmp_path: Path) -> None:
    """What a play applied (-e included) is what the node is held to."""
    args = ("gpukit/conformance", "--inventory", "inventories/lab", "--nodes", "gpu-t4",
            "-k", "test_request_above_one", "--collect-only", "-q")  # fmt: skip
    shared = _pytest(*args)
    assert "test_request_above_one[gpu-t4-gpu]" in shared.stdout, shared.stdout + shared.stderr
    # The default config shares nothing: the time-slicing test is not collected for gpu-t4.
    (tmp_path / "vars.json").write_text(
        json.dumps({"gpu-t4": {"gpukit_device_plugin_config": "default"}}))
    whole = _pytest(*args, "--host-vars", f"@{tmp_path / 'vars.json'}")
    assert whole.returncode == 0 and "[gpu-t4-" not in whole.stdout, whole.stdout + whole.stderr
    for bad, needle in (("{not json", "--host-vars: '{not json' is not JSON or @file"),
                        ('["gpu-t4"]', "is not a JSON object of hosts"),
                        ('{"gpu-x": {}}', "host_vars: 'gpu-x' is not a GPU node")):  # fmt: skip
        r = _pytest(*args, "--host-vars", bad)
        assert r.returncode == 4 and needle in r.stderr, r.stdout + r.stderr


def test_host_vars_pin_a_driver_version_or_refuse_it_naming_it() -> None:
    """Issue #14: the pinned version is a declaration variable; a malformed one is a usage
    error naming host, variable and value."""
    args = ("gpukit/conformance", "--inventory", "inventories/lab", "--nodes", "gpu-t4",
            "-k", "test_driver_version", "--collect-only", "-q")  # fmt: skip
    ok = _pytest(*args, "--host-vars", '{"gpu-t4": {"nvidia_driver_version": "550.127.05"}}')
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "gpukit/conformance/test_host.py::test_driver_version[gpu-t4]" in ok.stdout, ok.stdout
    bad = _pytest(*args, "--host-vars", '{"gpu-t4": {"nvidia_driver_version": "550.127.x"}}')
    assert bad.returncode == 4, bad.stdout + bad.stderr
    assert ("host gpu-t4: nvidia_driver_version: '550.127.x' is not a driver version"
            in bad.stderr), bad.stderr


def test_a_bad_inventory_is_a_usage_error_naming_host_and_variable(tmp_path: Path) -> None:
    bad = tmp_path / "inv"
    (bad / "group_vars").mkdir(parents=True)
    (bad / "hosts.yml").write_text(yaml.safe_dump(
        {"all": {"children": {"gpu_nodes": {"hosts": {"n1": {}}}}}}))
    (bad / "group_vars" / "gpu_nodes.yml").write_text(yaml.safe_dump(
        {"gpukit_gpu": {"product": "Tesla T4", "count": 2}, "gpukit_mig_config": "nope"}))
    r = _pytest("gpukit/conformance", "--inventory", str(bad), "--collect-only", "-q")
    assert r.returncode == 4, r.stdout + r.stderr
    assert "host n1: gpukit_mig_config: 'nope' is not a named MIG layout" in r.stderr


@pytest.mark.parametrize("kubeconfig", ["missing", "malformed", "refused"])
def test_an_unusable_cluster_is_one_usage_error_before_any_test(tmp_path: Path,
                                                                 kubeconfig: str) -> None:
    path = tmp_path / "kubeconfig"
    if kubeconfig == "malformed":
        path.write_text("apiVersion: [\n")
    elif kubeconfig == "refused":  # nothing listens on port 1
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1",
                                                   "insecure-skip-tls-verify": True}}],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    r = _pytest("gpukit/conformance", "--inventory", "inventories/lab", "--kubeconfig", str(path),
                "-q", "--report-html", str(tmp_path / "r.html"))
    out = r.stdout + r.stderr
    assert r.returncode == 4, out
    if kubeconfig == "missing":
        assert f"conformance: cannot reach the cluster: --kubeconfig {path} does not exist" in out
    else:
        assert f"conformance: cannot reach the cluster through --kubeconfig {path}" in out
    assert "passed" not in out and "failed" not in out and "Traceback" not in out, out
    assert "NotSet" not in (tmp_path / "r.html").read_text()


def test_no_inventory_and_no_cluster_is_one_line(tmp_path: Path) -> None:
    """Without --inventory the suite lists the cluster's GPU nodes while collecting: with no
    cluster that was a collection error per module, 706 lines (issue 29); now one line."""
    env = {**os.environ, "KUBECONFIG": str(tmp_path / "none"), "HOME": str(tmp_path)}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                        "gpukit/conformance"], cwd=REPO, capture_output=True, text=True,
                       timeout=120, env=env)
    out = r.stdout + r.stderr
    assert r.returncode == 4, out
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert len(lines) <= 2, out  # the reason, and pytest's "no tests ran"
    assert "conformance: cannot list the cluster's GPU nodes: cannot reach the cluster through " \
           "$KUBECONFIG, ~/.kube/config or in-cluster (no --inventory, no --kubeconfig)" in out


def test_the_inventorys_missing_kubeconfig_is_named(tmp_path: Path) -> None:
    inv = tmp_path / "inv"
    shutil.copytree(REPO / "inventories" / "lab", inv)
    all_vars = inv / "group_vars" / "all.yml"
    all_vars.write_text(yaml.safe_dump({**yaml.safe_load(all_vars.read_text()),
                                        "gpukit_kubeconfig": str(tmp_path / "gone")}))
    r = _pytest("gpukit/conformance", "--inventory", str(inv), "-q")
    out = r.stdout + r.stderr
    assert r.returncode == 4, out
    assert (f"cannot reach the cluster: the inventory's gpukit_kubeconfig ({tmp_path / 'gone'}, "
            f"{inv}) does not exist") in out, out


def test_the_plugin_is_inert_elsewhere(tmp_path: Path) -> None:
    (tmp_path / "test_x.py").write_text("def test_x():\n    assert True\n")
    r = _pytest(str(tmp_path / "test_x.py"), "-q", "--rootdir", str(tmp_path))
    assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout + r.stderr


# ---- NVML on the node (the probe the suite sends over SSH), against the mock library


@pytest.mark.nvml
def test_nvml_probe_reads_gpus_and_mig_devices_of_the_mock(tmp_path: Path) -> None:
    from gpukit.lab import nvml as mock

    mock.build()
    env = mock.env("a100-sxm4-40gb-x8", tmp_path / "state")
    decl = inv.load(REPO / "inventories" / "lab").node("gpu-a100")
    plan = lp.mig_plan(decl)
    r = subprocess.run([sys.executable, "-c", lp._MIG_SCRIPT, json.dumps(plan)], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out = subprocess.run([sys.executable, str(host.PROBE_SOURCE)], env=env, capture_output=True,
                         text=True, timeout=60)
    seen = host.parse_probe(json.loads(out.stdout))
    assert seen.ok and seen.mock and seen.driver_version.startswith("550.")
    assert [g.name for g in seen.gpus] == [decl.gpu.product] * 8
    assert [g.mig_current for g in seen.gpus] == [True, True] + [False] * 6
    assert sorted(m.profile for m in seen.gpus[0].migs) == list(decl.mig_gpus[0].profiles)
    mig = seen.gpus[1].migs[0]
    assert seen.parent(mig.uuid) == seen.gpus[1] and seen.mig(mig.uuid) == mig
    assert seen.index_to_uuid("1:0") == mig.uuid and seen.index_to_uuid("2") == seen.gpus[2].uuid
    # Injected through CDI (NVIDIA_VISIBLE_DEVICES=void), a container's devices are those whose
    # nodes it got: a whole GPU by its node, a MIG device by its parent's and its caps nodes.
    from gpukit.conformance.common import visible_uuids

    cdi = Seen("p", "nvidia.com/gpu", 1, PodState("p", "Running"), env="void",
               dev_entries=("nvidia2", "nvidiactl"))
    assert visible_uuids(cdi, seen) == [seen.gpus[2].uuid]
    from dataclasses import replace  # the caps minors come from the driver's /proc: none here

    migs = tuple(replace(m, caps=(10 + 2 * i, 11 + 2 * i)) for i, m in enumerate(seen.gpus[1].migs))
    seen = replace(seen, gpus=(seen.gpus[0], replace(seen.gpus[1], migs=migs), *seen.gpus[2:]))
    cdi = Seen("p", "nvidia.com/mig-1g.5gb", 1, PodState("p", "Running"), env="void",
               dev_entries=("nvidia1", "nvidiactl"), cap_entries=("nvidia-cap12", "nvidia-cap13"))
    assert len(migs) > 1 and visible_uuids(cdi, seen) == [migs[1].uuid]


@pytest.mark.nvml
def test_nvml_probe_reports_a_lost_gpu_by_its_index_and_reads_the_ones_after_it(
        tmp_path: Path) -> None:
    """GPU 3 of 8 lost: the probe names GPU 3 lost and GPUs 4-7 present with their own UUIDs
    (it used to stop at the lost GPU, so every later GPU read as absent)."""
    from gpukit.lab import nvml as mock

    mock.build()
    env = mock.env("a100-sxm4-40gb-x8", tmp_path / "state")
    ctl = [sys.executable, "-m", "gpukit.lab.nvml", "--profile", "a100-sxm4-40gb-x8",
           "--state-dir", str(tmp_path / "state")]  # fmt: skip
    r = subprocess.run([*ctl, "lose", "--gpu", "3"], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    status = json.loads(subprocess.run([*ctl, "status"], env=env, capture_output=True,
                                       text=True, timeout=60, check=True).stdout)
    uuids = [g["uuid"] for g in status["gpus"]]
    assert [g["lost"] for g in status["gpus"]] == [False] * 3 + [True] + [False] * 4
    out = subprocess.run([sys.executable, str(host.PROBE_SOURCE)], env=env, capture_output=True,
                         text=True, timeout=60)
    seen = host.parse_probe(json.loads(out.stdout))
    assert seen.ok, seen.error  # NVML answers; the lost GPU is that GPU's entry
    assert [g.index for g in seen.gpus] == list(range(8))
    lost = seen.gpus[3]
    assert lost.lost and "GPU is lost" in lost.error and lost.state.startswith("lost (")
    assert [g.uuid for g in seen.readable] == uuids[:3] + uuids[4:]
    assert [g.index for g in seen.readable] == [0, 1, 2, 4, 5, 6, 7]
    assert all(g.state == "present" for g in seen.readable)
    assert seen.index_to_uuid("4") == uuids[4] and seen.index_to_uuid("3") == "3"
    assert seen.parent(uuids[7]) == seen.gpus[7] and seen.parent(uuids[3]) is None
    # Through the suite's own check: one failure, GPU 3, none for the GPUs after it.
    from gpukit.conformance import test_host as host_checks

    decl = inv.load(REPO / "inventories" / "lab").node("gpu-a100")
    suite = NS(decl=lambda _n: decl, options=NS(host_access=True), probe=lambda _n: seen,
               probe_error=lambda _n: "")
    c = Check("gpu-a100", "host")
    with pytest.raises(pytest.fail.Exception) as exc:
        host_checks.test_nvml_answers_with_the_declared_gpus(suite, "gpu-a100", c)
    assert str(exc.value).splitlines() == [
        f"node gpu-a100: GPU 3: expected present, observed lost ({lost.error})"]


def test_a_probe_that_cannot_load_nvml_says_so() -> None:
    from gpukit.conformance import nvml_probe

    got = nvml_probe.probe("/nonexistent/libnvidia-ml.so.1")
    assert not got["ok"] and "cannot load" in got["error"]


# ---- pods


def _pod(phase: str, conditions: list[Any] | None = None, statuses: list[Any] | None = None,
         reason: str | None = None, message: str | None = None) -> Any:
    return NS(metadata=NS(name="p"), status=NS(phase=phase, conditions=conditions,
                                               container_statuses=statuses, reason=reason,
                                               message=message))


def _running() -> Any:
    return NS(name="main", state=NS(running=NS(), waiting=None, terminated=None))


def test_pod_states() -> None:
    assert cluster.classify(_pod("Running", statuses=[_running()])).state == "Running"
    unsched = NS(type="PodScheduled", status="False", reason="Unschedulable",
                 message="0/2 nodes are available: 1 Insufficient nvidia.com/gpu.")
    s = cluster.classify(_pod("Pending", conditions=[unsched]))
    assert (s.state, "Insufficient nvidia.com/gpu" in s.message) == ("Unschedulable", True)
    s = cluster.classify(_pod("Failed", reason="UnexpectedAdmissionError", message="Allocate failed"))
    assert (s.state, s.reason) == ("Failed", "UnexpectedAdmissionError")
    waiting = NS(name="main", state=NS(running=None, terminated=None,
                                       waiting=NS(reason="ErrImagePull", message="no registry")))
    assert str(cluster.classify(_pod("Pending", statuses=[waiting]))) == (
        "Error (ErrImagePull: no registry)")
    assert cluster.classify(_pod("Pending")).state == "Pending"


def test_pod_manifest_is_minimal_and_pinned_through_the_scheduler() -> None:
    m = cluster.pod_manifest("p", run_id="r", role="fill", node="gpu-t4", image="busybox",
                          command=["sh"], limits={"nvidia.com/gpu": 1})
    spec = m["spec"]
    assert "nodeName" not in spec and "hostNetwork" not in spec
    term = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["gpu-t4"]
    assert (spec["serviceAccountName"], spec["automountServiceAccountToken"]) == (
        cluster.WORKLOAD_SA, False)
    c = spec["containers"][0]
    assert c["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert m["metadata"]["labels"][cluster.RUN_LABEL] == "r"
    lab = cluster.pod_manifest("p", run_id="r", role="x", node="n", image="i", command=[],
                            host_network=True, host_paths=[("v", "/var/lib/x", "Directory")])
    assert lab["spec"]["hostNetwork"] is True
    assert lab["spec"]["containers"][0]["volumeMounts"][0]["readOnly"] is True


def test_dns_names() -> None:
    assert dns_name("fill", "GPU_A100", "mig-1g.5gb") == "fill-gpu-a100-mig-1g-5gb"
    long = dns_name("x" * 80)
    assert len(long) == 63 and re.fullmatch(r"[a-z0-9-]+", long)


# ---- observations


def test_what_a_container_saw() -> None:
    s = Seen("p", "nvidia.com/gpu", 1, PodState("p", "Running"))
    s.parse("DEV nvidia2\nDEV nvidiactl\nDEV nvidia-uvm\nENV GPU-a,GPU-b\n")
    assert s.gpu_nodes == {"/dev/nvidia2"} and s.visible == ["GPU-a", "GPU-b"]
    s.parse(f"ENV {VOLUME_MOUNTS_ROOT}\nVOL GPU-c\n")
    assert s.visible == ["GPU-c"] and s.gpu_nodes == set()
    s.parse("ENV <unset>\n")
    assert s.env is None and s.visible == []
    s.parse("ENV void\n")
    assert s.visible == []


def test_fill_requests() -> None:
    assert _requests(3, 32, one_each=False) == [1, 1, 1]
    assert _requests(70, 32, one_each=False) == [3] * 23 + [1]
    assert sum(_requests(70, 32, one_each=False)) == 70
    assert _requests(70, 32, one_each=True) == [1] * 70
    assert _requests(0, 32, one_each=False) == []


def test_podresources_answer() -> None:
    view = PodResourcesView.parse({
        "pods": [{"namespace": "ns", "name": "p", "containers": [
            {"name": "main", "devices": [{"resource": "nvidia.com/gpu", "ids": ["GPU-a::0"]}]}]}],
        "allocatable": [{"resource": "nvidia.com/gpu", "ids": ["GPU-a::0", "GPU-a::1"]}]})
    assert view.devices("ns", "p") == {"nvidia.com/gpu": ["GPU-a::0"]}
    assert view.devices("ns", "q") == {}
    assert view.allocatable["nvidia.com/gpu"] == ["GPU-a::0", "GPU-a::1"]


# ---- messages and reports


def test_failure_messages_name_node_resource_expected_observed() -> None:
    c = Check("gpu-t4", "discovery")
    c.equal("allocatable", 8, 4, "nvidia.com/gpu")
    c.equal("label x", "a", "a")
    with pytest.raises(pytest.fail.Exception) as exc:
        c.verify()
    assert str(exc.value) == "node gpu-t4: nvidia.com/gpu: allocatable: expected 8, observed 4"
    assert fmt({"b": 1, "a": [1, None]}) == "{a=[1, none], b=1}"
    row = c.rows[0]
    assert Row.from_json(row.to_json()) == row


def test_html_report_grid() -> None:
    rows = [Row("gpu-t4", "discovery", "nvidia.com/gpu", "allocatable", "8", "<4>", False)]
    results = [
        report.Result("a", "test_capacity", "discovery", "gpu-t4", "nvidia.com/gpu", "failed",
                      rows=rows, message="node gpu-t4: ..."),
        report.Result("b", "test_labels", "labels", "gpu-t4", "", "passed"),
        report.Result("c", "test_mig", "mig", "gpu-t4", "", "skipped", message="no layout"),
        report.Result("d", "test_fill", "isolation", "gpu-a100", "nvidia.com/gpu", "passed",
                      cncf="secure_accelerator_access"),
    ]
    page = report.render(results, {"inventory": "inventories/lab"})
    assert "<th>gpu-a100</th>" not in page  # node headers are links
    assert "href='#node-gpu-t4'" in page and "href='#node-gpu-a100'" in page
    assert "class='fail'" in page and "class='pass'" in page and "class='skip'" in page
    assert "&lt;4&gt;" in page and "<4>" not in page
    assert "secure_accelerator_access" in page


# ---- the in-cluster Job


def test_job_manifests() -> None:
    docs = list(yaml.safe_load_all((DEPLOY / "job.yaml").read_text()))
    kinds = [d["kind"] for d in docs]
    assert kinds == ["Namespace", "ServiceAccount", "ServiceAccount", "ClusterRole",
                     "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ClusterRole",
                     "ClusterRoleBinding", "Role", "RoleBinding", "Job"]
    # Cluster-wide: reads only (no node proxy: the metrics area scrapes from a pod).
    cluster_role = docs[3]
    assert cluster_role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["resourcequotas", "limitranges"],
         "verbs": ["get", "list"]},
        {"apiGroups": ["scheduling.k8s.io"], "resources": ["priorityclasses"],
         "verbs": ["get", "list"]},
        {"apiGroups": ["node.k8s.io"], "resources": ["runtimeclasses"], "verbs": ["get", "list"]},
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices", "deviceclasses"],
         "verbs": ["get", "list", "watch"]}]
    # The metrics area's scraper pods: get nodes/metrics and nothing else, as the suite
    # itself binds it when it runs from outside (conformance.scraper).
    from gpukit.conformance import scraper

    assert docs[4]["metadata"]["name"] == scraper.SCRAPER_SA
    assert docs[5]["metadata"]["name"] == scraper.SCRAPER_ROLE
    assert docs[5]["rules"] == [scraper.SCRAPER_RULE]
    assert docs[6]["roleRef"]["name"] == scraper.SCRAPER_ROLE
    assert docs[6]["subjects"] == [{"kind": "ServiceAccount", "name": scraper.SCRAPER_SA,
                                    "namespace": "gpukit-conformance"}]
    # Pods in the quota namespaces only where the user binds this role (not bound here).
    tenancy = docs[7]
    assert tenancy["metadata"]["name"] == "gpukit-conformance-tenancy"
    assert tenancy["rules"] == [{"apiGroups": [""], "resources": ["pods"],
                                 "verbs": ["create", "delete", "get", "list", "watch"]}]
    bound = {d["roleRef"]["name"] for d in docs if d["kind"].endswith("Binding")}
    assert "gpukit-conformance-tenancy" not in bound
    role = docs[9]
    assert all(r["verbs"] != ["*"] for r in role["rules"])
    assert {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"],
            "verbs": ["create", "delete", "get", "list", "watch"]} in role["rules"]
    job = docs[-1]["spec"]["template"]["spec"]
    assert job["serviceAccountName"] == "gpukit-conformance"
    env = {e["name"]: e["value"] for e in job["containers"][0]["env"]}
    assert env["RESULTS_DIR"] == "/tmp/results"
    plugin = yaml.safe_load((DEPLOY / "sonobuoy-plugin.yaml").read_text())
    assert plugin["sonobuoy-config"]["result-format"] == "junit"


def test_the_job_entry_point_uses_options_the_plugin_has() -> None:
    script = (DEPLOY / "run.sh").read_text()
    flags = set(re.findall(r"(--[a-z][a-z-]+)", script)) - {"--pyargs", "--junitxml"}
    r = _pytest("--help")
    for flag in sorted(flags):
        assert flag in r.stdout, f"run.sh uses {flag}, which pytest does not know"
    assert subprocess.run(["sh", "-n", str(DEPLOY / "run.sh")]).returncode == 0


FAKE_PYTEST = """#!/bin/sh
# Stands in for python3 -m pytest: records the inventory it was given, exits as told.
while [ $# -gt 0 ]; do [ "$1" = --inventory ] && inv=$2; shift; done
(cd "$inv" && find . -type f | sort) > "$RESULTS_DIR/seen"
echo "1 failed, 3 passed"
exit ${FAKE_STATUS:-0}
"""


@pytest.mark.parametrize("form", ["tree", "tarball", "flat"])
@pytest.mark.parametrize("status", [0, 1])
def test_the_job_rebuilds_the_whole_inventory_and_exits_as_the_suite(
        tmp_path: Path, form: str, status: int) -> None:
    fleet = REPO / "inventories" / "example"
    src = tmp_path / "mounted"
    src.mkdir()
    if form == "tree":
        shutil.copytree(fleet, src, dirs_exist_ok=True)
    elif form == "tarball":
        subprocess.run(["tar", "-C", str(fleet), "-czf", str(src / "inventory.tar.gz"), "."],
                       check=True)
    else:
        shutil.copy(fleet / "hosts.yml", src / "hosts.yml")
        (src / "gpu_nodes.yml").write_text("gpukit_gpu: {}\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(FAKE_PYTEST)
    (bin_dir / "python3").chmod(0o755)
    results = tmp_path / "results"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "RESULTS_DIR": str(results),
           "INVENTORY_DIR": str(src), "FAKE_STATUS": str(status)}
    r = subprocess.run(["sh", str(DEPLOY / "run.sh")], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == status, r.stdout + r.stderr
    assert (results / "done").read_text().strip() == str(results / "junit.xml")
    assert "1 failed, 3 passed" in (results / "pytest.log").read_text()
    seen = (results / "seen").read_text().split()
    if form == "flat":
        assert seen == ["./group_vars/gpu_nodes.yml", "./hosts.yml"]
    else:  # nothing of the tree is lost: host_vars and nested group_vars included
        want = sorted(f"./{p.relative_to(fleet)}" for p in fleet.rglob("*") if p.is_file())
        assert seen == want
        assert any(s.startswith("./host_vars/") for s in seen)
        assert any(s.count("/") >= 3 for s in seen)  # group_vars/<group>/<file>


def test_the_job_refuses_a_mount_without_an_inventory(tmp_path: Path) -> None:
    r = subprocess.run(["sh", str(DEPLOY / "run.sh")], capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin", "RESULTS_DIR": str(tmp_path / "r"),
                            "INVENTORY_DIR": str(tmp_path)}, timeout=60)
    assert r.returncode == 2
    assert "no inventory in" in r.stderr


def test_every_pod_gets_the_runtime_class_asked_for() -> None:
    """--runtime-class: the suite's pods (the GPU-less one too) run under that RuntimeClass,
    where NVIDIA's runtime is not the nodes' default."""
    from kubernetes import client as k8s_client

    made: list[dict[str, Any]] = []
    for runtime_class in ("nvidia", None):
        kube = cluster.Kube(k8s_client.ApiClient(), runtime_class=runtime_class)
        kube.core = NS(  # type: ignore[assignment]
            create_namespaced_pod=lambda ns, body: made.append(body))
        kube.create_pod("ns", cluster.pod_manifest(
            "p", run_id="r", role="nogpu", node="n", image="i", command=[]))
    assert made[0]["spec"]["runtimeClassName"] == "nvidia"
    assert "runtimeClassName" not in made[1]["spec"]


def test_a_node_s_pods_run_as_the_inventory_says_gpu_pods_run_there() -> None:
    """Without --runtime-class, a pod takes its node's declared RuntimeClass (none where the
    NVIDIA runtime is the default); --runtime-class still wins."""
    from kubernetes import client as k8s_client

    classes = {dns_name("gpu-t4"): "nvidia", dns_name("gpu-a100"): None}
    made: list[tuple[str | None, str, dict[str, Any]]] = []
    for override in (None, "other"):
        kube = cluster.Kube(k8s_client.ApiClient(), runtime_class=override,
                            node_runtime_classes=classes)
        kube.core = NS(  # type: ignore[assignment]
            create_namespaced_pod=lambda ns, body, o=override: made.append((o, "", body)))
        for node in ("gpu-t4", "gpu-a100", "elsewhere"):
            kube.create_pod("ns", cluster.pod_manifest(
                f"p-{node}", run_id="r", role="nogpu", node=node, image="i", command=[]))
    got = [(o, b["metadata"]["name"], b["spec"].get("runtimeClassName")) for o, _, b in made]
    assert got == [
        (None, "p-gpu-t4", "nvidia"), (None, "p-gpu-a100", None), (None, "p-elsewhere", None),
        ("other", "p-gpu-t4", "other"), ("other", "p-gpu-a100", "other"),
        ("other", "p-elsewhere", "other")]


def test_the_lab_declares_the_runtime_path_of_a_fleet() -> None:
    """inventories/lab: the nvidia runtime the default on gpu-a100, RuntimeClass nvidia for
    gpu-t4's pods; CDI (cdi-cri) on one node, volume mounts on the other."""
    from gpukit.conformance import runtime_path

    lab = REPO / "inventories" / "lab"
    fleet = inv.load(lab)
    paths = runtime_path.declared(str(lab), {n.host: n.node_name for n in fleet.nodes})
    assert {n: (p.runtime_name, p.default, p.pod_class) for n, p in paths.items()} == {
        "gpu-a100": ("nvidia", True, None), "gpu-t4": ("nvidia", False, "nvidia")}
    strategies = {n.node_name: n.plugin_config.flags.plugin.device_list_strategy
                  for n in fleet.nodes}
    assert strategies == {"gpu-a100": ("volume-mounts",), "gpu-t4": ("cdi-cri",)}
    # --host-vars win, as a play's -e
    paths = runtime_path.declared(str(lab), {"gpu-t4": "gpu-t4"},
                                  {"gpu-t4": {"container_toolkit_set_as_default": "true"}})
    assert paths["gpu-t4"].pod_class is None


def test_the_suite_reads_the_role_s_runtime_defaults() -> None:
    from gpukit.conformance import runtime_path

    role = yaml.safe_load((REPO / "roles" / "container_toolkit" / "defaults" / "main.yml")
                          .read_text())
    assert {k: role[k] for k in runtime_path.DEFAULTS} == dict(runtime_path.DEFAULTS)
    assert runtime_path.from_vars({}) == runtime_path.RuntimePath()


def test_the_workload_takes_the_mock_nvml_from_the_nodes_agent() -> None:
    """The lab's workload pod mounts what gpukit's agent on the node mounts (no gpukit.lab
    import: the installed suite has none); the restated names agree with the agent's."""
    from gpukit import agent_manifests
    from gpukit.conformance import exclusive

    assert f"app.kubernetes.io/name={agent_manifests.APP}" == exclusive._AGENT_SELECTOR
    assert exclusive._DRIVER_ROOT_IN_AGENT == agent_manifests.DRIVER_ROOT_IN_CONTAINER + "/"
    volumes = [NS(name="nvml-profile", host_path=NS(path="/etc/gpukit-lab/nvml")),
               NS(name="nvml-state", host_path=NS(path="/var/lib/gpukit-lab/nvml")),
               NS(name="configs", host_path=None)]
    env = [NS(name="GPUKIT_NVML_LIB",
              value="/driver-root/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1")]
    pod = NS(metadata=NS(name="agent-x"), spec=NS(volumes=volumes, containers=[NS(env=env)]))
    asked: list[tuple[str, str]] = []

    def pods_on(node: str, selector: str) -> list[object]:
        asked.append((node, selector))
        return [pod] if node == "n1" else []

    suite = NS(kube=NS(pods_on=pods_on))
    assert exclusive.lab_mounts(suite, "n1") == [  # type: ignore[arg-type]
        ("nvml-lib", "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", "File"),
        ("nvml-profile", "/etc/gpukit-lab/nvml", "Directory"),
        ("nvml-state", "/var/lib/gpukit-lab/nvml", "Directory")]
    assert asked == [("n1", "app.kubernetes.io/name=gpukit-node-agent")]
    with pytest.raises(LookupError, match="node n2: no gpukit agent pod"):
        exclusive.lab_mounts(suite, "n2")  # type: ignore[arg-type]
