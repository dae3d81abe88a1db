"""The agent's loop pieces without NVML or an API: what a rescan publishes, what an XID
taints, and that the taint goes when the device recovers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from dra_testlib import FakeResourceApi, mig_and_whole_gpu_plugin
from plugin_testlib import make_gpu, make_inventory

from gpukit.plugin.dra import kubelet_plugin as plugin_mod
from gpukit.plugin.dra.kubelet_plugin import DraKubeletPlugin, KubeletPluginOptions
from gpukit.plugin.dra.slices import SlicePublisher


@pytest.fixture
def dra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[DraKubeletPlugin, FakeResourceApi]:
    a = mig_and_whole_gpu_plugin(tmp_path, monkeypatch)
    return a, a.publisher.api


def published(api: FakeResourceApi) -> list[str]:
    return [d["name"] for s in api.slices.values() for d in s["spec"]["devices"]]


def taints(api: FakeResourceApi) -> dict[str, list[tuple[str, str, str]]]:
    return {d["name"]: [(t["key"], t.get("value", ""), t["effect"]) for t in d.get("taints", [])]
            for s in api.slices.values() for d in s["spec"]["devices"]}


def test_an_xid_taints_the_device_until_it_recovers_and_lost_gpus_too(
        dra: tuple[DraKubeletPlugin, Any]) -> None:
    """Unhealthy devices stay published with NVIDIA's taint keys (a claim made before still
    names them; new claims avoid them), timeAdded kept while the problem lasts, and the taint
    goes when the device recovers (NVIDIA's stay until the plugin restarts)."""
    a, api = dra
    now = [1000.0]
    a.tracker.clock, a.tracker.recovery = (lambda: now[0]), 15
    a.rescan()
    assert published(api) == ["gpu-0-mig-3g20gb-9-4", "gpu-1"]
    assert taints(api) == {"gpu-0-mig-3g20gb-9-4": [], "gpu-1": []}
    assert a.tracker.on_xid(a.devices()["gpu-1"].unit.uuid, 79)
    a.publish()
    assert taints(api) == {"gpu-0-mig-3g20gb-9-4": [],
                           "gpu-1": [("gpu.nvidia.com/xid", "79", "NoSchedule")]}
    added = next(d for s in api.slices.values() for d in s["spec"]["devices"]
                 if d["name"] == "gpu-1")["taints"][0]["timeAdded"]
    generation = next(iter(api.slices.values()))["spec"]["pool"]["generation"]
    now[0] += 5
    a.rescan()  # nothing changed since: no new generation, the same timeAdded
    assert next(iter(api.slices.values()))["spec"]["pool"]["generation"] == generation
    a.tracker.on_probe(a.devices()["gpu-1"].unit.uuid, "GPU is lost")
    a.publish()
    assert taints(api)["gpu-1"] == [("gpu.nvidia.com/xid", "79", "NoSchedule"),
                                    ("gpu.nvidia.com/gpu-lost", "", "NoSchedule")]
    assert next(d for s in api.slices.values() for d in s["spec"]["devices"]
                if d["name"] == "gpu-1")["taints"][0]["timeAdded"] == added
    a.tracker.on_probe(a.devices()["gpu-1"].unit.uuid, "")  # seen again
    now[0] += 15  # and 20 s after the XID: recovered
    a.publish()
    assert taints(api) == {"gpu-0-mig-3g20gb-9-4": [], "gpu-1": []}


def test_an_xid_on_the_parent_taints_its_mig_devices(dra: tuple[DraKubeletPlugin, Any]) -> None:
    a, api = dra
    a.rescan()
    mig = a.devices()["gpu-0-mig-3g20gb-9-4"].unit
    a.tracker.on_xid(mig.gpu.uuid, 48)
    a.publish()
    assert taints(api) == {"gpu-0-mig-3g20gb-9-4": [("gpu.nvidia.com/xid", "48", "NoSchedule")],
                           "gpu-1": []}


class _Nodes:
    """CoreV1Api.read_node's answer: a node with these labels (or the API away)."""

    def __init__(self) -> None:
        self.labels: dict[str, str] | None = {}

    def read_node(self, name: str) -> Any:
        if self.labels is None:
            raise ConnectionError("API away")
        return type("Node", (), {"metadata": type("Meta", (), {"labels": self.labels})()})()


def test_the_nodes_shares_label_shares_every_device_and_follows_changes(
        dra: tuple[DraKubeletPlugin, Any], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    a, api = dra
    nodes = _Nodes()
    monkeypatch.setattr("gpukit.plugin.dra.node_shares.CoreV1Api", lambda api_client: nodes)
    a.api_client = object()

    def shares() -> dict[str, str | None]:
        return {d["name"]: (d.get("capacity") or {}).get("shares", {}).get("value")
                for s in api.slices.values() for d in s["spec"]["devices"]}

    nodes.labels = {"gpukit.io/dra.shares": "4"}
    a.rescan()
    assert shares() == {"gpu-0-mig-3g20gb-9-4": "4", "gpu-1": "4"}
    assert all(d["allowMultipleAllocations"] for s in api.slices.values()
               for d in s["spec"]["devices"])
    nodes.labels = None  # the API away: still shared as published
    a.rescan()
    assert shares()["gpu-1"] == "4"
    nodes.labels = {"gpukit.io/dra.shares": "many"}  # set by hand, badly: unshared, said why
    a.rescan()
    assert shares() == {"gpu-0-mig-3g20gb-9-4": None, "gpu-1": None}
    assert "node n1: label gpukit.io/dra.shares='many' is not an integer from 2 to 64" in \
        caplog.text
    a.options.shares = 2  # --shares wins over the label
    a.rescan()
    assert shares()["gpu-1"] == "2"


def test_a_claims_spec_gets_the_drivers_programs_and_nvidias_hooks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver root as the DaemonSet shows it (the libraries' directory and /usr/bin):
    a claim's spec binds the driver's programs and its `*.so.<version>` libraries and runs
    nvidia-cdi-hook's create-symlinks (libcuda.so) and update-ldcache, as NVIDIA's DRA
    driver's spec does; the host paths are the host's, not the plugin's view."""
    import json

    from gpukit.plugin.dra.prepare import ClaimRef

    root = tmp_path / "driver-root"
    libs, bins = root / "usr/lib/x86_64-linux-gnu", root / "usr/bin"
    libs.mkdir(parents=True)
    bins.mkdir(parents=True)
    for lib in ("libcuda.so.550.54.15", "libnvidia-ml.so.550.54.15"):
        (libs / lib).write_bytes(b"\x7fELF")
    for prog in ("nvidia-smi", "nvidia-cdi-hook"):
        (bins / prog).write_text("#!/bin/sh\n")
        (bins / prog).chmod(0o755)
    node = make_inventory([make_gpu(0, name="Tesla T4")])  # driver 550.54.15
    monkeypatch.setattr(plugin_mod.nvml, "discover", lambda with_topology: node)
    monkeypatch.setattr(plugin_mod, "placements", lambda devices, reader: {})
    a = DraKubeletPlugin(KubeletPluginOptions(
        node="n1", plugin_dir=str(tmp_path / "plugin"), cdi_dir=str(tmp_path / "cdi"),
        device_root="/", device_root_in_plugin=str(root), shares=0), api_client=None)
    a.publisher = SlicePublisher(None, "n1", api=FakeResourceApi())
    a.rescan()
    uid = "uid-1"
    a.preparer.read_claim = lambda ns, name: {
        "metadata": {"uid": uid}, "status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-0"}]}}}}
    a.preparer.prepare(ClaimRef("ns", "c", uid))
    spec = json.loads((tmp_path / "cdi" / f"k8s.gpu.nvidia.com-claim_{uid}.json").read_text())
    edits = spec["containerEdits"]
    assert {(m["hostPath"], m["containerPath"]) for m in edits["mounts"]} == {
        ("/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15",
         "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"),
        ("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15",
         "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15"),
        ("/usr/bin/nvidia-smi", "/usr/bin/nvidia-smi")}
    hooks = [h["args"][1:] for h in edits["hooks"]]
    assert ["create-symlinks", "--link",
            "libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so"] in hooks
    assert ["update-ldcache", "--folder", "/usr/lib/x86_64-linux-gnu"] in hooks
    assert {h["path"] for h in edits["hooks"]} == {"/usr/bin/nvidia-cdi-hook"}
