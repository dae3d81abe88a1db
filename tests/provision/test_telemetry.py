"""prometheus.yml of role gpu_telemetry's host mode (gpukit.provision.telemetry), with and without
the scraper's token: what the job sends, and what promtool (Debian's prometheus package, as the
role's check-before-replace runs it) accepts. The operator objects: tests/plugin/
test_gpu_metrics_monitoring.py."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from debian_tools import promtool

from gpukit import inventory as inv
from gpukit.provision import telemetry

HV: dict[str, dict[str, Any]] = {"a": {"ansible_host": "10.1.0.1"}, "b": {"ansible_host": "10.1.0.2"}}


def _job(text: str) -> dict[str, Any]:
    (job,) = [j for j in yaml.safe_load(text)["scrape_configs"]
              if j["job_name"] == "gpukit-node-agent"]
    return dict(job)


def _check(config_dir: Path, text: str) -> subprocess.CompletedProcess[str]:
    """promtool check config, as the role's copy validates it (the rules file beside it)."""
    (config_dir / telemetry.RULES_FILE).write_text(telemetry.alert_rules())
    config = config_dir / "prometheus.yml.new"
    config.write_text(text)
    return subprocess.run([promtool(), "check", "config", str(config)], capture_output=True,
                          text=True, timeout=60, check=False)


def test_by_default_the_job_sends_the_scraper_s_token_from_the_file_beside_the_config() -> None:
    job = _job(telemetry.prometheus_config(["a", "b"], HV, "/etc/prometheus/"))
    assert job["authorization"] == {
        "type": "Bearer",
        "credentials_file": "/etc/prometheus/gpukit-metrics-scraper.token"}
    assert telemetry.TOKEN_FILE == "gpukit-metrics-scraper.token"
    assert [c["targets"] for c in job["static_configs"]] == [["10.1.0.1:9402"], ["10.1.0.2:9402"]]


def test_auth_none_sends_no_token() -> None:
    hv = {h: {**v, "gpukit_metrics_auth": "none"} for h, v in HV.items()}
    assert "authorization" not in _job(telemetry.prometheus_config(["a", "b"], hv))
    # The role's own value wins over the declarations it was derived from.
    assert "authorization" not in _job(telemetry.prometheus_config(["a", "b"], HV, auth="none"))
    assert "authorization" in _job(telemetry.prometheus_config(["a", "b"], hv, auth="kubernetes"))


def test_an_unknown_auth_is_refused_naming_it() -> None:
    with pytest.raises(inv.InventoryError, match="auth 'tls' is not one of kubernetes, none"):
        telemetry.prometheus_config(["a"], HV, auth="tls")
    hv = {"a": {"gpukit_metrics_auth": "tls"}}
    with pytest.raises(inv.InventoryError,
                       match="host a: gpukit_metrics_auth: 'tls' is not one of kubernetes, none"):
        telemetry.prometheus_config(["a"], hv)


def test_promtool_accepts_the_config_once_the_token_file_is_there(tmp_path: Path) -> None:
    text = telemetry.prometheus_config(["a", "b"], HV, str(tmp_path))
    # Before the token is written promtool refuses the config: the role writes the token first.
    missing = _check(tmp_path, text)
    assert missing.returncode != 0 and telemetry.TOKEN_FILE in missing.stdout + missing.stderr, \
        missing
    (tmp_path / telemetry.TOKEN_FILE).write_text("a-token")
    ok = _check(tmp_path, text)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    open_config = telemetry.prometheus_config(["a", "b"], HV, str(tmp_path), auth="none")
    (tmp_path / telemetry.TOKEN_FILE).unlink()
    ok = _check(tmp_path, open_config)
    assert ok.returncode == 0, ok.stdout + ok.stderr


def test_the_scraper_objects_refuse_a_bad_namespace_naming_it() -> None:
    assert [o["kind"] for o in telemetry.scraper("gpukit-system")] == [
        "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Secret"]
    with pytest.raises(inv.InventoryError, match="namespace 'GPU_ops' is not a Kubernetes"):
        telemetry.scraper("GPU_ops")
    with pytest.raises(inv.InventoryError, match="auth 'tls'"):
        telemetry.operator_manifests("gpukit-system", "podmonitor", 9402, "30s", "tls")
