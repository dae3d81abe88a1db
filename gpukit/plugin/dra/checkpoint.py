"""Prepared claims, kept on the node in one JSON file so an agent restart neither forgets a
claim (its CDI spec would outlive it) nor prepares it twice.

Written atomically (temporary file, fsync, rename) after every change, with a checksum over
the claims: a file that does not match it is refused by name rather than trusted.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

VERSION = 1


class CheckpointError(RuntimeError):
    """The checkpoint file exists but cannot be trusted."""


@dataclass(frozen=True)
class PreparedDevice:
    requests: tuple[str, ...]
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...]
    # The allocation's shareIDs of a shared device (consumable capacity): several claims hold
    # it, each prepared and unprepared on its own. Empty for a device not shared.
    share_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class PreparedClaim:
    uid: str
    namespace: str
    name: str
    devices: tuple[PreparedDevice, ...]
    spec_file: str  # the claim's CDI spec, removed on unprepare

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["devices"] = [asdict(d) for d in self.devices]
        return doc

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> PreparedClaim:
        devices = tuple(PreparedDevice(tuple(d["requests"]), d["pool"], d["device"],
                                       tuple(d["cdi_device_ids"]), tuple(d.get("share_ids", ())))
                        for d in doc["devices"])  # fmt: skip
        return cls(doc["uid"], doc["namespace"], doc["name"], devices, doc["spec_file"])


def _checksum(claims: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(claims, sort_keys=True).encode()).hexdigest()


class Checkpoint:
    """The prepared claims by UID, mirrored to `path` on every change (thread-safe)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._claims = self._load()

    def _load(self) -> dict[str, PreparedClaim]:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        try:
            doc = json.loads(text)
            claims = doc["claims"]
            if doc.get("version") != VERSION:
                raise CheckpointError(f"{self.path}: version {doc.get('version')!r}, this agent "
                                      f"reads {VERSION}")
            if doc.get("checksum") != _checksum(claims):
                raise CheckpointError(f"{self.path}: checksum mismatch (the file was changed "
                                      "or cut short)")
            return {uid: PreparedClaim.from_json(c) for uid, c in claims.items()}
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{self.path}: not a checkpoint of prepared claims: "
                                  f"{exc}") from exc

    def get(self, uid: str) -> PreparedClaim | None:
        with self._lock:
            return self._claims.get(uid)

    def all(self) -> dict[str, PreparedClaim]:
        with self._lock:
            return dict(self._claims)

    def put(self, claim: PreparedClaim) -> None:
        with self._lock:
            self._claims[claim.uid] = claim
            self._write()

    def remove(self, uid: str) -> bool:
        with self._lock:
            if uid not in self._claims:
                return False
            del self._claims[uid]
            self._write()
            return True

    def _write(self) -> None:
        claims = {uid: c.to_json() for uid, c in sorted(self._claims.items())}
        doc = {"version": VERSION, "checksum": _checksum(claims), "claims": claims}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.",
                                   suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(doc, fh, indent=1, sort_keys=True)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
