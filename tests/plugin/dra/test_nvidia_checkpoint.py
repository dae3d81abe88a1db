"""gpukit's DRA plugin on a node NVIDIA's DRA driver (or an earlier gpukit) served: its own
state in its own file beside NVIDIA's checkpoint.json, an earlier gpukit's checkpoint.json moved
there with its claims, NVIDIA's completed claims taken over where provably safe, the others
refused by name with NVIDIA's file and their CDI specs left as they are; never a failed start
for NVIDIA's file. Fixtures: NVIDIA's format from its schema (tests/nvidia_dra_fixtures.py)."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

import pytest
from nvidia_dra_fixtures import allocation, claim, gpu, group, mig, render
from plugin_testlib import make_gpu, make_inventory

from gpukit.contracts import dra_checkpoint as nv
from gpukit.plugin.dra import nvidia_claims
from gpukit.plugin.dra.checkpoint import (
    Checkpoint,
    CheckpointError,
    PreparedClaim,
    PreparedDevice,
    open_checkpoint,
)
from gpukit.plugin.dra.prepare import ClaimRef, PrepareError, Preparer
from gpukit.plugin.dra.slice_devices import Placement, SliceDevice, node_slice_devices

NODE = "gpu-node"
BOOT = "boot-1"
GPU0, GPU1 = make_gpu(0), make_gpu(1, migs=("3g.20gb",))
MIG = "gpu-1-mig-3g20gb-9-0"
UID_A, UID_B, UID_C = "uid-a", "uid-b", "uid-c"


@pytest.fixture
def devices() -> dict[str, SliceDevice]:
    node = make_inventory([GPU0, GPU1])
    return {d.name: d for d in node_slice_devices(node, {(GPU1.uuid, 1): Placement(0, 4)})}


@pytest.fixture
def plugin_dir(tmp_path: Path) -> Path:
    d = tmp_path / "plugins" / "gpu.nvidia.com"
    d.mkdir(parents=True)
    return d


def whole_gpu_claim(uid: str = UID_A, name: str = "a", **kw: Any) -> dict[str, Any]:
    return claim([group(gpu(uid, "gpu-0", GPU0.uuid, NODE))], allocation(NODE, ("gpu", "gpu-0")),
                 name=name, **kw)


def mig_claim(uid: str = UID_B, name: str = "b", mps: str = "") -> dict[str, Any]:
    return claim([group(mig(uid, MIG, GPU1.mig_devices[0].uuid, GPU1.uuid, NODE, parent_minor=1),
                        mps_daemon=mps)],
                 allocation(NODE, ("mig", MIG)), name=name)


def take(plugin_dir: Path, devices: dict[str, SliceDevice], boot: str = BOOT
         ) -> tuple[nvidia_claims.Takeover, Checkpoint]:
    cp = open_checkpoint(plugin_dir)
    return nvidia_claims.take_over(plugin_dir, cp, NODE, devices, lambda: boot), cp


# -- gpukit's own file, and an earlier gpukit's ------------------------------------------------


def legacy_claim(uid: str = "uid-old") -> PreparedClaim:
    return PreparedClaim(uid, "ns", "old", (PreparedDevice(("gpu",), NODE, "gpu-0", (
        f"k8s.gpu.nvidia.com/claim={uid}-gpu-0",)),), f"k8s.gpu.nvidia.com-claim_{uid}.json")


def test_gpukit_keeps_its_state_in_its_own_file_beside_nvidias(plugin_dir: Path) -> None:
    cp = open_checkpoint(plugin_dir)
    cp.put(legacy_claim())
    assert sorted(p.name for p in plugin_dir.iterdir()) == ["gpukit-checkpoint.json"]
    assert open_checkpoint(plugin_dir).all() == {"uid-old": legacy_claim()}


def test_an_earlier_gpukits_checkpoint_is_moved_with_its_claims(plugin_dir: Path) -> None:
    """A node upgraded from the previous gpukit: its checkpoint.json (gpukit's format) becomes
    gpukit-checkpoint.json with the same claims, and checkpoint.json is gone, so NVIDIA's
    plugin, run here later, never meets gpukit's format."""
    Checkpoint(plugin_dir / "checkpoint.json").put(legacy_claim())
    cp = open_checkpoint(plugin_dir)
    assert cp.all() == {"uid-old": legacy_claim()}
    assert sorted(p.name for p in plugin_dir.iterdir()) == ["gpukit-checkpoint.json"]
    assert Checkpoint(plugin_dir / "gpukit-checkpoint.json").all() == {"uid-old": legacy_claim()}


def test_a_move_cut_short_ends_at_the_next_start_and_the_later_file_wins(
        plugin_dir: Path) -> None:
    own, legacy = plugin_dir / "gpukit-checkpoint.json", plugin_dir / "checkpoint.json"
    Checkpoint(legacy).put(legacy_claim())
    Checkpoint(own).put(legacy_claim())  # written, then the process died before the unlink
    os.utime(legacy, ns=(1, 1))
    assert open_checkpoint(plugin_dir).all() == {"uid-old": legacy_claim()}
    assert not legacy.exists()
    # An earlier gpukit ran again after this one: its file is the node's state now.
    Checkpoint(legacy).put(legacy_claim("uid-new"))
    os.utime(own, ns=(1, 1))
    assert set(open_checkpoint(plugin_dir).all()) == {"uid-new"}


def test_an_earlier_gpukits_changed_checkpoint_is_refused_not_moved(plugin_dir: Path) -> None:
    legacy = plugin_dir / "checkpoint.json"
    Checkpoint(legacy).put(legacy_claim())
    legacy.write_text(legacy.read_text().replace("gpu-0", "gpu-1"))
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        open_checkpoint(plugin_dir)
    assert legacy.exists() and not (plugin_dir / "gpukit-checkpoint.json").exists()


# -- NVIDIA's checkpoint ---------------------------------------------------------------------------


def test_nvidias_safe_claims_are_taken_over_and_its_file_moved_aside(
        plugin_dir: Path, devices: dict[str, SliceDevice]) -> None:
    (plugin_dir / "checkpoint.json").write_text(render({
        UID_A: whole_gpu_claim(), UID_B: mig_claim()}, boot_id=BOOT))
    found, cp = take(plugin_dir, devices)
    assert (found.refused, found.file_problem) == ({}, "")
    assert cp.all() == {
        UID_A: PreparedClaim(UID_A, "ns", "a", (PreparedDevice(
            ("gpu",), NODE, "gpu-0", (f"k8s.gpu.nvidia.com/claim={UID_A}-gpu-0",)),),
            f"k8s.gpu.nvidia.com-claim_{UID_A}.yaml"),
        UID_B: PreparedClaim(UID_B, "ns", "b", (PreparedDevice(
            ("mig",), NODE, MIG, (f"k8s.gpu.nvidia.com/claim={UID_B}-{MIG}",)),),
            f"k8s.gpu.nvidia.com-claim_{UID_B}.yaml")}
    assert sorted(p.name for p in plugin_dir.iterdir()) == [
        "checkpoint.json.taken-over-by-gpukit", "cp.lock", "gpukit-checkpoint.json"]
    taken, refused = found.summary()
    assert taken.startswith("took over 2 claim(s) NVIDIA's DRA driver prepared: ns/a (uid "
                            "uid-a: gpu-0); ns/b") and refused == ""
    # Restarted: nothing of NVIDIA's left to take; the claims stay gpukit's.
    again, cp = take(plugin_dir, devices)
    assert again == nvidia_claims.Takeover() and set(cp.all()) == {UID_A, UID_B}


def test_a_taken_over_claim_is_served_and_unprepared_as_gpukits(
        plugin_dir: Path, devices: dict[str, SliceDevice], tmp_path: Path) -> None:
    """Its CDI spec stays NVIDIA's (running containers keep what they got): prepare answers
    with the recorded devices without reading the API, unprepare removes NVIDIA's spec."""
    (plugin_dir / "checkpoint.json").write_text(render({UID_A: whole_gpu_claim()}, BOOT))
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    (cdi / f"k8s.gpu.nvidia.com-claim_{UID_A}.yaml").write_text("cdiVersion: 0.5.0\n")
    _, cp = take(plugin_dir, devices)
    p = Preparer(NODE, lambda ns, n: pytest.fail("no API read for a prepared claim"),
                 lambda: devices, dict, cp, str(cdi), "/")
    ref = ClaimRef("ns", "a", UID_A)
    assert [d.cdi_device_ids for d in p.prepare(ref).devices] == [
        (f"k8s.gpu.nvidia.com/claim={UID_A}-gpu-0",)]
    assert p.unprepare(ref) is True
    assert not list(cdi.iterdir()) and cp.all() == {}


@pytest.mark.parametrize(("entry", "why"), [
    (whole_gpu_claim(state=nv.PREPARE_STARTED),
     "claim ns/a (uid uid-a): NVIDIA's plugin did not finish preparing it (PrepareStarted)"),
    (mig_claim(UID_A, "a", mps="mps-1"),
     "shares its GPUs through NVIDIA's MPS control daemon(s) mps-1, which gpukit does not run"),
    (claim([group(gpu(UID_A, "gpu-0", "GPU-other", NODE))], allocation(NODE, ("gpu", "gpu-0")),
           name="a"),
     f"device gpu-0 is GPU-other in NVIDIA's checkpoint, {GPU0.uuid} on this node now"),
    (claim([group(gpu(UID_A, "gpu-7", GPU0.uuid, NODE))], allocation(NODE, ("gpu", "gpu-7")),
           name="a"),
     "device gpu-7 is not among this node's devices now: gpu-0, gpu-1-mig-3g20gb-9-0"),
    (claim([group(gpu(UID_A, "gpu-0", GPU0.uuid, "other-node"))],
           allocation("other-node", ("gpu", "gpu-0")), name="a"),
     "device gpu-0 is of pool 'other-node', this node's pool is 'gpu-node'"),
    (claim([group(gpu(UID_A, "gpu-0", GPU0.uuid, NODE, cdi_ids=["nvidia.com/gpu=0"]))],
           allocation(NODE, ("gpu", "gpu-0")), name="a"),
     "device gpu-0 has CDI devices ['nvidia.com/gpu=0'], gpukit's would be"),
    (claim([group(gpu(UID_A, "gpu-0", GPU0.uuid, NODE))],
           allocation(NODE, ("gpu", "gpu-0"), ("gpu", "gpu-1-mig-3g20gb-9-0")), name="a"),
     "its allocation names ['gpu-0', 'gpu-1-mig-3g20gb-9-0'], NVIDIA prepared ['gpu-0']"),
    (claim([group(gpu(UID_A, "gpu-0", GPU0.uuid, NODE))], allocation(
        NODE, ("gpu", "gpu-0"), config=[{"source": "FromClaim", "requests": ["gpu"], "opaque": {
            "driver": "gpu.nvidia.com", "parameters": {
                "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
                "sharing": {"strategy": "MPS"}}}}]), name="a"),
     "request gpu shares through MPS, whose daemon NVIDIA's driver runs"),
    (claim([group({"gpu": None, "mig": None, "vfio": {"info": {}, "device": {
        "Requests": ["gpu"], "PoolName": NODE, "DeviceName": "gpu-0", "CDIDeviceIDs": []}}})],
        allocation(NODE, ("gpu", "gpu-0")), name="a"),
     "device gpu-0 is a VFIO passthrough device"),
    (claim([group(gpu(UID_A, "gpu-0", GPU0.uuid, NODE))], allocation(NODE, ("gpu", "gpu-0")),
           name="", namespace=""),
     "its entry records no name and namespace"),
])
def test_a_claim_that_cannot_be_proven_safe_is_refused_by_name_and_left_intact(
        plugin_dir: Path, devices: dict[str, SliceDevice], tmp_path: Path,
        entry: dict[str, Any], why: str) -> None:
    text = render({UID_A: entry, UID_C: whole_gpu_claim(UID_C, "c")}, BOOT)
    (plugin_dir / "checkpoint.json").write_text(text)
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    spec = cdi / f"k8s.gpu.nvidia.com-claim_{UID_A}.yaml"
    spec.write_text("cdiVersion: 0.5.0\n")
    found, cp = take(plugin_dir, devices)
    assert why in found.refused[UID_A]
    assert set(found.refused) == {UID_A} and [c.uid for c in found.taken] == [UID_C]
    assert (plugin_dir / "checkpoint.json").read_text() == text  # NVIDIA's file untouched
    assert set(cp.all()) == {UID_C} and cp.taken_over() == {UID_C}
    refused_line = found.summary()[1]
    assert refused_line.startswith("1 claim(s) NVIDIA's DRA driver prepared are not taken over")
    assert why in refused_line
    # The kubelet's prepare and unprepare of it answer why; its spec stays NVIDIA's.
    p = Preparer(NODE, lambda ns, n: pytest.fail("not read"), lambda: devices, dict, cp,
                 str(cdi), "/", not_taken=dict(found.refused))
    ref = ClaimRef("ns", "a", UID_A)
    for call in (p.prepare, p.unprepare):
        with pytest.raises(PrepareError, match="not taken over by gpukit"):
            call(ref)
    assert spec.read_text() == "cdiVersion: 0.5.0\n"
    # A later start does not take the claim taken over before again, even once unprepared.
    cp.remove(UID_C)
    again, cp = take(plugin_dir, devices)
    assert again.taken == () and set(again.refused) == {UID_A} and cp.all() == {}


@pytest.mark.parametrize(("text", "problem"), [
    ("{cut", "neither NVIDIA's checkpoint nor gpukit's"),
    (render({UID_A: whole_gpu_claim()}, BOOT).replace("gpu-0", "gpu-1"),
     "checksum \\d+ does not match its content"),
])
def test_an_nvidia_file_gpukit_cannot_trust_is_refused_whole_and_its_claims_left(
        plugin_dir: Path, devices: dict[str, SliceDevice], tmp_path: Path, text: str,
        problem: str) -> None:
    (plugin_dir / "checkpoint.json").write_text(text)
    found, cp = take(plugin_dir, devices)  # no exception: the plugin starts
    assert found.taken == () and cp.all() == {}
    assert (plugin_dir / "checkpoint.json").read_text() == text
    line = found.summary()[1]
    assert line.startswith("NVIDIA's DRA checkpoint not taken over, left as it is: ")
    assert re.search(problem, line)
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    (cdi / f"k8s.gpu.nvidia.com-claim_{UID_A}.yaml").write_text("x")
    p = Preparer(NODE, lambda ns, n: pytest.fail("not read"), lambda: devices, dict, cp,
                 str(cdi), "/", nvidia_problem=found.file_problem)
    with pytest.raises(PrepareError, match=r"its CDI spec .* is there.*not taken over"):
        p.prepare(ClaimRef("ns", "a", UID_A))


def test_an_nvidia_file_of_an_earlier_boot_holds_nothing_prepared(
        plugin_dir: Path, devices: dict[str, SliceDevice]) -> None:
    text = render({UID_A: whole_gpu_claim()}, boot_id="boot-0")
    (plugin_dir / "checkpoint.json").write_text(text)
    found, cp = take(plugin_dir, devices)
    assert found == nvidia_claims.Takeover() and cp.all() == {}
    assert (plugin_dir / "checkpoint.json").read_text() == text


def test_nvidias_lock_held_is_a_refusal_not_a_hang(plugin_dir: Path,
                                                   devices: dict[str, SliceDevice]) -> None:
    import fcntl

    (plugin_dir / "checkpoint.json").write_text(render({UID_A: whole_gpu_claim()}, BOOT))
    with open(plugin_dir / "cp.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        cp = open_checkpoint(plugin_dir)
        # another open file description: flock conflicts with it as with NVIDIA's process
        found = nvidia_claims.take_over(plugin_dir, cp, NODE, devices, lambda: BOOT,
                                         lock_timeout=0.3)
    assert found.taken == () and "cp.lock held by another process" in found.file_problem


def test_the_plugin_takes_over_at_start_and_says_so_in_its_log_and_node_events(
        plugin_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Start order: the devices discovered, NVIDIA's claims taken over or refused, then the
    kubelet's sockets; one log line and one Event on the node for each outcome."""
    from gpukit.plugin.dra import kubelet_plugin as plugin_mod
    from gpukit.plugin.dra.kubelet_plugin import DraKubeletPlugin, KubeletPluginOptions

    node = make_inventory([GPU0, GPU1])
    monkeypatch.setattr(plugin_mod.nvml, "discover", lambda with_topology: node)
    monkeypatch.setattr(plugin_mod, "placements",
                        lambda devices, reader: {(GPU1.uuid, 1): Placement(0, 4)})
    events: list[tuple[str, dict[str, Any]]] = []

    class Core:
        def __init__(self, api_client: object) -> None:
            pass

        def create_namespaced_event(self, namespace: str, body: dict[str, Any]) -> None:
            events.append((namespace, body))

    monkeypatch.setattr(plugin_mod.client, "CoreV1Api", Core)
    (plugin_dir / "checkpoint.json").write_text(render({
        UID_A: whole_gpu_claim(), UID_B: mig_claim(mps="mps-b")}, nvidia_claims.current_boot_id()))
    a = DraKubeletPlugin(KubeletPluginOptions(node=NODE, plugin_dir=str(plugin_dir),
                                              cdi_dir=str(plugin_dir / "cdi"), shares=0),
                         api_client=object())
    a.publisher.sync = lambda bodies: None  # type: ignore[method-assign]
    a.rescan()
    caplog.set_level(logging.INFO)
    found = a.take_over_nvidias_claims()
    assert [c.uid for c in found.taken] == [UID_A] and set(a.preparer.not_taken) == {UID_B}
    assert set(a.checkpoint.all()) == {UID_A}
    lines = [r.getMessage() for r in caplog.records if "NVIDIA's DRA driver" in r.getMessage()]
    assert len(lines) == 2 and "mps-b" in lines[1]
    assert [(ns, e["reason"], e["type"], e["involvedObject"]["name"]) for ns, e in events] == [
        ("default", "NvidiaClaimsTakenOver", "Normal", NODE),
        ("default", "NvidiaClaimsNotTakenOver", "Warning", NODE)]
    assert events[1][1]["message"] == lines[1][:1024]
