"""DRA device metadata (KEP-5304): each prepared request's file, read back by the upstream
decoder (k8s.io/dynamic-resource-allocation's devicemetadata, validation on), its CDI mount at
the path a workload reads, removed on unprepare, written again after a restart."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from metadata_reader import read
from test_prepare import NODE, UID, Api, claim, preparer

from gpukit.contracts import dra_metadata
from gpukit.plugin.dra.checkpoint import Checkpoint
from gpukit.plugin.dra.prepare import ClaimRef, Preparer

MIG = "gpu-1-mig-3g20gb-9-0"
ROOT = "/var/run/kubernetes.io/dra-device-attributes"


def with_metadata(tmp_path: Path, api: Api) -> Preparer:
    p = preparer(tmp_path, api)
    p.metadata_dir = str(tmp_path / "plugin" / dra_metadata.HOST_SUBDIR)
    return p


def mounts(tmp_path: Path) -> dict[str, list[dict[str, Any]]]:
    spec = json.loads((tmp_path / "cdi" / f"k8s.gpu.nvidia.com-claim_{UID}.json").read_text())
    return {d["name"].removeprefix(f"{UID}-"): d["containerEdits"].get("mounts", [])
            for d in spec["devices"]}  # fmt: skip


def test_each_request_gets_a_file_the_upstream_decoder_reads(tmp_path: Path) -> None:
    doc = claim([("gpu", "gpu-0"), ("mig/small", MIG)])
    p = with_metadata(tmp_path, Api(doc))
    p.prepare(ClaimRef("ns", "c", UID))
    host = tmp_path / "plugin" / "dra-device-metadata" / "ns_c"
    files = {r: host / r / "metadata.json" for r in ("gpu", "mig")}  # the base request
    assert mounts(tmp_path) == {
        "gpu-0": [{"hostPath": str(files["gpu"]), "options": ["ro", "bind"],
                   "containerPath": f"{ROOT}/resourceclaims/c/gpu/gpu.nvidia.com-metadata.json"}],
        MIG: [{"hostPath": str(files["mig"]), "options": ["ro", "bind"],
               "containerPath": f"{ROOT}/resourceclaims/c/mig/gpu.nvidia.com-metadata.json"}],
    }  # fmt: skip
    # Newest version first, then the 1.36 one, one object per line.
    assert [json.loads(line)["apiVersion"] for line in files["gpu"].read_text().splitlines()] \
        == ["metadata.resource.k8s.io/v1beta1", "metadata.resource.k8s.io/v1alpha1"]
    assert oct(files["gpu"].stat().st_mode & 0o777) == "0o644"
    published = p.devices()
    gpu, mig = read(files["gpu"], files["mig"])
    for seen, request, device in ((gpu, "gpu", "gpu-0"), (mig, "mig/small", MIG)):
        assert seen.get("error") is None and seen.get("invalid") is None, seen
        assert seen["decoded"] == "metadata.resource.k8s.io/v1beta1, Kind=DeviceMetadata"
        m = seen["metadata"]
        assert (m["metadata"]["name"], m["metadata"]["namespace"], m["metadata"]["uid"]) \
            == ("c", "ns", UID)
        assert "podClaimName" not in m
        [req] = m["requests"]
        assert req["name"] == request
        [dev] = req["devices"]
        assert (dev["driver"], dev["pool"], dev["name"]) == ("gpu.nvidia.com", NODE, device)
        assert dev["attributes"] == published[device].body["attributes"]
        assert dev["attributes"]["uuid"] == {"string": published[device].unit.uuid}


def test_a_template_claim_is_found_under_the_pods_name_for_it(tmp_path: Path) -> None:
    doc = claim([("gpu", "gpu-0")])
    doc["metadata"]["annotations"] = {"resource.kubernetes.io/pod-claim-name": "my-gpu"}
    with_metadata(tmp_path, Api(doc)).prepare(ClaimRef("ns", "c", UID))
    [mount] = mounts(tmp_path)["gpu-0"]
    assert mount["containerPath"] == \
        f"{ROOT}/resourceclaimtemplates/my-gpu/gpu/gpu.nvidia.com-metadata.json"
    [seen] = read(Path(mount["hostPath"]))
    assert seen["metadata"]["podClaimName"] == "my-gpu" and "invalid" not in seen


def test_unprepare_removes_the_claims_files(tmp_path: Path) -> None:
    p = with_metadata(tmp_path, Api(claim([("gpu", "gpu-0")])))
    p.prepare(ClaimRef("ns", "c", UID))
    claim_dir = tmp_path / "plugin" / "dra-device-metadata" / "ns_c"
    assert claim_dir.is_dir()
    assert p.unprepare(ClaimRef("ns", "c", UID))
    assert not claim_dir.exists()


def test_a_lost_file_is_written_again_before_the_plugin_registers(tmp_path: Path) -> None:
    """The spec binds the file: without it the container could not start after a restart."""
    api = Api(claim([("gpu", "gpu-0")]))
    p = with_metadata(tmp_path, api)
    p.prepare(ClaimRef("ns", "c", UID))
    [mount] = mounts(tmp_path)["gpu-0"]
    text = Path(mount["hostPath"]).read_text()
    os.unlink(mount["hostPath"])
    again = with_metadata(tmp_path, api)
    reads = api.reads
    assert again.restore_specs() == {UID: "present"}
    assert Path(mount["hostPath"]).read_text() == text and api.reads == reads + 1
    assert again.restore_specs() == {UID: "present"} and api.reads == reads + 1


def test_a_file_that_cannot_be_written_prepares_nothing(tmp_path: Path) -> None:
    p = with_metadata(tmp_path, Api(claim([("gpu", "gpu-0")])))
    Path(p.metadata_dir).parent.mkdir(parents=True)
    Path(p.metadata_dir).write_text("a file where the directory goes")
    with pytest.raises(OSError):
        p.prepare(ClaimRef("ns", "c", UID))
    assert not (tmp_path / "cdi" / f"k8s.gpu.nvidia.com-claim_{UID}.json").exists()
    assert Checkpoint(tmp_path / "plugin" / "checkpoint.json").get(UID) is None
