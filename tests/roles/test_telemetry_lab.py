"""A real Prometheus in the lab, brought up by site.yml (role gpukit.gpu.gpu_telemetry,
`gpukit_metrics_prometheus: host`): Debian's prometheus, from the lab's apt repository, on
gpu-t4 (this test's inventory puts it in group gpukit_monitoring), scraping both nodes' agents
over the lab bridge at their declared addresses, with gpukit's alert rules.

- site.yml converges (the agent on 0.0.0.0:9402, prometheus installed, configured, running);
  Prometheus has both agents up;
- a pod working on a GPU: the PromQL query for its pod answers its utilisation with its
  pod, namespace and container;
- an XID injected into gpu-t4's driver: GpuCriticalXid fires in Prometheus (ALERTS);
- site.yml again changes nothing; --check --diff with another scrape interval reports the
  config (and the reload) changed and leaves the file as it was; a bad gpukit_metrics_port is
  refused by the preflight naming host, variable and value.
"""

from __future__ import annotations

import json
import shutil
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config
from labplay import PlayResult, run_playbook

from gpukit.k8s import waits
from gpukit.lab import cluster, nodes
from gpukit.lab.config import LabSpec, cache_dir, load_spec, state_dir
from gpukit.lab.controlplane import paths
from gpukit.lab.nvml import workload

pytestmark = pytest.mark.lab

A100, T4 = "gpu-a100", "gpu-t4"
NS = "telemetry-prom"
SETTINGS = {"gpukit_metrics_prometheus": "host", "gpukit_metrics_scrape_interval": "5s"}


@dataclass
class Lab:
    spec: LabSpec
    inventory: Path
    wheelhouse: str
    core: client.CoreV1Api
    first: PlayResult

    def play(self, *args: str, **overrides: Any) -> PlayResult:
        return run_playbook("site.yml", self.inventory, *args, extra_vars={
            "gpukit_node_wheelhouse_archive": self.wheelhouse, **SETTINGS, **overrides},
            timeout=1800)


def sh(spec: LabSpec, node: str, command: str, timeout: float = 60) -> str:
    r = cluster.node_exec(spec.node(node), ["sh", "-c", command], timeout=timeout)
    assert r.returncode == 0, f"{node}: {command}: {r.stdout}{r.stderr}"
    return r.stdout


def promql(spec: LabSpec, query: str) -> list[dict[str, Any]]:
    """An instant query to the Prometheus on gpu-t4 (its HTTP API, from the node itself)."""
    url = "http://127.0.0.1:9090/api/v1/query?query=" + urllib.parse.quote(query)
    code = (f"import urllib.request,sys; sys.stdout.write(urllib.request.urlopen({json.dumps(url)}, "
            "timeout=10).read().decode())")  # the quoted query has no quote of its own
    answer = json.loads(sh(spec, T4, f"python3 -c '{code}'"))
    assert answer["status"] == "success", answer
    result: list[dict[str, Any]] = answer["data"]["result"]
    return result


def wait_for(what: str, check: Callable[[], Any], timeout: float = 120) -> Any:
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        try:
            got = check()
        except (AssertionError, OSError) as e:  # not up yet
            got, last = None, e
        if got:
            return got
        time.sleep(2)
    raise AssertionError(f"timed out waiting for {what} (last error: {last})")


def monitoring_inventory(base: Path, out: Path) -> Path:
    """The instance's inventory, with gpu-t4 in group gpukit_monitoring too."""
    shutil.copytree(base, out, dirs_exist_ok=True)
    hosts = yaml.safe_load((out / "hosts.yml").read_text())
    hosts["all"]["children"]["gpukit_monitoring"] = {"hosts": {T4: None}}
    (out / "hosts.yml").write_text(yaml.safe_dump(hosts, sort_keys=False))
    return out


@pytest.fixture(scope="module")
def lab(lab_cluster: object, tmp_path_factory: pytest.TempPathFactory) -> Lab:
    from gpukit.lab.inventory import for_instance
    from gpukit.lab.packages import build_repo
    from gpukit.provision import wheelhouse

    spec = load_spec()
    build_repo()  # with Debian's prometheus (gpukit.lab.packages.prometheus)
    inventory = monitoring_inventory(for_instance(spec), tmp_path_factory.mktemp("inv"))
    wh = wheelhouse.build(cache_dir(), "3.11")
    config.load_kube_config(str(paths().admin_kubeconfig))
    archive = workload.build_image(state_dir() / "shared" / "images")
    for node in (A100, T4):
        sh(spec, node, f"ctr -n k8s.io images import /opt/gpukit-lab/images/{archive.name}",
           timeout=120)
    lab = Lab(spec, inventory, wh.archive, client.CoreV1Api(), PlayResult(0, 0, {}))
    lab.first = lab.play()
    assert lab.first.rc == 0, lab.first.describe()
    return lab


@pytest.fixture
def namespace(lab: Lab) -> Iterator[str]:
    lab.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NS)))
    yield NS
    lab.core.delete_namespace(NS)
    wait_for(f"namespace {NS} gone", lambda: NS not in {
        n.metadata.name for n in lab.core.list_namespace().items}, timeout=120)


def test_site_brings_prometheus_up_scraping_both_agents(lab: Lab) -> None:
    # (On a lab that ran this module before, prometheus is there already: nothing to change.)
    assert sh(lab.spec, T4, "systemctl is-active prometheus").strip() == "active"
    written = sh(lab.spec, T4, "cat /etc/prometheus/prometheus.yml")
    assert written.startswith("# Written by gpukit.gpu.gpu_telemetry"), written

    def both_up() -> dict[str, str]:
        got = {r["metric"]["node"]: r["value"][1]
               for r in promql(lab.spec, 'up{job="gpukit-node-agent"}')}
        return got if got == {A100: "1", T4: "1"} else {}

    wait_for("both agents up in Prometheus", both_up, timeout=120)
    instances = {r["metric"]["instance"]
                 for r in promql(lab.spec, 'up{job="gpukit-node-agent"}')}
    assert instances == {f"{lab.spec.node(n).address(lab.spec)}:9402" for n in (A100, T4)}


def test_promql_answers_a_working_pod_s_utilisation_with_its_labels(
        lab: Lab, namespace: str) -> None:
    name = f"work-{uuid.uuid4().hex[:6]}"
    volume = workload.pod_volume("/var/lib/gpukit-lab/nvml")
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(
            node_selector={"kubernetes.io/hostname": A100}, restart_policy="Never",
            termination_grace_period_seconds=2,
            volumes=[client.V1Volume(name=volume["name"], host_path=client.V1HostPathVolumeSource(
                path=volume["hostPath"]["path"], type="DirectoryOrCreate"))],
            containers=[client.V1Container(
                name="trainer", image=workload.IMAGE, image_pull_policy="Never",
                args=workload.args(2000, 70),
                volume_mounts=[client.V1VolumeMount(name=volume["name"],
                                                    mount_path=workload.CLIENTS_IN_POD)],
                resources=client.V1ResourceRequirements(limits={"nvidia.com/gpu": "1"}))]))
    lab.core.create_namespaced_pod(namespace, pod)
    waits.pod_phase(lab.core, namespace, name, {"Running"}, 120)
    query = f'DCGM_FI_DEV_GPU_UTIL{{pod="{name}"}}'

    def answered() -> list[dict[str, Any]]:
        got = promql(lab.spec, query)
        return got if got and float(got[0]["value"][1]) == 70 else []

    (series,) = wait_for(f"{query} at 70 %", answered, timeout=120)
    m = series["metric"]
    assert (m["pod"], m["namespace"], m["container"], m["node"], m["Hostname"]) == (
        name, namespace, "trainer", A100, A100), m
    used = promql(lab.spec, f'DCGM_FI_DEV_FB_USED{{pod="{name}",namespace="{namespace}"}}')
    assert used and float(used[0]["value"][1]) >= 2000, used


def test_an_injected_xid_fires_gpu_critical_xid_in_prometheus(lab: Lab) -> None:
    node = lab.spec.node(T4)
    # Twice, a few scrapes apart: the counter then moves whatever Prometheus kept of an earlier
    # run's agent (a series back at the same value after a gap is no increase to it).
    nodes.nvml_cli(node, "inject-xid", "--gpu", "1", "--xid", "79")
    time.sleep(12)
    nodes.nvml_cli(node, "inject-xid", "--gpu", "1", "--xid", "79")
    try:
        query = 'ALERTS{alertname="GpuCriticalXid",alertstate="firing",node="gpu-t4",xid="79"}'
        (alert,) = wait_for("GpuCriticalXid firing for gpu-t4", lambda: promql(lab.spec, query),
                            timeout=120)
        assert alert["metric"]["severity"] == "critical", alert
        quiet = promql(lab.spec, 'ALERTS{alertname="GpuCriticalXid",node="gpu-a100"}')
        assert quiet == [], quiet
    finally:
        nodes.nvml_cli(node, "reset", "--gpu", "1")


def test_a_second_run_changes_nothing(lab: Lab) -> None:
    again = lab.play()
    assert again.rc == 0, again.describe()
    assert {h: t for h, t in again.changed.items() if t} == {}, again.describe()


def test_check_mode_reports_drift_and_bad_input_is_refused(lab: Lab) -> None:
    config = "grep scrape_interval /etc/prometheus/prometheus.yml"
    before = sh(lab.spec, T4, config)
    drift = lab.play("--check", "--diff", "--tags", "gpu_telemetry",
                     gpukit_metrics_scrape_interval="10s")
    assert drift.rc == 0, drift.describe()
    assert {h: t for h, t in drift.changed.items() if t} == {T4: [
        "Write the configuration scraping every GPU node's agent", "Reload prometheus"]}, \
        drift.describe()
    assert sh(lab.spec, T4, config) == before == "  scrape_interval: 5s\n"
    bad = lab.play("--tags", "gpu_telemetry", gpukit_metrics_port="x")
    assert bad.rc != 0
    message = " ".join(" ".join(t) for t in bad.failed.values())
    assert "host gpu-t4: gpukit_metrics_port: 'x' is not a TCP port (1-65535)" in message, \
        bad.describe()
