"""Dynamic MIG against the lab's mock NVML: prepare enables MIG mode on the idle GPU (reset as
the MIG manager resets it), creates the GPU instance at the allocated placement and its
compute instance, records them in the checkpoint and writes the MIG device's CDI spec (its
/dev/nvidia-caps nodes); unprepare destroys them; a failure leaves nothing; at start an
instance no checkpointed claim recorded is destroyed and a claimed one kept; the MIG manager
skips a dynamic GPU while a layout changes the others."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from gpukit.contracts import dra_dynamic_mig as contract
from gpukit.contracts import mig_parted
from gpukit.mig.planner import plan
from gpukit.plugin import nvml
from gpukit.plugin.dra.checkpoint import Checkpoint, CheckpointError
from gpukit.plugin.dra.dynamic_mig import NvmlCarver, publish_gpu
from gpukit.plugin.dra.prepare import ClaimRef, PrepareError, Preparer
from gpukit.plugin.dra.slice_devices import SliceDevice
from gpukit.plugin.mig import dra_claims
from gpukit.plugin.nvml.mig import PynvmlBackend

REPO = Path(__file__).resolve().parents[3]
LIB = Path(os.environ.get("GPUKIT_NVML_LIB") or REPO / "build" / "nvml" / "libnvidia-ml.so.1")
NODE = "gpu-node"
COMMON = {"env": ["NVIDIA_VISIBLE_DEVICES=void"]}
pytestmark = [pytest.mark.nvml,
              pytest.mark.skipif(not LIB.exists(), reason="mock NVML not built (make nvml)")]


def claim(device: str, uid: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": f"c-{uid}", "uid": uid},
            "status": {"allocation": {"devices": {"results": [
                {"request": "mig", "driver": "gpu.nvidia.com", "pool": NODE,
                 "device": device}], "config": []}}}}


class Api:
    def __init__(self) -> None:
        self.claims: dict[str, Mapping[str, Any]] = {}

    def __call__(self, namespace: str, name: str) -> Mapping[str, Any]:
        return self.claims[name]


class Node:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.backend = PynvmlBackend()
        self.proc_root = tmp / "proc-root"
        (self.proc_root / "proc").mkdir(parents=True)
        # the lab's driver keeps /proc/driver in the state directory (gpukit/lab/nvml/src/caps.c)
        (self.proc_root / "proc" / "driver").symlink_to(tmp / "state" / "proc-driver")
        found = nvml.discover(with_topology=False)
        self.gpu = found.gpus[0]
        _, devices = publish_gpu(self.gpu, found, ["1g.5gb", "3g.20gb"])
        self.devices: dict[str, SliceDevice] = {d.name: d for d in devices}
        self.api = Api()
        self.checkpoint_path = tmp / "plugin" / "gpukit-checkpoint.json"
        self.status: dict[str, list[dict[str, Any]]] = {}

    def preparer(self) -> Preparer:
        return Preparer(NODE, self.api, lambda: self.devices, lambda: COMMON,
                        Checkpoint(self.checkpoint_path), str(self.tmp / "cdi"), "/",
                        report_status=lambda ref, entries: self.status.update(
                            {ref.uid: entries}),
                        carver=NvmlCarver(str(self.proc_root)))

    def instances(self) -> list[tuple[str, int, int]]:
        g = self.backend.gpu(0)
        return [(gi.profile, gi.start, len(gi.compute_instances)) for gi in g.gpu_instances]

    def ask(self, device: str, uid: str) -> ClaimRef:
        self.api.claims[f"c-{uid}"] = claim(device, uid)
        return ClaimRef("ns", f"c-{uid}", uid)


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Node]:
    from gpukit.lab.nvml import load_mock, profile_path

    monkeypatch.setenv("GPUKIT_NVML_PROFILE", str(profile_path("a100-sxm4-40gb-x8")))
    monkeypatch.setenv("GPUKIT_NVML_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("GPUKIT_NVML_LIB", str(LIB))
    load_mock(LIB)
    nvml.init()
    try:
        yield Node(tmp_path)
    finally:
        nvml.shutdown()


def test_prepare_carves_the_placement_and_unprepare_destroys_it(node: Node) -> None:
    assert node.backend.gpu(0).mig_current is False  # MIG off: prepare enables it (idle GPU)
    p = node.preparer()
    ref = node.ask("gpu-0-mig-3g20gb-9-4", "u1")
    prepared = p.prepare(ref)
    assert node.instances() == [("3g.20gb", 4, 1)]
    [device] = prepared.devices
    assert device.instance is not None
    assert (device.instance["gpu"], device.instance["start"]) == (0, 4)
    mig = next(m for m in nvml.discover(with_topology=False).gpus[0].mig_devices)
    assert (mig.gi, mig.ci, mig.uuid) == (device.instance["gi"], device.instance["ci"],
                                          device.instance["uuid"])
    assert Checkpoint(node.checkpoint_path).get("u1") == prepared  # recorded before returning
    [status] = node.status["u1"]  # the claim's status.devices: the carved MIG device's facts
    assert status["data"] == {"type": "mig", "uuid": mig.uuid, "parentUUID": node.gpu.uuid,
                              "profile": "3g.20gb", "placement": {"start": 4, "size": 4},
                              "pciBusID": node.gpu.pci_bus_id}
    spec = json.loads((node.tmp / "cdi" / prepared.spec_file).read_text())
    [entry] = spec["devices"]
    paths = [n["path"] for n in entry["containerEdits"]["deviceNodes"]]
    assert paths[0] == "/dev/nvidia0"
    assert len(paths) == 3 and all(x.startswith("/dev/nvidia-caps/nvidia-cap")
                                   for x in paths[1:]), paths  # the GI's and the CI's

    ref2 = node.ask("gpu-0-mig-1g5gb-19-0", "u2")
    p.prepare(ref2)
    assert node.instances() == [("1g.5gb", 0, 1), ("3g.20gb", 4, 1)]
    assert p.unprepare(ref)
    assert node.instances() == [("1g.5gb", 0, 1)]
    assert not (node.tmp / "cdi" / prepared.spec_file).exists()
    assert Checkpoint(node.checkpoint_path).get("u1") is None
    assert p.unprepare(ref2)
    assert node.instances() == []


def test_a_placement_that_cannot_be_carved_leaves_nothing(node: Node) -> None:
    p = node.preparer()
    p.prepare(node.ask("gpu-0-mig-1g5gb-19-0", "u1"))
    ref = node.ask("gpu-0-mig-3g20gb-9-0", "u2")  # overlaps slice 0
    with pytest.raises(PrepareError, match=r"claim ns/c-u2 \(uid u2\): GPU 0 .*3g\.20gb at 0"):
        p.prepare(ref)
    assert node.instances() == [("1g.5gb", 0, 1)]
    assert Checkpoint(node.checkpoint_path).get("u2") is None
    assert sorted(os.listdir(node.tmp / "cdi")) == ["k8s.gpu.nvidia.com-claim_u1.json"]


def test_start_destroys_orphaned_instances_and_keeps_claimed_ones(node: Node) -> None:
    p = node.preparer()
    p.prepare(node.ask("gpu-0-mig-3g20gb-9-4", "u1"))
    # a prepare that died between creating and checkpointing left a GPU instance behind,
    # and one without its compute instance
    table = node.backend.gpu(0).table
    assert table is not None
    one = table.gpu_instance_profile("1g.5gb")
    gi = node.backend.create_gpu_instance(0, one.profile_id, 0, 1)
    node.backend.create_compute_instance(0, gi, one.compute_instance_profile(1).profile_id)
    node.backend.create_gpu_instance(0, one.profile_id, 1, 1)
    assert node.instances() == [("1g.5gb", 0, 1), ("1g.5gb", 1, 0), ("3g.20gb", 4, 1)]
    restarted = node.preparer()
    done = restarted.reconcile_instances({0: node.gpu.uuid})
    assert len(done["destroyed"]) == 2 and done["failed"] == []
    assert [k.split(": ")[1] for k in done["kept"]] == ["claim ns/c-u1 (uid u1)"]
    assert node.instances() == [("3g.20gb", 4, 1)]
    assert restarted.unprepare(ClaimRef("ns", "c-u1", "u1"))
    assert node.instances() == []


def test_the_mig_manager_skips_a_dynamic_gpu_and_changes_the_others(node: Node,
                                                                   tmp_path: Path) -> None:
    checkpoint = tmp_path / "plugin" / "gpukit-checkpoint.json"
    checkpoint.parent.mkdir(parents=True, exist_ok=True)
    checkpoint.with_name(contract.OWNED_FILE).write_text(json.dumps(
        contract.owned_document({0: node.gpu.uuid})))
    excluded = dra_claims.dynamic_gpus(checkpoint)
    assert list(excluded) == [0] and node.gpu.uuid in excluded[0]
    layout = mig_parted.parse({"all-3g": [{"devices": "all", "mig-enabled": True,
                                           "mig-devices": {"3g.20gb": 2}}]})
    planned = plan(layout, "all-3g", node.backend.gpus(), excluded)
    assert [g.gpu.index for g in planned.changed_gpus] == list(range(1, 8))
    gpu0 = planned.gpus[0]
    assert (gpu0.target, gpu0.actions, gpu0.note.startswith("skipped: GPU 0")) == \
        (None, (), True)
    checkpoint.with_name(contract.OWNED_FILE).write_text("{not json")
    with pytest.raises(CheckpointError, match=r"gpukit-dynamic-mig\.json: not JSON"):
        dra_claims.dynamic_gpus(checkpoint)
