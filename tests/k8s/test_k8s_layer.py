"""gpukit.k8s: the one Kubernetes access layer (its lab use is proven by tests/lab, which
deploy, wait for and remove the node agent through it)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any

import pytest
import yaml
from kubernetes import config

from gpukit.k8s import connect, names, nodes, waits


def _node(allocatable: dict[str, str] | None = None, ready: str = "True",
          heartbeat: dt.datetime | None = None) -> Any:
    cond = NS(type="Ready", status=ready, reason="KubeletReady", message="ok",
              last_heartbeat_time=heartbeat)
    return NS(status=NS(allocatable=allocatable, capacity=allocatable, conditions=[cond]))


def test_resource_counts_sorted_and_a_bad_quantity_shows() -> None:
    node = _node({"nvidia.com/mig-1g.5gb": "7", "cpu": "2", "nvidia.com/gpu": "1",
                  "nvidia.com/odd": "1500m"})
    assert nodes.allocatable(node) == {"nvidia.com/gpu": 1, "nvidia.com/mig-1g.5gb": 7,
                                       "nvidia.com/odd": -1}
    assert list(nodes.capacity(node)) == sorted(nodes.capacity(node))
    assert nodes.allocatable(None) == {}


def test_ready_and_reported_after() -> None:
    t0 = dt.datetime(2026, 11, 25, 18, 0, tzinfo=dt.UTC)
    assert nodes.ready(_node()) == (True, "KubeletReady ok")
    assert nodes.ready(_node(ready="False"))[0] is False
    assert nodes.ready(NS(status=NS(conditions=[]))) == (False, "no Ready condition")
    assert nodes.reported_after(_node(heartbeat=t0 + dt.timedelta(seconds=1)), t0)
    assert not nodes.reported_after(_node(heartbeat=t0), t0)


def test_dns_names_fit_a_label() -> None:
    assert names.dns_name("Fill", "gpu_t4", "nvidia.com/gpu") == "fill-gpu-t4-nvidia-com-gpu"
    long = names.dns_name("x" * 80, "node")
    assert len(long) == 63 and long != names.dns_name("x" * 80, "other")


def _ds(generation: int, observed: int, desired: int, updated: int, available: int) -> Any:
    return NS(metadata=NS(generation=generation),
              status=NS(observed_generation=observed, desired_number_scheduled=desired,
                        updated_number_scheduled=updated, number_available=available))


@pytest.mark.parametrize(("ds", "why"), [
    (_ds(2, 1, 2, 2, 2), "the controller has not seen the new spec"),
    (_ds(2, 2, 2, 1, 2), "1 of 2 pods updated"),
    (_ds(2, 2, 2, 2, 1), "1 of 2 pods available"),
    (_ds(2, 2, 2, 2, 2), None),
])
def test_rollout_pending_as_kubectl_rollout_status(ds: Any, why: str | None) -> None:
    assert waits._rollout_pending(ds) == why


def _kubeconfig(path: Path, server: str) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}))
    return path


def test_client_from_the_kubeconfig_given_or_the_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    given = _kubeconfig(tmp_path / "given", "https://given.invalid:6443")
    env = _kubeconfig(tmp_path / "env", "https://env.invalid:6443")
    monkeypatch.setenv("KUBECONFIG", str(env))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert connect.api_client(given).configuration.host == "https://given.invalid:6443"
    assert connect.api_client().configuration.host == "https://env.invalid:6443"
    # The agent asks for its ServiceAccount first; outside a pod it falls back to the file.
    assert connect.api_client(in_cluster_first=True).configuration.host == \
        "https://env.invalid:6443"


def test_no_api_names_both_places_it_looked(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(config.ConfigException, match="no Kubernetes API to connect to"):
        connect.api_client()
