"""A real Prometheus in the lab, brought up by site.yml (role gpukit.gpu.gpu_telemetry,
`gpukit_metrics_prometheus: host`): Debian's prometheus, from the lab's apt repository, on
gpu-t4 (this test's inventory puts it in group gpukit_monitoring), scraping both nodes' agents
over the lab bridge at their declared addresses, with gpukit's alert rules.

- site.yml converges (the agent on 0.0.0.0:9402 reviewing each scrape's token, the default
  `gpukit_metrics_auth: kubernetes`; prometheus installed, configured, running); Prometheus has
  both agents up with the scraper's token (ServiceAccount gpukit-metrics-scraper, allowed only
  get nodes/metrics) read from a file beside its config, while a scrape without it is refused
  (401): `up` 1 is the token's doing; no task's output carries the token;
- a pod working on a GPU: the PromQL query for its pod answers its utilisation with its
  pod, namespace and container;
- an XID injected into gpu-t4's driver: GpuCriticalXid fires in Prometheus (ALERTS);
- the scraper's ServiceAccount deleted (its token Secret with it, the token revoked: both agents
  down in Prometheus): --check --diff reports the identity, the Secret and the token file
  changed without waiting for a token check mode does not make, and changes nothing; a run
  makes a new token, writes it, and Prometheus has both agents up again without a reload;
- site.yml again changes nothing (the token is the one it wrote); --check --diff with another
  scrape interval, and with `gpukit_metrics_auth: none`, reports the config (the token file's
  removal) and the reload changed and leaves the files as they were; a bad gpukit_metrics_port is
  refused by the preflight naming host, variable and value.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from labplay import PlayResult
from labtools import SiteLab, node_sh, site_lab, wait_for, work_pod

from gpukit import telemetry_manifests
from gpukit.contracts import metrics_auth
from gpukit.k8s import waits
from gpukit.lab import nodes
from gpukit.lab.config import LabSpec, state_dir
from gpukit.lab.nvml import workload

pytestmark = pytest.mark.lab

A100, T4 = "gpu-a100", "gpu-t4"
NS = "telemetry-prom"
SETTINGS = {"gpukit_metrics_prometheus": "host", "gpukit_metrics_scrape_interval": "5s"}
AGENT_NS = "gpukit-system"  # the device_plugin and gpu_telemetry roles' default namespace
TOKEN_FILE = "/etc/prometheus/gpukit-metrics-scraper.token"


@dataclass
class Lab(SiteLab):
    core: client.CoreV1Api
    first: PlayResult

    def play(self, *args: str, **overrides: Any) -> PlayResult:
        return self.site(*args, extra_vars={**SETTINGS, **overrides})


def promql(spec: LabSpec, query: str) -> list[dict[str, Any]]:
    """An instant query to the Prometheus on gpu-t4 (its HTTP API, from the node itself)."""
    url = "http://127.0.0.1:9090/api/v1/query?query=" + urllib.parse.quote(query)
    code = (f"import urllib.request,sys; sys.stdout.write(urllib.request.urlopen({json.dumps(url)}, "
            "timeout=10).read().decode())")  # the quoted query has no quote of its own
    answer = json.loads(node_sh(spec, T4, f"python3 -c '{code}'"))
    assert answer["status"] == "success", answer
    result: list[dict[str, Any]] = answer["data"]["result"]
    return result


# Prometheus and the node may not answer yet: a failed query is "not yet".
NOT_YET = (AssertionError, OSError)


def scrape_status(spec: LabSpec, target: str, token: str | None) -> int:
    """The HTTP status of a scrape of `target`'s /metrics from gpu-t4 (Prometheus' host), with
    `token` as bearer token or none."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    code = ("import urllib.request,urllib.error,sys\n"
            f"r = urllib.request.Request({json.dumps(f'http://{target}/metrics')}, "
            f"headers={json.dumps(headers)})\n"
            "try:\n  sys.stdout.write(str(urllib.request.urlopen(r, timeout=10).status))\n"
            "except urllib.error.HTTPError as e:\n  sys.stdout.write(str(e.code))\n")
    encoded = base64.b64encode(code.encode()).decode()
    return int(node_sh(spec, T4, f"echo {encoded} | base64 -d | python3 -"))


def scraper_token(core: client.CoreV1Api) -> str:
    """A digest of the scraper's token (a failing assert never prints the token itself)."""
    secret = core.read_namespaced_secret(telemetry_manifests.TOKEN_SECRET, AGENT_NS)
    return digest(base64.b64decode(secret.data["token"]).decode())


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def token_file(spec: LabSpec) -> str:
    """A digest of the token file on gpu-t4."""
    return digest(node_sh(spec, T4, f"cat {TOKEN_FILE}"))


def leaked(result: PlayResult, core: client.CoreV1Api) -> bool:
    """Whether the scraper's token is anywhere in a play's task results or messages."""
    secret = core.read_namespaced_secret(telemetry_manifests.TOKEN_SECRET, AGENT_NS)
    token = base64.b64decode(secret.data["token"]).decode()
    return token in json.dumps(result.results) + result.stderr


def add_monitoring_host(inventory: Path) -> None:
    """gpu-t4 in group gpukit_monitoring too."""
    hosts = yaml.safe_load((inventory / "hosts.yml").read_text())
    hosts["all"]["children"]["gpukit_monitoring"] = {"hosts": {T4: None}}
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts, sort_keys=False))


@pytest.fixture(scope="module")
def lab(lab_cluster: object, tmp_path_factory: pytest.TempPathFactory) -> Lab:
    base = site_lab(tmp_path_factory, "telemetry")  # its apt repository has Debian's prometheus
    add_monitoring_host(base.inventory)
    archive = workload.build_image(state_dir() / "shared" / "images")
    for node in (A100, T4):
        node_sh(base.spec, node, f"ctr -n k8s.io images import /opt/gpukit-lab/images/{archive.name}",
           timeout=120)
    lab = base.as_(Lab, core=client.CoreV1Api(), first=PlayResult(0, 0, {}))
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
    assert node_sh(lab.spec, T4, "systemctl is-active prometheus").strip() == "active"
    written = node_sh(lab.spec, T4, "cat /etc/prometheus/prometheus.yml")
    assert written.startswith("# Written by gpukit.gpu.gpu_telemetry"), written

    def both_up() -> dict[str, str]:
        got = {r["metric"]["node"]: r["value"][1]
               for r in promql(lab.spec, 'up{job="gpukit-node-agent"}')}
        return got if got == {A100: "1", T4: "1"} else {}

    wait_for("both agents up in Prometheus", both_up, timeout=120, every=2, retry_on=NOT_YET)
    instances = {r["metric"]["instance"]
                 for r in promql(lab.spec, 'up{job="gpukit-node-agent"}')}
    assert instances == {f"{lab.spec.node(n).address(lab.spec)}:9402" for n in (A100, T4)}


def test_prometheus_scrapes_with_the_scraper_s_token_and_nothing_else_would_do(lab: Lab) -> None:
    # The job sends the token from the file beside its config, which only root and the
    # prometheus group read, and which holds the scraper's ServiceAccount token.
    (job,) = [j for j in yaml.safe_load(node_sh(lab.spec, T4, "cat /etc/prometheus/prometheus.yml"))
              ["scrape_configs"] if j["job_name"] == "gpukit-node-agent"]
    assert job["authorization"] == {"type": "Bearer", "credentials_file": TOKEN_FILE}, job
    assert node_sh(lab.spec, T4, f"stat -c '%U:%G %a' {TOKEN_FILE}").strip() == "root:prometheus 640"
    assert token_file(lab.spec) == scraper_token(lab.core)
    secret = lab.core.read_namespaced_secret(telemetry_manifests.TOKEN_SECRET, AGENT_NS)
    token = base64.b64decode(secret.data["token"]).decode()
    # The scraper may get nodes/metrics and nothing more.
    rbac = client.RbacAuthorizationV1Api()
    role = rbac.read_cluster_role(telemetry_manifests.SCRAPER)
    assert [client.ApiClient().sanitize_for_serialization(r) for r in role.rules] == [
        metrics_auth.SCRAPER_RULE]
    binding = rbac.read_cluster_role_binding(telemetry_manifests.SCRAPER)
    assert [(s.kind, s.name, s.namespace) for s in binding.subjects] == [
        ("ServiceAccount", telemetry_manifests.SCRAPER, AGENT_NS)]
    # Each agent refuses a scrape without it and answers one with it: `up` 1 in Prometheus (the
    # test above) is the token's doing.
    for node in (A100, T4):
        target = f"{lab.spec.node(node).address(lab.spec)}:9402"
        assert scrape_status(lab.spec, target, None) == 401, target
        assert scrape_status(lab.spec, target, token) == 200, target
    # No task's output carries the token (no_log on every task that holds it).
    assert not leaked(lab.first, lab.core)


def test_promql_answers_a_working_pod_s_utilisation_with_its_labels(
        lab: Lab, namespace: str) -> None:
    name = f"work-{uuid.uuid4().hex[:6]}"
    pod = work_pod(name, A100, "nvidia.com/gpu", 2000, 70)
    lab.core.create_namespaced_pod(namespace, pod)
    waits.pod_phase(lab.core, namespace, name, {"Running"}, 120)
    query = f'DCGM_FI_DEV_GPU_UTIL{{pod="{name}"}}'

    def answered() -> list[dict[str, Any]]:
        got = promql(lab.spec, query)
        return got if got and float(got[0]["value"][1]) == 70 else []

    (series,) = wait_for(f"{query} at 70 %", answered, timeout=120, every=2, retry_on=NOT_YET)
    m = series["metric"]
    assert (m["pod"], m["namespace"], m["container"], m["node"], m["hostname"]) == (
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
                            timeout=120, every=2, retry_on=NOT_YET)
        assert alert["metric"]["severity"] == "critical", alert
        quiet = promql(lab.spec, 'ALERTS{alertname="GpuCriticalXid",node="gpu-a100"}')
        assert quiet == [], quiet
    finally:
        nodes.nvml_cli(node, "reset", "--gpu", "1")


def agents_up(spec: LabSpec) -> dict[str, str]:
    return {r["metric"]["node"]: r["value"][1]
            for r in promql(spec, 'up{job="gpukit-node-agent"}')}


def test_a_new_scraper_is_planned_then_made_and_its_token_written(lab: Lab) -> None:
    # The ServiceAccount deleted: the token controller deletes its token Secret, the token dies
    # with them, and both agents refuse Prometheus' next scrapes. (A Secret re-made for the same
    # ServiceAccount would get the very same token: the legacy token names only the account,
    # its uid and the Secret.)
    old = scraper_token(lab.core)
    lab.core.delete_namespaced_service_account(telemetry_manifests.SCRAPER, AGENT_NS)
    wait_for("the scraper's token Secret gone with its ServiceAccount",
             lambda: telemetry_manifests.TOKEN_SECRET not in {
                 s.metadata.name for s in lab.core.list_namespaced_secret(AGENT_NS).items},
             timeout=60)
    wait_for("both agents down without a valid token",
             lambda: agents_up(lab.spec) == {A100: "0", T4: "0"}, timeout=120, every=2,
             retry_on=NOT_YET)
    # Check mode: what a run would make, without waiting for a token it does not make. The
    # token file is reported as it would change (the new token is not known before it exists).
    plan = lab.play("--check", "--diff", "--tags", "gpu_telemetry")
    assert plan.rc == 0, plan.describe()
    assert sorted(t for tasks in plan.changed.values() for t in tasks) == [
        "Apply the scraper's ServiceAccount, ClusterRole and binding",
        "Apply the scraper's token Secret", "Write the scraper's token for Prometheus"], \
        plan.describe()
    assert token_file(lab.spec) == old
    assert telemetry_manifests.SCRAPER not in {
        a.metadata.name for a in lab.core.list_namespaced_service_account(AGENT_NS).items}
    made = lab.play("--tags", "gpu_telemetry")
    assert made.rc == 0, made.describe()
    new = scraper_token(lab.core)
    assert new != old and token_file(lab.spec) == new
    assert "Reload prometheus" not in made.changed.get(T4, []), made.describe()
    # Prometheus reads the file at each scrape: up again with no reload.
    wait_for("both agents up with the new token",
             lambda: agents_up(lab.spec) == {A100: "1", T4: "1"}, timeout=120, every=2,
             retry_on=NOT_YET)
    assert not leaked(made, lab.core)


def test_a_second_run_changes_nothing(lab: Lab) -> None:
    token = scraper_token(lab.core)
    again = lab.play()
    assert again.rc == 0, again.describe()
    assert {h: t for h, t in again.changed.items() if t} == {}, again.describe()
    assert scraper_token(lab.core) == token == token_file(lab.spec)
    assert not leaked(again, lab.core)


def test_check_mode_reports_drift_and_bad_input_is_refused(lab: Lab) -> None:
    config = "grep scrape_interval /etc/prometheus/prometheus.yml"
    before = node_sh(lab.spec, T4, config)
    drift = lab.play("--check", "--diff", "--tags", "gpu_telemetry",
                     gpukit_metrics_scrape_interval="10s")
    assert drift.rc == 0, drift.describe()
    assert {h: t for h, t in drift.changed.items() if t} == {T4: [
        "Write the configuration scraping every GPU node's agent", "Reload prometheus"]}, \
        drift.describe()
    assert node_sh(lab.spec, T4, config) == before == "  scrape_interval: 5s\n"
    # auth none: the config without the token, and no token file left behind; nothing yet.
    token_before = token_file(lab.spec)
    open_ = lab.play("--check", "--diff", "--tags", "gpu_telemetry", gpukit_metrics_auth="none")
    assert open_.rc == 0, open_.describe()
    assert {h: t for h, t in open_.changed.items() if t} == {T4: [
        "Write the configuration scraping every GPU node's agent",
        "Remove the scraper's token when no token is sent", "Reload prometheus"]}, \
        open_.describe()
    assert "credentials_file" in node_sh(lab.spec, T4, "cat /etc/prometheus/prometheus.yml")
    assert token_file(lab.spec) == token_before
    bad = lab.play("--tags", "gpu_telemetry", gpukit_metrics_port="x")
    assert bad.rc != 0
    message = " ".join(" ".join(t) for t in bad.failed.values())
    # -e sets it for every node: one problem naming the hosts (issue 29), gpu-t4 among them.
    assert re.search(r"hosts? [^:]*\bgpu-t4\b[^:]*: gpukit_metrics_port: 'x' is not a TCP port "
                     r"\(1-65535\)", message), \
        bad.describe()
