"""What gpukit ships for watching GPUs (gpukit/monitoring, gpukit/telemetry_manifests.py), held to
promtool and to the agent's metrics: the alert rules pass `promtool check rules`, every alert
fires in the shipped `promtool test rules` cases; the dashboard is valid JSON whose every query
parses (promtool checks them as recording rules) and names only metrics the agent exports; the
Prometheus operator's objects select the agent and carry the rules and the dashboard.

promtool comes from Debian's `prometheus` package (gpukit/lab/scripts/install-deps.sh)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from debian_tools import promtool
from prometheus_client import generate_latest

from gpukit import monitoring, telemetry_manifests
from gpukit.contracts import metrics_auth
from gpukit.plugin import gpu_metrics
from gpukit.plugin.metrics import PluginMetrics

# Series the rules may read besides the agent's: Prometheus' own `up`, and kube-state-metrics'
# node capacity/allocatable (GpuUnhealthyStillAllocatable needs them; documented there).
OUTSIDE = {"up", "kube_node_status_capacity", "kube_node_status_allocatable"}
KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left",
            "group_right", "bool", "offset", "inf", "nan"}


def exported_names() -> set[str]:
    """Every metric name the agent's endpoint can carry: its own registry's families (as
    exposed: counters with _total) and the GPU metrics."""
    text = generate_latest(PluginMetrics().registry).decode()
    own = {line.split()[2] for line in text.splitlines() if line.startswith("# HELP ")}
    assert "gpukit_plugin_xid_events_total" in own and "gpukit_plugin_devices" in own
    return own | set(gpu_metrics.METRIC_NAMES)


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (selectors, not functions or labels)."""
    s = re.sub(r'"(\\.|[^"\\])*"', '""', expr)  # strings
    s = re.sub(r"\{[^}]*\}", " ", s)  # label matchers
    s = re.sub(r"\[[^\]]*\]", " ", s)  # ranges
    s = re.sub(r"\boffset\s+-?[0-9][0-9a-z]*", " ", s)  # offset modifiers (offset 10m)
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    names = set()
    for m in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", s):
        rest = s[m.end():].lstrip()
        if rest.startswith("(") or m.group(0).lower() in KEYWORDS:
            continue  # a function or an operator
        names.add(m.group(0))
    return names


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(monitoring.text(monitoring.RULES))
    return [r for g in doc["groups"] for r in g["rules"]]


def dashboard() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(monitoring.text(monitoring.DASHBOARD))
    return doc


def dashboard_exprs(doc: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in doc["panels"] for t in p["targets"]]


def concrete(expr: str) -> str:
    """A dashboard query as Grafana sends it (variables filled in)."""
    return expr.replace("$hostname", ".*").replace("$namespace", ".*")


def check_as_rules(tmp_path: Path, exprs: list[str]) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "exprs.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "check", "rules": [
        {"record": f"gpukit:check_{i}", "expr": concrete(e)} for i, e in enumerate(exprs)]}]}))
    return subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True,
                          text=True, check=False)


# ---- rules ----------------------------------------------------------------------------------


def test_the_rules_pass_promtool_and_every_alert_fires_in_its_tests(tmp_path: Path) -> None:
    for name in (monitoring.RULES, monitoring.RULES_TESTS):
        (tmp_path / name).write_text(monitoring.text(name))
    check = subprocess.run([promtool(), "check", "rules", monitoring.RULES], cwd=tmp_path,
                           capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"SUCCESS: {len(rules())} rules found" in check.stdout
    test = subprocess.run([promtool(), "test", "rules", monitoring.RULES_TESTS], cwd=tmp_path,
                          capture_output=True, text=True, check=False)
    assert test.returncode == 0, test.stdout + test.stderr
    cases = yaml.safe_load(monitoring.text(monitoring.RULES_TESTS))["tests"]
    fired = {t["alertname"] for c in cases for t in c["alert_rule_test"] if t["exp_alerts"]}
    assert fired == {r["alert"] for r in rules()}


def test_promtool_catches_a_rule_that_would_not_fire(tmp_path: Path) -> None:
    """The tests are real: the same cases against a rule with a wrong threshold fail."""
    (tmp_path / monitoring.RULES).write_text(
        monitoring.text(monitoring.RULES).replace("DCGM_FI_DEV_GPU_TEMP > 85",
                                                  "DCGM_FI_DEV_GPU_TEMP > 95"))
    (tmp_path / monitoring.RULES_TESTS).write_text(monitoring.text(monitoring.RULES_TESTS))
    test = subprocess.run([promtool(), "test", "rules", monitoring.RULES_TESTS], cwd=tmp_path,
                          capture_output=True, text=True, check=False)
    assert test.returncode != 0 and "GpuTemperatureHigh" in test.stdout + test.stderr


def test_the_rules_read_only_what_the_agent_exports() -> None:
    allowed = exported_names() | OUTSIDE
    for r in rules():
        names = metric_names(r["expr"])
        assert names and names <= allowed, (r["alert"], names - allowed)
        assert r["labels"]["severity"] in ("warning", "critical")
        assert r["annotations"]["summary"] and r["annotations"]["description"]


def test_metric_names_of_an_expression() -> None:
    assert metric_names('max by (hostname, gpu) (rate(DCGM_FI_DEV_X{a="b{c}"}[5m])) > 0 '
                        'and on (node) up{job="j"} or vector(1)') == {"DCGM_FI_DEV_X", "up"}
    assert metric_names("x > 0 unless x offset 10m") == {"x"}


# ---- dashboard ------------------------------------------------------------------------------


def test_the_dashboard_is_valid_and_every_query_parses(tmp_path: Path) -> None:
    doc = dashboard()
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids)) and doc["uid"] == "gpukit-gpus"
    exprs = dashboard_exprs(doc)
    assert len(exprs) >= len(doc["panels"])
    got = check_as_rules(tmp_path, exprs)
    assert got.returncode == 0, got.stdout + got.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in got.stdout
    for p in doc["panels"]:
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert {t["refId"] for t in p["targets"]} == {chr(65 + i) for i in
                                                      range(len(p["targets"]))}


def test_a_query_that_does_not_parse_is_caught(tmp_path: Path) -> None:
    got = check_as_rules(tmp_path, ["max by (gpu (DCGM_FI_DEV_GPU_TEMP)"])
    assert got.returncode != 0


def test_the_dashboard_names_only_metrics_the_agent_exports() -> None:
    doc = dashboard()
    allowed = exported_names() | {"up"}
    for expr in dashboard_exprs(doc):
        names = metric_names(expr)
        assert names and names <= allowed, (expr, names - allowed)
    for var in doc["templating"]["list"]:
        if var["type"] == "query":
            m = re.fullmatch(r"label_values\((\w+), (\w+)\)", var["definition"])
            assert m and m.group(1) in allowed, var
    # the per-pod views: utilisation, memory, energy by namespace carry the pod labels
    pod_panels = [p for p in doc["panels"] if any('pod!=""' in t["expr"] for t in p["targets"])]
    assert len(pod_panels) >= 3


# ---- the Prometheus operator's objects -------------------------------------------------------


def test_operator_objects_select_the_agent_and_carry_rules_and_dashboard() -> None:
    pm, rule, dash = telemetry_manifests.operator_objects("gpu-ops", auth="none")
    assert pm["kind"] == "PodMonitor" and pm["metadata"]["namespace"] == "gpu-ops"
    assert pm["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name":
                                                     "gpukit-node-agent"}
    (endpoint,) = pm["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "metrics" and endpoint["relabelings"][0]["targetLabel"] == "node"
    assert "authorization" not in endpoint  # auth none: the agent answers anyone
    assert telemetry_manifests.JOB == "gpukit-node-agent"  # what the rules select
    assert any('job="gpukit-node-agent"' in r["expr"] for r in rules())
    assert rule["spec"]["groups"] == yaml.safe_load(monitoring.text(monitoring.RULES))["groups"]
    assert dash["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dash["data"]["gpukit-gpus.json"]) == dashboard()
    svc, sm, _, _ = telemetry_manifests.operator_objects(mode="servicemonitor", port=9500,
                                                         interval="15s", auth="none")
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["ports"][0]["port"] == 9500
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"][0]["interval"] == "15s"
    assert "authorization" not in sm["spec"]["endpoints"][0]
    assert telemetry_manifests.manifests("gpu-ops", auth="none") == [pm, rule, dash]


def test_the_scraper_may_get_nodes_metrics_and_nothing_else() -> None:
    sa, role, binding, secret = telemetry_manifests.scraper("gpu-ops")
    assert (sa["kind"], sa["metadata"]["name"], sa["metadata"]["namespace"]) == (
        "ServiceAccount", "gpukit-metrics-scraper", "gpu-ops")
    # Exactly the attributes the agent's SubjectAccessReview asks (as the kubelet's /metrics).
    assert role["kind"] == "ClusterRole"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes/metrics"],
                              "verbs": ["get"]}]
    assert (metrics_auth.VERB, f"{metrics_auth.RESOURCE}/{metrics_auth.SUBRESOURCE}") == (
        "get", "nodes/metrics")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io",
                                  "kind": "ClusterRole", "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpukit-metrics-scraper",
                                    "namespace": "gpu-ops"}]
    # A long-lived token the token controller writes under `token` (no data of its own: an
    # apply never overwrites the token it holds).
    assert secret["type"] == "kubernetes.io/service-account-token" and "data" not in secret
    assert secret["metadata"]["annotations"] == {
        "kubernetes.io/service-account.name": "gpukit-metrics-scraper"}
    assert secret["metadata"]["namespace"] == "gpu-ops"


@pytest.mark.parametrize(("mode", "endpoints"), [("podmonitor", "podMetricsEndpoints"),
                                                 ("servicemonitor", "endpoints")])
def test_with_kubernetes_auth_each_scrape_sends_the_scraper_s_token(
        mode: str, endpoints: str) -> None:
    objects = telemetry_manifests.manifests("gpu-ops", mode)  # auth kubernetes: the default
    kinds = [o["kind"] for o in objects]
    assert kinds[:4] == ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Secret"], kinds
    secret = objects[3]
    (monitor,) = [o for o in objects if o["kind"].endswith("Monitor")]
    (endpoint,) = monitor["spec"][endpoints]
    # The operator's SafeAuthorization: a key of a Secret in the monitor's own namespace.
    assert endpoint["authorization"] == {
        "type": "Bearer", "credentials": {"name": secret["metadata"]["name"], "key": "token"}}
    assert monitor["metadata"]["namespace"] == secret["metadata"]["namespace"] == "gpu-ops"
    assert objects[4:] == telemetry_manifests.operator_objects("gpu-ops", mode)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"namespace": "GPU_ops"}, "namespace 'GPU_ops'"),
    ({"port": 0}, "port 0"),
    ({"port": "9402"}, "port '9402'"),
    ({"interval": "30"}, "interval '30'"),
    ({"mode": "scrape-config"}, "mode 'scrape-config'"),
    ({"auth": "tls"}, "auth 'tls' is not one of kubernetes, none"),
])
def test_bad_input_is_refused_naming_the_field(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        telemetry_manifests.manifests(**kwargs)


def test_the_scraper_refuses_a_bad_namespace() -> None:
    with pytest.raises(ValueError, match=re.escape("namespace 'GPU_ops'")):
        telemetry_manifests.scraper("GPU_ops")


def test_monitoring_names_its_files() -> None:
    with pytest.raises(ValueError, match=r"'alerts\.yml' is not one of"):
        monitoring.text("alerts.yml")
