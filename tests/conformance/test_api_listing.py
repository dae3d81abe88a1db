"""The suite's API-side checks read one list of nodes (and of ResourceSlices) per area, and
still fail naming the node, the expected and the observed value when one node of many
disagrees with the declaration; and --api-only reports a check every node skips once."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _pytest.outcomes import Failed, Skipped
from kubernetes import client

from gpukit.conformance import test_discovery, test_dra, test_labels
from gpukit.conformance.checks import Check
from gpukit.conformance.suite import Options, Suite
from gpukit.contracts import label_names as ln
from gpukit.lab.fleet import inventory as fleet_inventory
from gpukit.lab.fleet import standin

NODES = 200
T = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)


class FakeKube:
    """The cluster as Suite reads it: counts lists; a GET per node is a failure here."""

    def __init__(self, nodes: dict[str, Any], slices: list[dict[str, Any]]) -> None:
        self._nodes, self._slices = nodes, slices
        self.node_lists = self.slice_lists = 0

    def nodes(self) -> dict[str, Any]:
        self.node_lists += 1
        return dict(self._nodes)

    def resource_slices(self) -> list[dict[str, Any]]:
        self.slice_lists += 1
        return list(self._slices)

    def node(self, name: str) -> Any:
        raise AssertionError(f"read node {name}: the API-side checks list, they do not GET")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fleet_inventory.generate(tmp_path_factory.mktemp("fleet") / "inv", NODES,
                                    kubeconfig=Path("/nonexistent/kubeconfig"))


def _suite(fleet: Path, change: Callable[[dict[str, Any]], None] | None = None,
           victim: str = "sim-0137") -> tuple[Suite, FakeKube]:
    suite = Suite(Options(inventory=str(fleet), host_access=False))
    assert suite.inventory is not None
    objs: dict[str, Any] = {}
    for decl in suite.inventory.nodes:
        body = standin.node_object(decl, decl.address or "", T)
        if change is not None and decl.node_name == victim:
            change(body)
        objs[decl.node_name] = client.V1Node.from_dict(body)
    kube = FakeKube(objs, [])
    suite._kube = kube  # type: ignore[assignment]
    return suite, kube


def _run(suite: Suite, fn: Callable[..., None], area: str,
         resources: Callable[[str], list[str]] | None = None) -> dict[str, str]:
    """Run one check on every node: node -> failure message (passed and skipped: absent)."""
    failures: dict[str, str] = {}
    for node in suite.targets():
        for resource in (resources(node) if resources else [None]):
            check = Check(node, area)
            args = (suite, node) + ((resource,) if resource is not None else ()) + (check,)
            try:
                fn(*args)
            except Skipped:
                pass
            except Failed as exc:
                failures[node] = str(exc)
    return failures


def test_a_healthy_fleet_passes_from_one_list_of_nodes(fleet: Path) -> None:
    suite, kube = _suite(fleet)
    for fn, area in ((test_discovery.test_node_is_registered_and_ready, "discovery"),
                     (test_discovery.test_no_undeclared_resources, "discovery"),
                     (test_discovery.test_the_agent_s_declaration_condition_agrees, "discovery"),
                     (test_labels.test_gfd_labels, "labels"),
                     (test_labels.test_declared_node_labels, "labels"),
                     (test_labels.test_labels_agree_with_resources, "labels")):
        assert _run(suite, fn, area) == {}, fn.__name__
    assert _run(suite, test_discovery.test_capacity_and_allocatable, "discovery",
                lambda n: sorted(suite.resources(n))) == {}
    assert kube.node_lists == 1  # one list for all of them (no area change in between)
    suite.forget_listings()  # as the plugin does when the next area starts
    assert _run(suite, test_labels.test_gfd_labels, "labels") == {}
    assert kube.node_lists == 2


def _set_capacity(body: dict[str, Any]) -> None:
    status = body["status"]
    gpu = next(r for r in status["allocatable"] if r.startswith(ln.RESOURCE_PREFIX))
    status["allocatable"][gpu] = "1"


def test_one_node_advertising_too_little_is_named(fleet: Path) -> None:
    suite, _ = _suite(fleet, _set_capacity)
    failures = _run(suite, test_discovery.test_capacity_and_allocatable, "discovery",
                    lambda n: sorted(suite.resources(n)))
    assert list(failures) == ["sim-0137"]
    assert "allocatable" in failures["sim-0137"] and "observed 1" in failures["sim-0137"]


def _wrong_product(body: dict[str, Any]) -> None:
    body["metadata"]["labels"][ln.GPU_PRODUCT] = "NVIDIA-Z900"


def test_one_node_with_a_wrong_label_is_named(fleet: Path) -> None:
    suite, _ = _suite(fleet, _wrong_product)
    failures = _run(suite, test_labels.test_gfd_labels, "labels")
    assert list(failures) == ["sim-0137"]
    message = failures["sim-0137"]
    assert ln.GPU_PRODUCT in message and "observed NVIDIA-Z900" in message
    assert "expected NVIDIA-" in message


def test_a_node_missing_from_the_list_is_named(fleet: Path) -> None:
    suite, kube = _suite(fleet)
    del kube._nodes["sim-0042"]
    failures = _run(suite, test_discovery.test_node_is_registered_and_ready, "discovery")
    assert list(failures) == ["sim-0042"]
    assert "expected present, observed missing" in failures["sim-0042"]


def test_resource_slices_come_from_one_list_grouped_by_node(fleet: Path) -> None:
    suite, kube = _suite(fleet)
    pool = {"name": "sim-0001", "generation": 1}
    kube._slices = [
        {"spec": {"nodeName": "sim-0001", "driver": test_dra.DRIVER, "pool": pool}},
        {"spec": {"nodeName": "sim-0002", "driver": test_dra.DRIVER, "pool": pool}},
        {"spec": {"nodeName": "sim-0001", "driver": "other.example.com", "pool": pool}},
    ]
    assert [s["spec"]["nodeName"] for s in test_dra.node_slices(suite, "sim-0001")] == [
        "sim-0001"]
    assert test_dra.node_slices(suite, "sim-0003") == []
    assert kube.slice_lists == 1


def test_api_only_skips_a_check_every_node_needs_a_kubelet_for_once(fleet: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "gpukit/conformance", "--inventory", str(fleet),
         "--api-only", "--no-host", "--collect-only", "-q", "-p", "no:cacheprovider",
         "-m", "discovery or isolation"],
        cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    ids = [line for line in out.stdout.splitlines() if "::" in line]
    kubelet = [i for i in ids if "test_kubelet_sees_the_same_devices" in i]
    assert kubelet == [f"gpukit/conformance/test_discovery.py::"
                       f"test_kubelet_sees_the_same_devices[every-node-of-{NODES}]"]
    fills = [i for i in ids if "test_node_fills_to_capacity" in i]
    assert fills == [f"gpukit/conformance/test_isolation.py::"
                     f"test_node_fills_to_capacity[every-node-of-{NODES}]"]
    # The API-side checks stay one per node.
    assert len([i for i in ids if "test_node_is_registered_and_ready" in i]) == NODES
