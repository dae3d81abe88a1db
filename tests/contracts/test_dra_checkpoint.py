"""NVIDIA's DRA checkpoint (gpukit.contracts.dra_checkpoint): its checksums as the kubelet's
checkpointmanager computes them, both versions read, and every way a file is not one (or not
intact) named."""

from __future__ import annotations

import json

import pytest
from nvidia_dra_fixtures import allocation, claim, gpu, group, mig, render

from gpukit.contracts import dra_checkpoint as nv

NODE = "gpu-t4"


def test_the_checksums_are_the_ones_nvidias_plugin_writes() -> None:
    """This content (written here from the schema) is what NVIDIA's plugin wrote for the same
    claims, byte for byte, checksums 3212861975 (v1) and 4271166753 (v2): checked once against
    its code (Checkpoint.MarshalCheckpoint / VerifyChecksum of NVIDIA/k8s-dra-driver-gpu main
    of 2026-05-15), which also verified other files of this writer and refused a changed one."""
    text = render({
        "uid-a": claim([group(gpu("uid-a", "gpu-0", "GPU-0", "n1", share_id="share-1"))],
                       allocation("n1", ("gpu", "gpu-0")), name="a", namespace="ns<&>"),
        "uid-b": claim([group(mig("uid-b", "gpu-1-mig-1g5gb-19-0", "MIG-1", "GPU-1", "n1",
                                  parent_minor=1, gi=2, ci=0), mps_daemon="mps-x")], {},
                       name="b", state=nv.PREPARE_STARTED),
    }, boot_id="boot-1")
    doc = json.loads(text)
    assert (doc["checksum"], doc["v2"]["checksum"]) == (3212861975, 4271166753)
    assert '"namespace":"ns\\u003c\\u0026\\u003e"' in text and '"status":{}' in text
    assert text.startswith('{"checksum":3212861975,"v1":{"preparedClaims":{"uid-a":{"status":')
    # FNV-1a 32 over what go-spew's %#v prints for the bytes: "([]uint8)[123 125]" for "{}".
    assert nv.checksum(b"{}") == 0x5CE93F30


def test_go_json_escapes_as_go_does() -> None:
    assert nv.go_json({"a": "<&>", "b": [1, None], "c": "é\u2028"}) == \
        b'{"a":"\\u003c\\u0026\\u003e","b":[1,null],"c":"\xc3\xa9\\u2028"}'


def test_a_v2_file_reads_with_its_claims_devices_and_boot() -> None:
    text = render({
        "uid-a": claim([group(gpu("uid-a", "gpu-0", "GPU-0", NODE, share_id="s1"))],
                       allocation(NODE, ("gpu", "gpu-0")), name="a"),
        "uid-b": claim([group(mig("uid-b", "gpu-1-mig-1g5gb-19-0", "MIG-1", "GPU-1", NODE),
                              mps_daemon="mps-b")],
                       allocation(NODE, ("mig", "gpu-1-mig-1g5gb-19-0")), name="b"),
        "uid-c": claim([], {}, name="c", state=nv.PREPARE_STARTED),
    }, boot_id="boot-1")
    cp = nv.parse(text)
    assert (cp.version, cp.boot_id, sorted(cp.claims)) == ("v2", "boot-1",
                                                          ["uid-a", "uid-b", "uid-c"])
    a, b, c = (cp.claims[u] for u in ("uid-a", "uid-b", "uid-c"))
    assert (str(a), a.state, a.mps_daemons, a.unknown) == (
        "claim ns/a (uid uid-a)", nv.PREPARE_COMPLETED, (), ())
    assert a.devices == (nv.NvidiaDevice("gpu", "GPU-0", ("gpu",), NODE, "gpu-0",
                                         ("k8s.gpu.nvidia.com/claim=uid-a-gpu-0",), "s1"),)
    assert a.status["allocation"]["devices"]["results"][0]["device"] == "gpu-0"
    assert (b.devices[0].kind, b.devices[0].uuid, b.mps_daemons) == ("mig", "MIG-1", ("mps-b",))
    assert c.state == nv.PREPARE_STARTED and c.devices == ()
    assert sorted(cp.completed()) == ["uid-a", "uid-b"]


def test_a_v1_file_of_older_releases_reads_without_names() -> None:
    text = render({"uid-a": claim([group(gpu("uid-a", "gpu-0", "GPU-0", NODE))],
                                  allocation(NODE, ("gpu", "gpu-0")))}, v1_only=True)
    assert "v2" not in json.loads(text)
    cp = nv.parse(text)
    a = cp.claims["uid-a"]
    assert (cp.version, a.state, a.name, a.namespace, str(a)) == (
        "v1", nv.PREPARE_COMPLETED, "", "", "claim (name not recorded) (uid uid-a)")


def test_what_a_claim_holds_that_this_reading_does_not_know_is_listed_per_claim() -> None:
    weird = gpu("uid-a", "gpu-0", "GPU-0", NODE)
    weird["gpu"]["device"]["Future"] = 1
    vfio = {"gpu": None, "mig": None, "vfio": {"info": {}, "device": {"DeviceName": "gpu-1"}}}
    both = {**gpu("uid-b", "gpu-0", "GPU-0", NODE), "mig": {"concrete": {}, "device": {}}}
    text = render({"uid-a": claim([group(weird)], {}),
                   "uid-b": claim([group(both)], {}),
                   "uid-c": claim([group(vfio)], {})})
    cp = nv.parse(text)
    assert cp.claims["uid-a"].unknown == ("field Future of device 'gpu-0'",)
    assert cp.claims["uid-b"].unknown == ("a device that is gpu and mig of gpu, mig, vfio",)
    assert cp.claims["uid-c"].devices[0].kind == "vfio" and cp.claims["uid-c"].unknown == ()


@pytest.mark.parametrize(("mangle", "message"), [
    (lambda t: t[:-5], "checkpoint.json: not JSON"),
    (lambda t: '{"claims": {}, "version": 1}', "not NVIDIA's DRA checkpoint"),
    (lambda t: t.replace('"gpu-0"', '"gpu-1"'), "checkpoint.json: checksum \\d+ does not match"),
    (lambda t: t.replace('"checksum":', '"extra":1,"checksum":', 1),
     "unknown key\\(s\\) extra"),
])
def test_a_file_that_is_not_an_intact_checkpoint_is_refused_by_name(mangle: object,
                                                                    message: str) -> None:
    text = render({"uid-a": claim([group(gpu("uid-a", "gpu-0", "GPU-0", NODE))],
                                  allocation(NODE, ("gpu", "gpu-0")))}, boot_id="b")
    assert callable(mangle)
    with pytest.raises(nv.NvidiaCheckpointError, match=message):
        nv.parse(mangle(text))


def test_a_changed_v2_alone_is_refused_by_its_own_checksum() -> None:
    text = render({}, boot_id="boot-1")
    doc = json.loads(text)
    doc["v2"]["nodeBootID"] = "boot-2"
    doc["checksum"] = nv.v1_checksum(doc)  # v1's still matches: v2 changed after it
    with pytest.raises(nv.NvidiaCheckpointError, match=r"v2\.checksum \d+ does not match"):
        nv.parse(nv.go_json(doc).decode())


def test_claim_spec_files_are_named_as_nvidias_plugin_names_them() -> None:
    assert nv.spec_file("0b6a-11") == "k8s.gpu.nvidia.com-claim_0b6a-11.yaml"
