"""A prepared claim's status.devices (KEP-4817): one entry per device (and shareID) of this
driver with the device's facts, written by server-side apply under the driver's field manager;
a failed write does not fail the prepare."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from dra_testlib import mig_and_whole_gpu_plugin

from gpukit.plugin.dra import claim_status
from gpukit.plugin.dra import kubelet_plugin as plugin_mod
from gpukit.plugin.dra.prepare import ClaimRef

MPS = [{"source": "FromClaim", "requests": ["mig"], "opaque": {
    "driver": "gpu.nvidia.com", "parameters": {
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}}}}},
       {"source": "FromClaim", "requests": ["gpu"], "opaque": {
           "driver": "gpu.nvidia.com", "parameters": {
               "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
               "sharing": {"strategy": "TimeSlicing"}}}}]


def test_prepare_reports_each_devices_facts(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    plugin = mig_and_whole_gpu_plugin(tmp_path, monkeypatch)
    plugin.rescan()
    found = sorted(plugin.devices())
    whole = next(n for n in found if "mig" not in n)
    mig = next(n for n in found if "mig" in n)
    doc = {"metadata": {"uid": "uid-1"}, "status": {"allocation": {"devices": {
        "results": [
            {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n1", "device": whole,
             "shareID": "s-1"},
            {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n1", "device": whole,
             "shareID": "s-2"},
            {"request": "mig", "driver": "gpu.nvidia.com", "pool": "n1", "device": mig},
            {"request": "nic", "driver": "example.com", "pool": "n1", "device": "eth0"}],
        "config": MPS[1:]}}}}
    plugin.preparer.read_claim = lambda ns, name: doc
    written: list[tuple[ClaimRef, list[dict[str, Any]]]] = []
    plugin.preparer.report_status = lambda ref, entries: written.append((ref, entries))
    ref = ClaimRef("ns", "c", "uid-1")
    plugin.preparer.prepare(ref)
    units = {n: d.unit for n, d in plugin.devices().items()}
    pci = plugin.devices()[whole].body["attributes"]["resource.kubernetes.io/pciBusID"]["string"]
    gpu_data = {"type": "gpu", "uuid": units[whole].uuid, "pciBusID": pci,
                "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {
                    "interval": "Default"}}}
    mig_data = {"type": "mig", "uuid": units[mig].uuid, "parentUUID": units[mig].gpu.uuid,
                "profile": "3g.20gb", "placement": {"start": 4, "size": 4},
                "pciBusID": plugin.devices()[mig].body["attributes"][
                    "resource.kubernetes.io/pciBusID"]["string"]}
    assert written == [(ref, [
        {"driver": "gpu.nvidia.com", "pool": "n1", "device": whole, "shareID": "s-1",
         "data": gpu_data},
        {"driver": "gpu.nvidia.com", "pool": "n1", "device": whole, "shareID": "s-2",
         "data": gpu_data},
        {"driver": "gpu.nvidia.com", "pool": "n1", "device": mig, "data": mig_data}])]
    assert all("networkData" not in e for e in written[0][1])
    assert len(json.dumps(written[0][1][0]["data"])) < 10 * 1024  # the API's limit on data
    # Prepared already (a kubelet retry): no second write.
    plugin.preparer.prepare(ref)
    assert len(written) == 1


def test_mps_settings_in_the_data() -> None:
    from gpukit.contracts import dra_claim_config as opaque

    cfg = opaque.parse("c", MPS[0]["opaque"]["parameters"])  # type: ignore[index]
    assert cfg.sharing is not None
    assert claim_status.sharing_data(cfg.sharing) == {
        "strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}}


def test_a_failed_status_write_leaves_the_claim_prepared(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    plugin = mig_and_whole_gpu_plugin(tmp_path, monkeypatch)
    plugin.rescan()
    whole = next(n for n in sorted(plugin.devices()) if "mig" not in n)
    plugin.preparer.read_claim = lambda ns, name: {
        "metadata": {"uid": "uid-1"}, "status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n1", "device": whole}]}}}}

    def forbidden(ref: ClaimRef, entries: list[dict[str, Any]]) -> None:
        raise RuntimeError("403 Forbidden")
    plugin.preparer.report_status = forbidden
    with caplog.at_level(logging.WARNING):
        prepared = plugin.preparer.prepare(ClaimRef("ns", "c", "uid-1"))
    assert prepared.devices[0].device == whole and plugin.checkpoint.get("uid-1") is not None
    assert "claim ns/c (uid uid-1): cannot write status.devices: 403 Forbidden" in caplog.text


def test_the_plugin_applies_the_status_as_the_driver(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    class ResourceApi:
        def __init__(self, api_client: Any) -> None:
            pass

        def patch_namespaced_resource_claim_status(self, *args: Any, **kwargs: Any) -> Any:
            calls.append((args, kwargs))
            return SimpleNamespace(release_conn=lambda: None)
    monkeypatch.setattr(plugin_mod.client, "ResourceV1Api", ResourceApi)
    plugin = mig_and_whole_gpu_plugin(tmp_path, monkeypatch)
    plugin.api_client = SimpleNamespace()
    entries = [{"driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-0"}]
    plugin._write_claim_status(ClaimRef("ns", "c", "uid-1"), entries)
    assert calls == [(("c", "ns", {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "ns", "uid": "uid-1"},
        "status": {"devices": entries}}), {
            "field_manager": "gpu.nvidia.com", "force": True,
            "_content_type": "application/apply-patch+yaml", "_request_timeout": 10,
            "_preload_content": False})]
