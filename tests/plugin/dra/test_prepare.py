"""Prepare/unprepare: CDI spec per claim, checkpoint, idempotence, restart, errors that name
node, claim, expected and observed; and the kubelet's gRPC over real unix sockets."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import grpc
import pytest
from plugin_testlib import make_gpu, make_inventory

from gpukit.plugin.api import dra_grpc, dra_pb2, registration_grpc, registration_pb2
from gpukit.plugin.dra.checkpoint import Checkpoint, CheckpointError
from gpukit.plugin.dra.prepare import ClaimRef, PrepareError, Preparer
from gpukit.plugin.dra.server import DraServer
from gpukit.plugin.dra.slice_devices import Placement, node_slice_devices

NODE = "gpu-node"
UID = "0b6a3c1e-1111-2222-3333-444444444444"
COMMON = {"env": ["NVIDIA_VISIBLE_DEVICES=void"],
          "deviceNodes": [{"path": "/dev/nvidiactl", "hostPath": "/dev/nvidiactl"}]}


def claim(devices: list[tuple[str, str]], uid: str = UID, pool: str = NODE,
          config: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    results = [{"request": r, "driver": "gpu.nvidia.com", "pool": pool, "device": d}
               for r, d in devices]
    return {"metadata": {"namespace": "ns", "name": "c", "uid": uid},
            "status": {"allocation": {"devices": {"results": results,
                                                  "config": config or []}}}}


class Api:
    def __init__(self, doc: Mapping[str, Any]) -> None:
        self.doc = doc
        self.reads = 0

    def __call__(self, namespace: str, name: str) -> Mapping[str, Any]:
        self.reads += 1
        return self.doc


def preparer(tmp_path: Path, api: Api, checkpoint: Checkpoint | None = None) -> Preparer:
    gpu = make_gpu(1, migs=("3g.20gb",))
    node = make_inventory([make_gpu(0), gpu])
    devices = {d.name: d for d in node_slice_devices(node, {(gpu.uuid, 1): Placement(0, 4)})}
    return Preparer(NODE, api, lambda: devices, lambda: COMMON,
                    checkpoint or Checkpoint(tmp_path / "plugin" / "checkpoint.json"),
                    str(tmp_path / "cdi"), "/")


REF = ClaimRef("ns", "c", UID)


def spec_path(tmp_path: Path) -> Path:
    return tmp_path / "cdi" / f"k8s.gpu.nvidia.com-claim_{UID}.json"


def test_prepare_writes_the_claims_cdi_spec_and_checkpoints_it(tmp_path: Path) -> None:
    api = Api(claim([("gpu", "gpu-0"), ("mig", "gpu-1-mig-3g20gb-9-0")]))
    p = preparer(tmp_path, api)
    prepared = p.prepare(REF)
    assert [(d.device, d.cdi_device_ids) for d in prepared.devices] == [
        ("gpu-0", (f"k8s.gpu.nvidia.com/claim={UID}-gpu-0",)),
        ("gpu-1-mig-3g20gb-9-0", (f"k8s.gpu.nvidia.com/claim={UID}-gpu-1-mig-3g20gb-9-0",))]
    spec = json.loads(spec_path(tmp_path).read_text())
    assert spec["kind"] == "k8s.gpu.nvidia.com/claim"
    assert spec["containerEdits"] == COMMON
    nodes = {d["name"]: [n["path"] for n in d["containerEdits"]["deviceNodes"]]
             for d in spec["devices"]}
    assert nodes == {f"{UID}-gpu-0": ["/dev/nvidia0"],
                     f"{UID}-gpu-1-mig-3g20gb-9-0": ["/dev/nvidia1"]}
    assert Checkpoint(tmp_path / "plugin" / "checkpoint.json").get(UID) == prepared


def test_prepare_twice_and_after_a_restart_reads_nothing_and_returns_the_same(
        tmp_path: Path) -> None:
    api = Api(claim([("gpu", "gpu-0")]))
    first = preparer(tmp_path, api).prepare(REF)
    assert preparer(tmp_path, api).prepare(REF) == first  # a new agent on the same node
    assert api.reads == 1


def test_unprepare_removes_spec_and_entry_and_is_idempotent(tmp_path: Path) -> None:
    p = preparer(tmp_path, Api(claim([("gpu", "gpu-0")])))
    p.prepare(REF)
    assert p.unprepare(REF) is True
    assert not spec_path(tmp_path).exists()
    assert p.checkpoint.get(UID) is None
    assert p.unprepare(REF) is False


def test_a_lost_spec_file_is_written_again(tmp_path: Path) -> None:
    api = Api(claim([("gpu", "gpu-0")]))
    p = preparer(tmp_path, api)
    p.prepare(REF)
    spec_path(tmp_path).unlink()
    p.prepare(REF)
    assert spec_path(tmp_path).is_file() and api.reads == 2


@pytest.mark.parametrize(("doc", "message"), [
    (claim([("gpu", "gpu-0")], uid="other"),
     f"claim ns/c (uid {UID}): the API has UID 'other'"),
    ({"metadata": {"uid": UID}, "status": {}},
     f"claim ns/c (uid {UID}): expected an allocation in its status, found none"),
    (claim([("gpu", "gpu-0")], pool="other-node"),
     "expected devices of driver gpu.nvidia.com in pool gpu-node, the allocation has "
     "['gpu.nvidia.com/other-node/gpu-0']"),
    (claim([("gpu", "gpu-7")]),
     "device gpu-7 (request gpu) is not among node gpu-node's devices now: gpu-0, "
     "gpu-1-mig-3g20gb-9-0"),
    (claim([("gpu", "gpu-0")], config=[{"source": "FromClaim", "opaque": {
        "driver": "gpu.nvidia.com", "parameters": {
            "apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig"}}}]),
     "request gpu, device gpu-0: a MigDeviceConfig cannot configure a whole GPU"),
])
def test_errors_name_claim_expected_and_observed_and_change_nothing(
        tmp_path: Path, doc: dict[str, Any], message: str) -> None:
    p = preparer(tmp_path, Api(doc))
    with pytest.raises(PrepareError) as err:
        p.prepare(REF)
    assert message in str(err.value)
    assert not (tmp_path / "cdi").exists() or not any((tmp_path / "cdi").iterdir())
    assert p.checkpoint.all() == {}


def test_time_slicing_config_reaches_the_devices_env(tmp_path: Path) -> None:
    cfg = [{"source": "FromClaim", "requests": ["gpu"], "opaque": {
        "driver": "gpu.nvidia.com", "parameters": {
            "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
            "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}}}}}]
    preparer(tmp_path, Api(claim([("gpu", "gpu-0")], config=cfg))).prepare(REF)
    spec = json.loads(spec_path(tmp_path).read_text())
    assert spec["devices"][0]["containerEdits"]["env"] == [
        "GPUKIT_DRA_SHARING_STRATEGY=TimeSlicing", "GPUKIT_DRA_TIMESLICE_INTERVAL=Short"]


def test_a_changed_checkpoint_is_refused_by_name(tmp_path: Path) -> None:
    p = preparer(tmp_path, Api(claim([("gpu", "gpu-0")])))
    p.prepare(REF)
    path = tmp_path / "plugin" / "checkpoint.json"
    path.write_text(path.read_text().replace("gpu-0", "gpu-1"))
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        Checkpoint(path)


def test_the_kubelets_grpc_calls_over_unix_sockets(short_tmp: Path, tmp_path: Path) -> None:
    p = preparer(tmp_path, Api(claim([("gpu", "gpu-0")])))
    server = DraServer(p, short_tmp / "plugins" / "dra.sock", short_tmp / "reg" / "r.sock")
    server.start()
    try:
        with grpc.insecure_channel(f"unix://{server.registration_socket}") as ch:
            reg = registration_grpc.RegistrationStub(ch)
            info = reg.GetInfo(registration_pb2.InfoRequest(), timeout=5)
            assert (info.type, info.name, info.endpoint, list(info.supported_versions)) == (
                "DRAPlugin", "gpu.nvidia.com", str(server.plugin_socket), ["v1.DRAPlugin"])
            reg.NotifyRegistrationStatus(registration_pb2.RegistrationStatus(
                plugin_registered=True), timeout=5)
            assert server.registration.registered.is_set()
        with grpc.insecure_channel(f"unix://{server.plugin_socket}") as ch:
            # The kubelet's method path, spelled out: the proto's package must be the kubelet's.
            prepare = ch.unary_unary(
                "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
                request_serializer=dra_pb2.NodePrepareResourcesRequest.SerializeToString,
                response_deserializer=dra_pb2.NodePrepareResourcesResponse.FromString)
            claims = [dra_pb2.Claim(namespace="ns", name="c", uid=UID),
                      dra_pb2.Claim(namespace="ns", name="gone", uid="u2")]
            resp = prepare(dra_pb2.NodePrepareResourcesRequest(claims=claims), timeout=5)
            ok = resp.claims[UID]
            assert ok.error == ""
            assert [(d.pool_name, d.device_name, list(d.request_names), list(d.cdi_device_ids))
                    for d in ok.devices] == [
                (NODE, "gpu-0", ["gpu"], [f"k8s.gpu.nvidia.com/claim={UID}-gpu-0"])]
            assert "the API has UID" in resp.claims["u2"].error
            stub = dra_grpc.DRAPluginStub(ch)
            un = stub.NodeUnprepareResources(dra_pb2.NodeUnprepareResourcesRequest(
                claims=claims[:1]), timeout=5)
            assert UID in un.claims and un.claims[UID].error == ""
        assert not spec_path(tmp_path).exists()
    finally:
        server.stop(0)
    assert not server.plugin_socket.exists() and not server.registration_socket.exists()


def test_claims_deleted_while_the_plugin_was_down_are_forgotten(tmp_path: Path) -> None:
    """An entry whose claim is gone from the API (or replaced under its name) is unprepared at
    start: its spec file and entry go; one the API cannot answer for is kept."""
    p = preparer(tmp_path, Api(claim([("gpu", "gpu-0")])))
    p.prepare(REF)
    other = ClaimRef("ns", "d", "uid-d")
    p.read_claim = lambda ns, name: claim([("gpu", "gpu-0")], uid="uid-d")
    p.prepare(other)
    answers: dict[str, bool | None] = {UID: None, "uid-d": False}
    assert p.forget_gone(lambda ref: answers[ref.uid]) == [other]
    assert set(p.checkpoint.all()) == {UID} and spec_path(tmp_path).is_file()
    assert not (tmp_path / "cdi" / "k8s.gpu.nvidia.com-claim_uid-d.json").exists()
    answers[UID] = False
    assert p.forget_gone(lambda ref: answers[ref.uid]) == [REF]
    assert p.checkpoint.all() == {} and not spec_path(tmp_path).exists()


def test_one_shared_device_prepared_for_three_claims_and_unprepared_one_by_one(
        tmp_path: Path) -> None:
    """Consumable capacity: three claims' allocations name gpu-0, each with its shareID. Each
    claim gets its own spec file and CDI device on it and its checkpoint entry records its
    share; unpreparing one leaves the others' specs and entries as they were."""
    uids = [f"0b6a3c1e-1111-2222-3333-44444444444{i}" for i in range(3)]
    docs = {}
    for i, uid in enumerate(uids):
        doc = claim([("gpu", "gpu-0")], uid=uid)
        doc["metadata"]["name"] = f"c{i}"
        doc["status"]["allocation"]["devices"]["results"][0].update(
            shareID=f"share-{i}", consumedCapacity={"shares": "1", "memory": "13653Mi"})
        docs[f"c{i}"] = doc
    checkpoint = Checkpoint(tmp_path / "plugin" / "checkpoint.json")
    p = Preparer(NODE, lambda ns, name: docs[name], preparer(tmp_path, Api({})).devices,
                 lambda: COMMON, checkpoint, str(tmp_path / "cdi"), "/")
    refs = [ClaimRef("ns", f"c{i}", uid) for i, uid in enumerate(uids)]
    prepared = [p.prepare(ref) for ref in refs]
    assert [(c.devices[0].device, c.devices[0].share_ids, c.devices[0].cdi_device_ids)
            for c in prepared] == [
        ("gpu-0", (f"share-{i}",), (f"k8s.gpu.nvidia.com/claim={uid}-gpu-0",))
        for i, uid in enumerate(uids)]
    specs = sorted(f.name for f in (tmp_path / "cdi").iterdir())
    assert specs == sorted(f"k8s.gpu.nvidia.com-claim_{uid}.json" for uid in uids)
    for uid in uids:  # every claim's spec gives its container the same GPU
        spec = json.loads((tmp_path / "cdi" / f"k8s.gpu.nvidia.com-claim_{uid}.json").read_text())
        assert [n["path"] for n in spec["devices"][0]["containerEdits"]["deviceNodes"]] == \
            ["/dev/nvidia0"]
    assert p.unprepare(refs[1]) is True
    assert sorted(f.name for f in (tmp_path / "cdi").iterdir()) == [
        f"k8s.gpu.nvidia.com-claim_{uids[0]}.json", f"k8s.gpu.nvidia.com-claim_{uids[2]}.json"]
    reloaded = Checkpoint(tmp_path / "plugin" / "checkpoint.json").all()
    assert reloaded == {uids[0]: prepared[0], uids[2]: prepared[2]}  # shares survive a restart
    assert p.prepared_devices() == {"gpu-0"}  # still held: a MIG change must wait
    p.unprepare(refs[0])
    p.unprepare(refs[2])
    assert p.prepared_devices() == set() and not list((tmp_path / "cdi").iterdir())


def test_a_checkpoint_written_before_shares_loads(tmp_path: Path) -> None:
    p = preparer(tmp_path, Api(claim([("gpu", "gpu-0")])))
    p.prepare(REF)
    path = tmp_path / "plugin" / "checkpoint.json"
    doc = json.loads(path.read_text())
    for device in doc["claims"][UID]["devices"]:
        del device["share_ids"]
    doc["checksum"] = hashlib.sha256(json.dumps(doc["claims"], sort_keys=True).encode()
                                     ).hexdigest()
    path.write_text(json.dumps(doc))
    assert Checkpoint(path).get(UID).devices[0].share_ids == ()  # type: ignore[union-attr]
