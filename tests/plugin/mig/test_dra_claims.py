"""The MIG manager refuses to change a GPU that a prepared DRA claim holds (the DRA plugin's
checkpoint lists them), as it refuses one with GPU processes, unless forced."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from migtest import MockNode, cli_json
from nvidia_dra_fixtures import allocation, claim, gpu, group, render

from gpukit.contracts import mig_parted as schema
from gpukit.plugin.dra.checkpoint import Checkpoint, CheckpointError, PreparedClaim, PreparedDevice
from gpukit.plugin.mig import dra_claims
from gpukit.plugin.mig.applier import ClaimsHeld, apply

pytestmark = pytest.mark.nvml
ONLY0 = {"x": [{"devices": [0], "mig-enabled": True, "mig-devices": {"3g.20gb": 2}}]}


def _prepare(path: Path, name: str, *devices: str) -> None:
    """A claim as the DRA plugin checkpoints it after NodePrepareResources."""
    Checkpoint(path).put(PreparedClaim(
        f"uid-{name}", "team-a", name,
        tuple(PreparedDevice(("gpu",), "node-1", d, (f"k8s.gpu.nvidia.com/claim=uid-{d}",))
              for d in devices), f"/var/run/cdi/k8s.gpu.nvidia.com-claim_uid-{name}.json"))


def test_held_gpus_by_minor_and_index(tmp_path: Path) -> None:
    cp = tmp_path / "checkpoint.json"
    assert dra_claims.held_by_minor(cp) == {}  # no DRA plugin on the node: nothing held
    _prepare(cp, "whole", "gpu-3")
    _prepare(cp, "mig", "gpu-0-mig-3g20gb-9-4", "gpu-0-mig-1g5gb-19-0")
    _prepare(cp, "other", "gpu-0-mig-1g5gb-19-1")
    assert dra_claims.held_by_minor(cp) == {0: ("team-a/mig", "team-a/other"),
                                            3: ("team-a/whole",)}
    # minors are not indices: GPU 3's minor is 7 here; a minor no GPU has holds nothing
    assert dra_claims.held_by_index(cp, {0: 0, 7: 3}) == {0: ("team-a/mig", "team-a/other")}


def test_nvidias_and_an_earlier_gpukits_checkpoint_beside_it_hold_gpus_too(
        tmp_path: Path) -> None:
    """checkpoint.json beside gpukit's file: NVIDIA's completed claims (not taken over yet)
    hold their GPUs as gpukit's do; so do an earlier gpukit's, not moved yet."""
    own, beside = tmp_path / "gpukit-checkpoint.json", tmp_path / "checkpoint.json"
    _prepare(own, "whole", "gpu-3")
    beside.write_text(render({"uid-n": claim([group(gpu("uid-n", "gpu-1-mig-1g5gb-19-0",
                                                        "MIG-x", "node-1"))],
                                             allocation("node-1", ("gpu", "gpu-0")), name="n")}))
    assert dra_claims.held_by_minor(own) == {1: ("ns/n (NVIDIA's DRA driver)",),
                                             3: ("team-a/whole",)}
    beside.unlink()
    _prepare(beside, "earlier", "gpu-2")
    assert dra_claims.held_by_minor(own) == {2: ("team-a/earlier",), 3: ("team-a/whole",)}
    beside.write_text("{cut")
    with pytest.raises(CheckpointError, match=r"checkpoint\.json: not a checkpoint"):
        dra_claims.held_by_minor(own)


def test_a_checkpoint_that_cannot_be_trusted_is_refused_by_name(tmp_path: Path) -> None:
    cp = tmp_path / "checkpoint.json"
    _prepare(cp, "whole", "gpu-3")
    doc = json.loads(cp.read_text())
    doc["claims"]["uid-whole"]["name"] = "edited"
    cp.write_text(json.dumps(doc))
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        dra_claims.held_by_minor(cp)


def test_apply_refuses_a_gpu_a_claim_holds_unless_forced(a100: MockNode) -> None:
    a100.make(0, [("3g.20gb", 0)])
    before = a100.layout()
    only0 = schema.parse(ONLY0)
    with pytest.raises(ClaimsHeld, match=r"GPU 0: claim team-a/c1.*apply with force"):
        apply(only0, "x", a100.backend, a100.reset, claims={0: ["team-a/c1"]})
    assert a100.layout() == before
    # a claim on a GPU that does not change blocks nothing
    r = apply(only0, "x", a100.backend, a100.reset, claims={5: ["team-a/c2"]})
    assert r.changed and a100.layout() != before


def test_forced_apply_changes_a_held_gpu(a100: MockNode) -> None:
    a100.make(0, [("3g.20gb", 0)])
    r = apply(schema.parse(ONLY0), "x", a100.backend, a100.reset, force=True,
              claims={0: ["team-a/c1"]})
    assert r.executed[0].text() == "GPU 0: create GPU instance 3g.20gb at slice 4"


def test_cli_reads_the_dra_checkpoint(a100: MockNode, tmp_path: Path) -> None:
    a100.make(0, [("3g.20gb", 0)])
    c = tmp_path / "one.json"
    c.write_text(json.dumps(ONLY0))
    cp = tmp_path / "dra" / "checkpoint.json"
    _prepare(cp, "c1", "gpu-0-mig-3g20gb-9-0")  # the mock's GPU 0 has minor 0
    args = ["--configs-json", str(c), "--selected", "x", "--pause-file", str(tmp_path / "p"),
            "--state-file", str(tmp_path / "st"), "--dra-checkpoint", str(cp)]
    rc, doc = cli_json(["apply", *args], a100.env)
    assert rc == 1 and doc["failed"] is True
    assert "prepared DRA claims hold GPUs that must change (GPU 0: claim team-a/c1)" in doc["msg"]
    assert json.loads((tmp_path / "st").read_text())["state"] == "failed"
    Checkpoint(cp).remove("uid-c1")  # the claim's pod is gone: NodeUnprepareResources
    rc, doc = cli_json(["apply", *args], a100.env)
    assert rc == 0 and doc["changed"] is True, doc
