"""gpukit on a real NVIDIA GPU: discovery, labels, facts, the device plugin and its health
watch, each checked against nvidia-smi. Read-only: nothing here changes MIG mode, resets a
GPU or runs work on it."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from plugin_testlib import FakeKubelet, dial

from gpukit.contracts import label_names as ln
from gpukit.contracts.plugin_config import parse_config
from gpukit.lab.nvml import fidelity
from gpukit.plugin import nvml
from gpukit.plugin.api import deviceplugin_pb2 as pb
from gpukit.plugin.config_source import ConfigSource, Override
from gpukit.plugin.devices import NodeDevices
from gpukit.plugin.labels import compute_labels
from gpukit.plugin.manager import ManagerOptions, PluginManager, PynvmlBackend
from gpukit.provision import gpu_facts


def driver_minor(bus_id: str) -> int:
    """The device minor the kernel driver gave this GPU (/proc/driver/nvidia)."""
    info = Path("/proc/driver/nvidia/gpus") / bus_id[-12:].lower() / "information"
    match = re.search(r"^Device Minor:\s*(\d+)", info.read_text(), re.M)
    assert match, info
    return int(match.group(1))


@pytest.fixture
def devices() -> Iterator[NodeDevices]:
    nvml.init()
    try:
        yield nvml.discover(with_topology=True)
    finally:
        nvml.shutdown()


def test_discovery_matches_nvidia_smi(devices: NodeDevices, smi: list[dict[str, str]]
                                      ) -> None:
    assert [g.uuid for g in devices.gpus] == [s["uuid"] for s in smi]
    for gpu, s in zip(devices.gpus, smi, strict=True):
        assert gpu.name == s["name"]
        assert gpu.memory_mb == int(s["memory.total"])
        assert nvml.normalize_bus_id(gpu.pci_bus_id) == nvml.normalize_bus_id(s["pci.bus_id"])
        assert f"{gpu.compute_major}.{gpu.compute_minor}" == s["compute_cap"]
        assert gpu.minor == driver_minor(s["pci.bus_id"])
        assert os.path.exists(gpu.device_node)
        assert gpu.mig_enabled == (s["mig.mode.current"] == "Enabled")
        assert gpu.mig_capable == (s["mig.mode.current"] != "[N/A]")
    assert devices.driver_version == smi[0]["driver_version"]


def test_labels_describe_the_gpu(devices: NodeDevices, smi: list[dict[str, str]]) -> None:
    labels = compute_labels(devices, parse_config({}))
    first = smi[0]
    assert labels[f"{ln.GPU_RESOURCE}.{ln.PRODUCT}"] == first["name"].replace(" ", "-")
    assert labels[f"{ln.GPU_RESOURCE}.{ln.COUNT}"] == str(len(smi))
    assert labels[f"{ln.GPU_RESOURCE}.{ln.MEMORY}"] == first["memory.total"]
    major, minor = first["compute_cap"].split(".")
    assert labels[f"{ln.GPU_RESOURCE}.{ln.COMPUTE_MAJOR}"] == major
    assert labels[f"{ln.GPU_RESOURCE}.{ln.COMPUTE_MINOR}"] == minor
    assert labels[ln.CUDA_DRIVER_FULL] == first["driver_version"]
    assert labels[ln.CUDA_DRIVER_MAJOR] == first["driver_version"].split(".")[0]
    assert labels[ln.MIG_CAPABLE] == str(first["mig.mode.current"] != "[N/A]").lower()
    if major == "9":
        assert labels[f"{ln.GPU_RESOURCE}.{ln.FAMILY}"] == "hopper"


def test_facts_module_reports_the_driver(smi: list[dict[str, str]]) -> None:
    facts = gpu_facts.gather()
    assert facts.nvml and facts.error is None, facts.error
    assert facts.driver_version == smi[0]["driver_version"]
    assert facts.gpu_count == len(smi)
    assert [g.uuid for g in facts.gpus] == [s["uuid"] for s in smi]
    for fact, s in zip(facts.gpus, smi, strict=True):
        want = {"Enabled": "enabled", "Disabled": "disabled"}.get(s["mig.mode.current"])
        assert fact.mig_mode_current == want
    assert not facts.nouveau_loaded


def test_the_plugin_serves_the_real_gpus_to_a_kubelet(
    short_tmp: Path, smi: list[dict[str, str]], caplog: pytest.LogCaptureFixture
) -> None:
    """Registration, ListAndWatch, Allocate with real device nodes, the CDI spec, and health
    watched through real NVML XID event registration: healthy, and no warning about events."""
    caplog.set_level(logging.INFO)
    kubelet = FakeKubelet(short_tmp)
    kubelet.start()
    overrides = [
        Override("gpukit.kubeletDir", str(short_tmp), "test"),
        Override("gpukit.cdiSpecDir", str(short_tmp / "cdi"), "test"),
        Override("gpukit.deviceRoot", "/", "test"),
        Override("flags.plugin.passDeviceSpecs", True, "test"),
        Override("flags.migStrategy", "none", "test"),
        Override("flags.plugin.deviceListStrategy", ["envvar", "cdi-cri"], "test"),
    ]
    manager = PluginManager(ConfigSource(overrides=overrides), PynvmlBackend(),
                            options=ManagerOptions(tick=0.05, health=True,
                                                   register_retry_seconds=0.2))
    manager.start()
    try:
        req = kubelet.next_request(timeout=30)
        assert req.resource_name == "nvidia.com/gpu"
        channel, stub = dial(str(short_tmp / req.endpoint))
        stream = stub.ListAndWatch(pb.Empty(), timeout=60)
        first = next(stream)
        uuids = [s["uuid"] for s in smi]
        assert sorted(d.ID for d in first.devices) == sorted(uuids)
        time.sleep(3)  # a few health loop turns on the real event set
        assert all(manager.tracker.healthy(u) for u in uuids)

        resp = stub.Allocate(pb.AllocateRequest(container_requests=[
            pb.ContainerAllocateRequest(devices_ids=[uuids[0]])]), timeout=10)
        c = resp.container_responses[0]
        assert c.envs["NVIDIA_VISIBLE_DEVICES"] == uuids[0]
        paths = {d.container_path: d.host_path for d in c.devices}
        assert f"/dev/nvidia{driver_minor(smi[0]['pci.bus_id'])}" in paths
        assert "/dev/nvidiactl" in paths
        assert all(os.path.exists(h) for h in paths.values()), paths
        assert [d.name for d in c.cdi_devices] == [f"nvidia.com/gpu={uuids[0]}"]
        spec = json.loads(next((short_tmp / "cdi").glob("*.json")).read_text())
        assert uuids[0] in [d["name"] for d in spec["devices"]]
        edits = [e for d in spec["devices"] if d["name"] == uuids[0]
                 for e in d["containerEdits"]["deviceNodes"]]
        assert edits and all(os.path.exists(e.get("hostPath", e["path"])) for e in edits), edits
        stream.cancel()
        channel.close()
    finally:
        manager.stop()
        kubelet.stop()
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not [w for w in warnings if "XID" in w or "event" in w], warnings


def test_record_the_driver_answers_for_the_mock(tmp_path: Path) -> None:
    """The fidelity record (gpukit.lab.nvml.fidelity) of this GPU: written for the repository
    (tests/lab/nvml/data) where GPUKIT_FIDELITY_OUT says, and sane against nvidia-smi."""
    import pynvml

    record = fidelity.record(pynvml)
    by_key = {e["key"]: e for e in record["entries"]}
    assert by_key["device.name"]["rc"] == "NVML_SUCCESS"
    assert by_key["device.xid_events(wait 10 ms)"]["rc"] == "NVML_ERROR_TIMEOUT"
    out = Path(os.environ.get("GPUKIT_FIDELITY_OUT", tmp_path / "record.json"))
    out.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")


def _mig_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpukit.plugin.mig", *args],
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_the_mig_manager_plans_against_the_real_gpu_without_touching_it(
    smi: list[dict[str, str]],
) -> None:
    """plan, assert and export read the driver's MIG state and profile table (driver profile
    ids included); the GPU's MIG mode is the same afterwards. Nothing is applied."""
    first = smi[0]
    if first["mig.mode.current"] == "[N/A]":
        pytest.fail(f"{first['name']} is not MIG capable: this test needs a MIG-capable GPU")
    enabled = first["mig.mode.current"] == "Enabled"
    configs = json.dumps({
        "mixed": [{"devices": [0], "mig-enabled": True,
                   "mig-devices": {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}}],
        "as-is": [{"devices": "all", "mig-enabled": enabled}],
    })  # fmt: skip
    plan = _mig_cli("plan", "--configs-json", configs, "--selected", "mixed", "--json")
    assert plan.returncode == 0, plan.stderr
    doc = json.loads(plan.stdout)
    gpu0 = doc["gpus"][0]
    assert gpu0["current"]["mig_capable"] and gpu0["current"]["mig_enabled"] == enabled
    # gpukit's MIG table held to this driver: every profile offered, no disagreement warned.
    assert gpu0["unavailable_profiles"] == []
    assert plan.stderr.strip() == "", plan.stderr  # the table check warns on stderr
    assert sorted(d["profile"] for d in gpu0["target"]["devices"]) == [
        "1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]
    texts = [a["text"] for a in doc["actions"]]
    if not enabled:
        assert doc["reset_required"] == [0]
        assert texts[:2] == ["GPU 0: set MIG mode enabled",
                             "GPU 0: reset the GPU (applies the pending MIG mode)"]
    assert "GPU 0: create GPU instance 3g.40gb at slice 4" in texts
    # An impossible layout is refused against the real table before anything is touched.
    bad = json.dumps({"bad": [{"devices": [0], "mig-enabled": True,
                               "mig-devices": {"3g.40gb": 3}}]})  # fmt: skip
    refused = _mig_cli("plan", "--configs-json", bad, "--selected", "bad")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    held = _mig_cli("assert", "--configs-json", configs, "--selected", "as-is")
    assert held.returncode == 0, held.stdout + held.stderr
    export = _mig_cli("export", "--json")
    assert export.returncode == 0, export.stderr
    current = json.loads(export.stdout)["mig-configs"]["current"]
    assert {e["mig-enabled"] for e in current} == {enabled}
    after = subprocess.run(["nvidia-smi", "--query-gpu=mig.mode.current,mig.mode.pending",
                            "--format=csv,noheader"], capture_output=True, text=True,
                           check=True).stdout.splitlines()[0]  # fmt: skip
    assert [v.strip() for v in after.split(",")] == [first["mig.mode.current"]] * 2
