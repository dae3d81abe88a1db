"""`gpukit_metrics_*` in the inventory model: defaults, every bad value named with host and
variable, one DaemonSet's settings agreeing across hosts, and the declaration fact."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpukit import inventory as inv
from gpukit.inventory import metrics
from gpukit.provision import declaration, telemetry

T4 = {"product": "Tesla T4", "count": 2}
OPT_OUT = "gpukit_runtime_accept_envvar_unprivileged"


def _decl(**raw: Any) -> inv.NodeDecl:
    return inv.node_from_vars("n1", {"gpukit_gpu": T4, OPT_OUT: True, **raw})


def test_defaults_serve_every_interface_and_deploy_no_prometheus() -> None:
    m = _decl().metrics
    assert (m.enabled, m.agent_address, m.prometheus, m.scrape_interval) == (
        True, "0.0.0.0:9402", "none", "30s")
    assert m.target("10.0.0.5") == "10.0.0.5:9402"


def test_declared_values_reach_the_address_and_the_fact() -> None:
    d = _decl(gpukit_metrics_listen_address="::", gpukit_metrics_port=9500,
              gpukit_metrics_prometheus="host", gpukit_metrics_scrape_interval="15s")
    assert d.metrics.agent_address == "[::]:9500"
    assert d.metrics.target("fd00::5") == "[fd00::5]:9500"
    fact = declaration.for_vars("n1", {"gpukit_gpu": T4, OPT_OUT: True,
                                       "gpukit_metrics_port": 9500})
    assert fact["metrics"]["agent_address"] == "0.0.0.0:9500"
    assert fact["inputs"]["gpukit_metrics_port"] == 9500
    assert _decl(gpukit_metrics_enabled=False).metrics.agent_address == ""


def test_every_bad_value_is_named_at_once() -> None:
    with pytest.raises(inv.InventoryError) as exc:
        _decl(gpukit_metrics_enabled="yes", gpukit_metrics_listen_address="node-1",
              gpukit_metrics_port=70000, gpukit_metrics_scrape_interval="30 s",
              gpukit_metrics_prometheus="grafana")
    text = str(exc.value)
    for expected in (
        "host n1: gpukit_metrics_enabled: 'yes' is not true or false",
        "gpukit_metrics_listen_address: 'node-1' is not an IP address",
        "gpukit_metrics_port: 70000 is not a TCP port (1-65535)",
        "gpukit_metrics_scrape_interval: '30 s' is not a Prometheus duration",
        "gpukit_metrics_prometheus: 'grafana' is not one of host, operator, none",
    ):
        assert expected in text, text


def test_a_prometheus_cannot_scrape_loopback_or_nothing() -> None:
    with pytest.raises(inv.InventoryError, match=re.escape(
            "gpukit_metrics_listen_address: '127.0.0.1' serves only the node itself")):
        _decl(gpukit_metrics_listen_address="127.0.0.1", gpukit_metrics_prometheus="host")
    with pytest.raises(inv.InventoryError, match="gpukit_metrics_enabled: False is false, yet "
                       "gpukit_metrics_prometheus is operator"):
        _decl(gpukit_metrics_enabled=False, gpukit_metrics_prometheus="operator")
    assert _decl(gpukit_metrics_listen_address="127.0.0.1").metrics.agent_address == \
        "127.0.0.1:9402"  # nobody scrapes it from elsewhere: allowed


def _inventory(tmp_path: Path, t4_vars: dict[str, Any]) -> Path:
    hosts = {"all": {"children": {"gpu_nodes": {"hosts": {
        "a": {"gpukit_gpu": T4, OPT_OUT: True},
        "b": {"gpukit_gpu": T4, OPT_OUT: True, **t4_vars}}}}}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(hosts))
    return tmp_path / "hosts.yml"


def test_one_daemonset_one_port_across_hosts(tmp_path: Path) -> None:
    with pytest.raises(inv.InventoryError) as exc:
        inv.load(_inventory(tmp_path, {"gpukit_metrics_port": 9500}))
    assert "host b: gpukit_metrics_port: 9500 differs from host a's 9402" in str(exc.value)
    assert [n.metrics.port for n in inv.load(_inventory(tmp_path, {})).nodes] == [9402, 9402]


def test_the_prometheus_config_scrapes_each_node_at_its_declared_address() -> None:
    hv = {"a": {"ansible_host": "10.1.0.1", "gpukit_metrics_scrape_interval": "10s"},
          "b": {"gpukit_node_name": "node-b", "gpukit_metrics_scrape_interval": "10s"}}
    doc = yaml.safe_load(telemetry.prometheus_config(["a", "b"], hv))
    assert doc["global"]["scrape_interval"] == "10s"
    (job,) = [j for j in doc["scrape_configs"] if j["job_name"] == "gpukit-node-agent"]
    assert job["static_configs"] == [
        {"targets": ["10.1.0.1:9402"], "labels": {"node": "a"}},
        {"targets": ["node-b:9402"], "labels": {"node": "node-b"}}]
    assert doc["rule_files"] == ["/etc/prometheus/gpukit-gpu-alerts.rules.yml"]
    hv["b"]["gpukit_metrics_port"] = "x"
    with pytest.raises(inv.InventoryError, match="host b: gpukit_metrics_port: 'x'"):
        telemetry.prometheus_config(["a", "b"], hv)


def test_the_declaration_variables_include_them() -> None:
    assert set(metrics.VARIABLES) <= set(inv.DECLARED_VARIABLES)
