"""After a reboot or plugin restart: every prepared claim's CDI spec is back before the plugin
registers with the kubelet (kubernetes#141433), from the checkpoint alone; a stale entry
(unreadable, its claim deleted) is quarantined by name, kept for inspection, and neither fails
the start nor blocks a later prepare; an entry whose device is not published now is kept (no
verdict on a running claim from a discovery alone)."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from dra_testlib import mig_and_whole_gpu_plugin

from gpukit.plugin.api import registration_grpc, registration_pb2
from gpukit.plugin.dra import kubelet_plugin as plugin_mod
from gpukit.plugin.dra.checkpoint import QUARANTINE_FILE, Checkpoint, read_quarantine
from gpukit.plugin.dra.kubelet_plugin import DraKubeletPlugin
from gpukit.plugin.dra.prepare import ClaimRef

TIME_SLICING = [{"source": "FromClaim", "requests": ["gpu"], "opaque": {
    "driver": "gpu.nvidia.com", "parameters": {
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}}}}]


def claim_doc(uid: str, device: str, config: list[Any] | None = None) -> dict[str, Any]:
    return {"metadata": {"uid": uid}, "status": {"allocation": {"devices": {
        "results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n1",
                     "device": device}], "config": config or []}}}}


def names(plugin: DraKubeletPlugin) -> tuple[str, str]:
    """(the whole GPU's device name, the MIG device's)."""
    found = sorted(plugin.devices())
    return (next(n for n in found if "mig" not in n), next(n for n in found if "mig" in n))


def new_plugin(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> DraKubeletPlugin:
    """A plugin (no NVML, no API, no MPS daemons) whose start() runs for real up to its gRPC
    sockets; `seen` gets the CDI spec directory as it is when the sockets are about to be
    served, i.e. before the kubelet can register the plugin."""
    plugin = mig_and_whole_gpu_plugin(short_tmp, monkeypatch)
    plugin.preparer.mps = None
    plugin.health_enabled = False
    monkeypatch.setattr(plugin_mod.nvml, "init", lambda: None)
    monkeypatch.setattr(plugin_mod.nvml, "shutdown", lambda: None)
    monkeypatch.setattr(plugin.publisher, "watch_changes", lambda *args: None)
    monkeypatch.setattr(plugin, "_claim_exists", lambda ref: True)
    return plugin


def serve_recording(plugin: DraKubeletPlugin, cdi: Path, monkeypatch: pytest.MonkeyPatch
                    ) -> list[dict[str, str]]:
    seen: list[dict[str, str]] = []
    real = plugin.server.start

    def start() -> None:
        seen.append({f.name: f.read_text() for f in sorted(cdi.iterdir())}
                    if cdi.is_dir() else {})
        real()
    monkeypatch.setattr(plugin.server, "start", start)
    return seen


@pytest.fixture
def started() -> Iterator[list[DraKubeletPlugin]]:
    plugins: list[DraKubeletPlugin] = []
    yield plugins
    for p in plugins:
        p.stop()


def test_specs_deleted_or_changed_are_back_before_the_plugin_registers(
        short_tmp: Path, monkeypatch: pytest.MonkeyPatch, started: list[DraKubeletPlugin]
) -> None:
    cdi = short_tmp / "cdi"
    first = new_plugin(short_tmp, monkeypatch)
    first.rescan()
    whole, mig = names(first)
    docs = {"a": claim_doc("uid-a", whole, TIME_SLICING), "b": claim_doc("uid-b", mig)}
    first.preparer.read_claim = lambda ns, name: docs[name]
    first.preparer.prepare(ClaimRef("ns", "a", "uid-a"))
    first.preparer.prepare(ClaimRef("ns", "b", "uid-b"))
    specs = {f.name: f.read_text() for f in cdi.iterdir()}
    assert len(specs) == 2 and "GPUKIT_DRA_TIMESLICE_INTERVAL=Long" in "".join(specs.values())
    # The reboot: /var/run/cdi is empty again, but for one spec left half-written.
    for f in cdi.iterdir():
        f.unlink()
    spec_b = cdi / "k8s.gpu.nvidia.com-claim_uid-b.json"
    spec_b.write_text('{"cdiVersion": "0.6.0"}')

    second = new_plugin(short_tmp, monkeypatch)

    def no_api(ns: str, name: str) -> Any:
        raise AssertionError("a restore must not need the API")
    second.preparer.read_claim = no_api
    seen = serve_recording(second, cdi, monkeypatch)
    second.start()
    started.append(second)
    assert seen == [specs]  # every spec whole, before the registration socket existed
    assert set(second.checkpoint.all()) == {"uid-a", "uid-b"}
    with grpc.insecure_channel(f"unix://{second.server.registration_socket}") as ch:
        info = registration_grpc.RegistrationStub(ch).GetInfo(registration_pb2.InfoRequest(),
                                                              timeout=5)
    assert info.name == "gpu.nvidia.com"
    # A spec that is there and right is left alone.
    assert second.restore_claims() == {"uid-a": "present", "uid-b": "present"}


def test_an_earlier_gpukits_entry_gets_its_spec_from_the_api(
        short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An entry written before the checkpoint recorded each device's edits: its missing spec
    is rebuilt from the claim as the API has it (sharing env included), and the entry then
    records the edits; one whose spec is there is kept as it is."""
    plugin = new_plugin(short_tmp, monkeypatch)
    plugin.rescan()
    whole, _ = names(plugin)
    plugin.preparer.read_claim = lambda ns, name: claim_doc("uid-a", whole, TIME_SLICING)
    plugin.preparer.prepare(ClaimRef("ns", "a", "uid-a"))
    spec = short_tmp / "cdi" / "k8s.gpu.nvidia.com-claim_uid-a.json"
    want = json.loads(spec.read_text())
    path = short_tmp / "plugin" / "gpukit-checkpoint.json"
    doc = json.loads(path.read_text())
    for d in doc["claims"]["uid-a"]["devices"]:
        del d["edits"]
    doc["checksum"] = hashlib.sha256(json.dumps(doc["claims"], sort_keys=True).encode()
                                     ).hexdigest()
    path.write_text(json.dumps(doc))
    again = new_plugin(short_tmp, monkeypatch)
    again.rescan()
    assert again.checkpoint.get("uid-a").devices[0].edits is None  # type: ignore[union-attr]
    assert again.restore_claims() == {
        "uid-a": "present (recorded by an earlier gpukit: kept as it is)"}
    spec.unlink()
    reads: list[str] = []
    again.preparer.read_claim = lambda ns, name: reads.append(name) or claim_doc(  # type: ignore[func-returns-value]
        "uid-a", whole, TIME_SLICING)
    assert again.restore_claims() == {"uid-a": "rewritten (it was missing)"}
    assert reads == ["a"] and json.loads(spec.read_text()) == want
    edits = Checkpoint(path).get("uid-a").devices[0].edits  # type: ignore[union-attr]
    assert edits == {
        "env": ["GPUKIT_DRA_SHARING_STRATEGY=TimeSlicing", "GPUKIT_DRA_TIMESLICE_INTERVAL=Long"],
        "mounts": [{"hostPath": str(short_tmp / "plugin/dra-device-metadata/ns_a/gpu/metadata.json"),
                    "containerPath": "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/"
                                     "a/gpu/gpu.nvidia.com-metadata.json",
                    "options": ["ro", "bind"]}]}


def write_checkpoint(path: Path, claims: dict[str, Any]) -> None:
    """A checkpoint file with a valid checksum holding these raw entries."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"version": 1, "claims": claims, "checksum": hashlib.sha256(
        json.dumps(claims, sort_keys=True).encode()).hexdigest()}))


def test_stale_entries_are_quarantined_by_name_and_block_nothing(
        short_tmp: Path, monkeypatch: pytest.MonkeyPatch, started: list[DraKubeletPlugin],
        caplog: pytest.LogCaptureFixture) -> None:
    probe = new_plugin(short_tmp / "probe", monkeypatch)
    probe.rescan()
    whole, mig = names(probe)

    def entry(uid: str, name: str, device: str) -> dict[str, Any]:
        return {"uid": uid, "namespace": "team", "name": name, "spec_file":
                f"k8s.gpu.nvidia.com-claim_{uid}.json", "devices": [{
                    "requests": ["gpu"], "pool": "n1", "device": device,
                    "cdi_device_ids": [f"k8s.gpu.nvidia.com/claim={uid}-{device}"],
                    "share_ids": [], "edits": {}}]}
    broken = entry("uid-broken", "broken", whole)
    del broken["devices"]
    checkpoint = short_tmp / "plugin" / "gpukit-checkpoint.json"
    write_checkpoint(checkpoint, {
        "uid-live": entry("uid-live", "live", whole),
        "uid-moved": entry("uid-moved", "moved", "gpu-7"),  # its GPU is gone from the node
        "uid-broken": broken,  # this agent cannot read it
        "uid-deleted": entry("uid-deleted", "deleted", mig)})
    with pytest.raises(Exception, match="uid-broken"):  # a strict reader refuses the file
        Checkpoint(checkpoint)

    plugin = new_plugin(short_tmp, monkeypatch)
    monkeypatch.setattr(plugin, "_claim_exists", lambda ref: ref.uid != "uid-deleted")
    seen = serve_recording(plugin, short_tmp / "cdi", monkeypatch)
    with caplog.at_level(logging.WARNING, logger="gpukit.plugin.dra.checkpoint"):
        plugin.start()
    started.append(plugin)
    # The live claim's and the deleted claim's specs were restored before registering; the
    # deleted one's went with its unprepare once the API said it was gone.
    assert sorted(seen[0]) == ["k8s.gpu.nvidia.com-claim_uid-deleted.json",
                               "k8s.gpu.nvidia.com-claim_uid-live.json"]
    assert sorted(f.name for f in (short_tmp / "cdi").iterdir()) == [
        "k8s.gpu.nvidia.com-claim_uid-live.json"]
    # The claim whose GPU is not published now keeps its entry (its GPU stays held).
    assert set(plugin.checkpoint.all()) == {"uid-live", "uid-moved"}
    assert set(Checkpoint(checkpoint).all()) == {"uid-live", "uid-moved"}  # strict: trusted
    kept = {e["uid"]: e for e in read_quarantine(short_tmp / "plugin" / QUARANTINE_FILE)}
    assert set(kept) == {"uid-broken", "uid-deleted"}
    assert "entry unreadable (KeyError: 'devices')" in kept["uid-broken"]["reason"]
    assert "gone from the API" in kept["uid-deleted"]["reason"]
    assert kept["uid-broken"]["entry"] == broken  # as it was, for inspection
    lines = [r.getMessage() for r in caplog.records if "quarantined" in r.getMessage()]
    assert sorted(lines) == sorted([
        f"claim team/broken (uid uid-broken): checkpoint entry quarantined: "
        f"{kept['uid-broken']['reason']} (kept in {short_tmp}/plugin/{QUARANTINE_FILE})",
        f"claim team/deleted (uid uid-deleted): checkpoint entry quarantined: "
        f"{kept['uid-deleted']['reason']} (kept in {short_tmp}/plugin/{QUARANTINE_FILE})"])
    # A quarantined claim the kubelet asks for again is prepared as any new one.
    plugin.preparer.read_claim = lambda ns, name: claim_doc("uid-broken", mig)
    assert plugin.preparer.prepare(ClaimRef("team", "broken", "uid-broken")).devices[0].device \
        == mig
    assert set(Checkpoint(checkpoint).all()) == {"uid-live", "uid-moved", "uid-broken"}


def test_the_quarantine_keeps_the_newest_and_a_bad_file_is_moved_aside(tmp_path: Path) -> None:
    from gpukit.plugin.dra import checkpoint as cp_mod
    from gpukit.plugin.dra.checkpoint import PreparedClaim

    quarantine = tmp_path / QUARANTINE_FILE
    quarantine.write_text("not json")
    cp = Checkpoint(tmp_path / "gpukit-checkpoint.json")
    for i in range(cp_mod.QUARANTINE_KEEP + 2):
        cp.put(PreparedClaim(f"u{i}", "ns", f"c{i}", (), "f"))
        assert cp.quarantine(f"u{i}", "test")
    assert not cp.quarantine("u0", "again")  # nothing left to move
    kept = read_quarantine(quarantine)
    assert [e["uid"] for e in kept] == [f"u{i}" for i in range(2, cp_mod.QUARANTINE_KEEP + 2)]
    assert (tmp_path / f"{QUARANTINE_FILE}.unreadable").read_text() == "not json"
    assert cp.all() == {}


def test_a_discovery_that_finds_nothing_quarantines_nothing(
        short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No device at all is likelier a failed discovery than every GPU gone: the entries stay
    (their claims still hold the GPUs for the MIG manager), said in the answer."""
    plugin = new_plugin(short_tmp, monkeypatch)
    plugin.rescan()
    whole, _ = names(plugin)
    plugin.preparer.read_claim = lambda ns, name: claim_doc("uid-a", whole)
    plugin.preparer.prepare(ClaimRef("ns", "a", "uid-a"))
    plugin.preparer.devices = lambda: {}
    assert plugin.preparer.restore_specs() == {
        "uid-a": f"not restored: device(s) {whole} not among node n1's devices now: none"}
    assert set(plugin.checkpoint.all()) == {"uid-a"}
    assert not (short_tmp / "plugin" / QUARANTINE_FILE).exists()
