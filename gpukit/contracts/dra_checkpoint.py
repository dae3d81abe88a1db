"""NVIDIA's DRA driver checkpoint: the prepared claims its GPU kubelet plugin keeps in
`/var/lib/kubelet/plugins/gpu.nvidia.com/checkpoint.json` (k8s-dra-driver-gpu,
cmd/gpu-kubelet-plugin; read from its main of 2026-05-15), and its integrity rule.

The file is the kubelet's checkpointmanager JSON, encoded as Go's encoding/json does (struct
fields in declaration order, map keys sorted, no spaces), holding both versions of the claims:

    {"checksum": <v1 checksum>,
     "v1": {"preparedClaims": {<uid>: {"status": ..., "preparedDevices": [...]}}},
     "v2": {"checksum": <v2 checksum>,
            "preparedClaims": {<uid>: {"checkpointState": "PrepareStarted"|"PrepareCompleted",
                                       "status": <the claim's ResourceClaimStatus>,
                                       "preparedDevices": [...], "name": ..., "namespace": ...}},
            "nodeBootID": <the kernel's boot_id when the plugin last started>}}

`preparedDevices` is a list of groups `{"devices": [...], "configState":
{"mpsControlDaemonID": ...}}`; each device is `{"gpu": {"info": {"uuid"}, "device": D},
"mig": null}`, `{"gpu": null, "mig": {"concrete": {"parentMinor", "giId", "ciId", "migUUID",
"parentUUID", "parentPCIBusID"}, "device": D}}` or `{"vfio": {"info", "device": D}, ...}`, with
D the kubelet plugin library's Device: `{"Requests", "PoolName", "DeviceName", "CDIDeviceIDs",
"ShareID"?, "Metadata"?}`. v1 lists only the completed claims, without name and namespace
(files of NVIDIA's releases before v2 hold v1 alone).

Checksums (the kubelet's checkpointmanager/checksum): FNV-1a 32-bit over the bytes Go's
`%#v` of go-spew prints for the encoded JSON (`([]uint8)[123 34 ...]`); v1's over the file
without `v2` and with `checksum` 0, v2's over `v2` with its own `checksum` 0. A file whose
checksums do not match is what NVIDIA's plugin refuses too (CorruptCheckpointError).

Parsing here decides nothing: `parse` returns what the file says, or NvidiaCheckpointError
naming what is wrong; what a claim holds that gpukit may not understand is listed per claim.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpukit.contracts.dra import CDI_CLASS, CDI_VENDOR, CHECKPOINT_FILE

FILE = CHECKPOINT_FILE  # in the plugin's directory (gpukit.contracts.dra.PLUGIN_DIR)
LOCK_FILE = "cp.lock"  # flock(2)ed, exclusive, around every read and write of FILE
CHECKSUM = "checksum"
V1, V2 = "v1", "v2"
VERSIONS = (V1, V2)
PREPARED_CLAIMS = "preparedClaims"
NODE_BOOT_ID = "nodeBootID"
PREPARE_STARTED = "PrepareStarted"
PREPARE_COMPLETED = "PrepareCompleted"
CLAIM_FIELDS = ("checkpointState", "status", "preparedDevices", "name", "namespace")
V1_CLAIM_FIELDS = ("status", "preparedDevices")
GROUP_FIELDS = ("devices", "configState")
# Device kinds of a prepared device, and what identifies the device each kind names.
GPU, MIG, VFIO = "gpu", "mig", "vfio"
DEVICE_KINDS = (GPU, MIG, VFIO)
DEVICE_FIELDS = ("Requests", "PoolName", "DeviceName", "CDIDeviceIDs", "ShareID", "Metadata")
MPS_DAEMON_ID = "mpsControlDaemonID"
# Where the kernel says which boot this is (nodeBootID).
BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"


def spec_file(claim_uid: str) -> str:
    """A claim's CDI spec as NVIDIA's plugin names it (CDI's transient spec name, YAML), in
    the CDI spec directory: k8s.gpu.nvidia.com-claim_<uid>.yaml."""
    return f"{CDI_VENDOR}-{CDI_CLASS}_{claim_uid.replace('/', '_')}.yaml"


class NvidiaCheckpointError(ValueError):
    """The file is not NVIDIA's checkpoint, or not an intact one; the message says why."""


@dataclass(frozen=True)
class NvidiaDevice:
    kind: str  # gpu | mig | vfio
    uuid: str  # the GPU's, or the MIG device's (concrete.migUUID); "" for vfio
    requests: tuple[str, ...]
    pool: str
    device: str  # the ResourceSlice device name
    cdi_device_ids: tuple[str, ...]
    share_id: str = ""  # consumable capacity: the allocation's shareID


@dataclass(frozen=True)
class NvidiaClaim:
    uid: str
    state: str  # PrepareStarted | PrepareCompleted (v1 entries are completed)
    namespace: str  # "" in a v1 entry
    name: str
    status: Mapping[str, Any]  # the claim's status when prepared (allocation, configs)
    devices: tuple[NvidiaDevice, ...]
    mps_daemons: tuple[str, ...] = ()  # MPS control daemons NVIDIA's driver started for it
    unknown: tuple[str, ...] = ()  # what the entry holds that this reading does not know

    def __str__(self) -> str:
        who = f"{self.namespace}/{self.name}" if self.name else "(name not recorded)"
        return f"claim {who} (uid {self.uid})"


@dataclass(frozen=True)
class NvidiaCheckpoint:
    version: str  # the newest version the file holds: v2, or v1 for older releases' files
    boot_id: str  # "" when not recorded
    claims: Mapping[str, NvidiaClaim]

    def completed(self) -> dict[str, NvidiaClaim]:
        return {uid: c for uid, c in self.claims.items() if c.state == PREPARE_COMPLETED}


def looks_like_nvidia(doc: object) -> bool:
    """The shape of NVIDIA's file (an integer checksum beside v1/v2), intact or not."""
    return (isinstance(doc, dict) and isinstance(doc.get(CHECKSUM), int)
            and any(k in doc for k in VERSIONS))  # fmt: skip


def go_json(value: Any) -> bytes:
    """`value` encoded as Go's json.Marshal encodes it, key order as given (a decoded file
    keeps the order Go wrote): compact, UTF-8, with Go's HTML-safe escapes."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    for raw, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                         ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):  # fmt: skip
        text = text.replace(raw, escaped)
    return text.encode()


def checksum(encoded: bytes) -> int:
    """The kubelet checkpointmanager's checksum of the encoded JSON bytes."""
    printed = ("([]uint8)[" + " ".join(str(b) for b in encoded) + "]").encode()
    h = 0x811C9DC5
    for b in printed:
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h


def v1_checksum(doc: Mapping[str, Any]) -> int:
    body = {k: (0 if k == CHECKSUM else v) for k, v in doc.items() if k != V2}
    return checksum(go_json(body))


def v2_checksum(v2: Mapping[str, Any]) -> int:
    return checksum(go_json({k: (0 if k == CHECKSUM else v) for k, v in v2.items()}))


def parse(text: str, where: str = FILE) -> NvidiaCheckpoint:
    """NVIDIA's checkpoint from the file's text; NvidiaCheckpointError naming `where` and the
    problem when it is not one, not intact, or of a version this reading does not know."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise NvidiaCheckpointError(f"{where}: not JSON: {exc}") from exc
    if not looks_like_nvidia(doc):
        raise NvidiaCheckpointError(f"{where}: not NVIDIA's DRA checkpoint (expected an "
                                    f"integer {CHECKSUM!r} and {V1!r} or {V2!r})")
    unknown = sorted(set(doc) - {CHECKSUM, *VERSIONS})
    if unknown:
        raise NvidiaCheckpointError(f"{where}: unknown key(s) {', '.join(unknown)}: this "
                                    f"reading knows {CHECKSUM}, {', '.join(VERSIONS)}")
    if v1_checksum(doc) != doc[CHECKSUM]:
        raise NvidiaCheckpointError(f"{where}: checksum {doc[CHECKSUM]} does not match its "
                                    "content (changed or cut short)")
    v2 = doc.get(V2)
    if v2 is not None:
        if not isinstance(v2, dict) or not isinstance(v2.get(CHECKSUM), int):
            raise NvidiaCheckpointError(f"{where}: {V2}: expected an object with an integer "
                                        f"{CHECKSUM}, found {_short(v2)}")
        if v2_checksum(v2) != v2[CHECKSUM]:
            raise NvidiaCheckpointError(f"{where}: {V2}.checksum {v2[CHECKSUM]} does not match "
                                        "its content (changed or cut short)")
        extra = sorted(set(v2) - {CHECKSUM, PREPARED_CLAIMS, NODE_BOOT_ID})
        if extra:
            raise NvidiaCheckpointError(f"{where}: {V2}: unknown key(s) {', '.join(extra)}")
        claims = _claims(where, V2, v2.get(PREPARED_CLAIMS), CLAIM_FIELDS)
        return NvidiaCheckpoint(V2, _string(where, f"{V2}.{NODE_BOOT_ID}",
                                            v2.get(NODE_BOOT_ID)), claims)
    v1 = doc.get(V1) or {}
    if not isinstance(v1, dict) or set(v1) - {PREPARED_CLAIMS}:
        raise NvidiaCheckpointError(f"{where}: {V1}: expected {{{PREPARED_CLAIMS!r}: ...}}, "
                                    f"found {_short(v1)}")
    return NvidiaCheckpoint(V1, "", _claims(where, V1, v1.get(PREPARED_CLAIMS), V1_CLAIM_FIELDS))


def _short(value: object) -> str:
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _string(where: str, field: str, value: object) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise NvidiaCheckpointError(f"{where}: {field}: expected a string, found {_short(value)}")
    return value


def _strings(where: str, field: str, value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise NvidiaCheckpointError(f"{where}: {field}: expected a list of strings, found "
                                    f"{_short(value)}")
    return tuple(value)


def _object(where: str, field: str, value: object) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise NvidiaCheckpointError(f"{where}: {field}: expected an object, found "
                                    f"{_short(value)}")
    return value


def _claims(where: str, version: str, value: object, fields: Sequence[str]
            ) -> dict[str, NvidiaClaim]:
    if value is None:
        return {}
    out: dict[str, NvidiaClaim] = {}
    for uid, entry in _object(where, f"{version}.{PREPARED_CLAIMS}", value).items():
        at = f"{version}.{PREPARED_CLAIMS}[{uid}]"
        entry = _object(where, at, entry)
        unknown = [f"field {k}" for k in sorted(set(entry) - set(fields))]
        state = (_string(where, f"{at}.checkpointState", entry.get("checkpointState"))
                 if version == V2 else PREPARE_COMPLETED)
        if state not in (PREPARE_STARTED, PREPARE_COMPLETED):
            unknown.append(f"checkpointState {state!r}")
        devices: list[NvidiaDevice] = []
        daemons: list[str] = []
        groups = entry.get("preparedDevices") or []
        if not isinstance(groups, list):
            raise NvidiaCheckpointError(f"{where}: {at}.preparedDevices: expected a list, "
                                        f"found {_short(groups)}")
        for g, group in enumerate(groups):
            gat = f"{at}.preparedDevices[{g}]"
            group = _object(where, gat, group)
            unknown += [f"field {k} of group {g}" for k in sorted(set(group) - set(GROUP_FIELDS))]
            config = group.get("configState") or {}
            daemon = _string(where, f"{gat}.configState.{MPS_DAEMON_ID}",
                             _object(where, f"{gat}.configState", config).get(MPS_DAEMON_ID))
            if daemon:
                daemons.append(daemon)
            for d, device in enumerate(group.get("devices") or []):
                parsed, problems = _device(where, f"{gat}.devices[{d}]", device)
                devices += parsed
                unknown += problems
        out[uid] = NvidiaClaim(
            uid=uid, state=state,
            namespace=_string(where, f"{at}.namespace", entry.get("namespace")),
            name=_string(where, f"{at}.name", entry.get("name")),
            status=_object(where, f"{at}.status", entry.get("status") or {}),
            devices=tuple(devices), mps_daemons=tuple(daemons), unknown=tuple(unknown))
    return out


def _device(where: str, at: str, value: object) -> tuple[list[NvidiaDevice], list[str]]:
    entry = _object(where, at, value)
    present = {k: v for k, v in entry.items() if v is not None}
    unknown = [f"device kind {k!r}" for k in sorted(set(present) - set(DEVICE_KINDS))]
    kinds = [k for k in DEVICE_KINDS if k in present]
    if len(kinds) != 1:
        return [], [*unknown, f"a device that is {' and '.join(kinds) or 'none'} of "
                              f"{', '.join(DEVICE_KINDS)}"]
    kind = kinds[0]
    body = _object(where, f"{at}.{kind}", present[kind])
    kubelet = _object(where, f"{at}.{kind}.device", body.get("device"))
    unknown += [f"field {k} of device {kubelet.get('DeviceName')!r}"
                for k in sorted(set(kubelet) - set(DEVICE_FIELDS))]
    if kind == GPU:
        uuid = _string(where, f"{at}.gpu.info.uuid",
                       _object(where, f"{at}.gpu.info", body.get("info")).get("uuid"))
    elif kind == MIG:
        uuid = _string(where, f"{at}.mig.concrete.migUUID",
                       _object(where, f"{at}.mig.concrete", body.get("concrete")).get("migUUID"))
    else:
        uuid = ""
    dat = f"{at}.{kind}.device"
    return [NvidiaDevice(
        kind=kind, uuid=uuid, requests=_strings(where, f"{dat}.Requests", kubelet.get("Requests")),
        pool=_string(where, f"{dat}.PoolName", kubelet.get("PoolName")),
        device=_string(where, f"{dat}.DeviceName", kubelet.get("DeviceName")),
        cdi_device_ids=_strings(where, f"{dat}.CDIDeviceIDs", kubelet.get("CDIDeviceIDs")),
        share_id=_string(where, f"{dat}.ShareID", kubelet.get("ShareID")))], unknown
