"""Prepared claims, kept on the node in one JSON file so an agent restart neither forgets a
claim (its CDI spec would outlive it) nor prepares it twice.

Written atomically (temporary file, fsync, rename, the directory fsynced) after every change,
with a checksum over the claims: a file that does not match it is refused by name rather than
trusted. The file is gpukit's own, `gpukit-checkpoint.json` beside NVIDIA's `checkpoint.json`
(which NVIDIA's plugin, and only it, reads: gpukit.contracts.dra); `open_checkpoint` first moves
what an earlier gpukit wrote to `checkpoint.json` in this format to the own file, so a node
upgraded from it keeps its prepared claims. It also lists the claims of NVIDIA's checkpoint that
gpukit took over (`taken_over`, nvidia_claims.py), so a later start does not take them again.

A stale entry (its claim deleted in the API, or an entry this agent cannot read or whose spec
it cannot write; not one whose device is missing now, which stays) is quarantined: moved, with
why, to QUARANTINE_FILE beside the checkpoint (kept for inspection, the newest
QUARANTINE_KEEP), so it neither fails a start nor holds the node's GPUs (the MIG manager,
the switch back to the device plugin read only the checkpoint's `claims`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpukit.contracts.dra import CHECKPOINT_FILE, GPUKIT_CHECKPOINT_FILE

log = logging.getLogger(__name__)
VERSION = 1
QUARANTINE_FILE = "gpukit-checkpoint-quarantine.json"
QUARANTINE_KEEP = 64  # entries kept in it, the oldest dropped first


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
    # The device's own container edits beyond its /dev nodes (sharing env, MPS mounts), so a
    # start rewrites the claim's CDI spec from the checkpoint alone. None: not recorded (an
    # earlier gpukit's entry).
    edits: Mapping[str, list[Any]] | None = None
    # A dynamic MIG device's instances, created at prepare and destroyed at unprepare
    # (dynamic_mig.Carved.as_json: gpu, gpuUUID, gi, ci, uuid, profile, start). None: not one.
    instance: Mapping[str, Any] | None = None


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
                                       tuple(d["cdi_device_ids"]), tuple(d.get("share_ids", ())),
                                       _edits(d.get("edits")), _instance(d.get("instance")))
                        for d in doc["devices"])  # fmt: skip
        for key in ("uid", "namespace", "name", "spec_file"):
            if not isinstance(doc[key], str):
                raise TypeError(f"{key}: expected a string, found {doc[key]!r}")
        return cls(doc["uid"], doc["namespace"], doc["name"], devices, doc["spec_file"])

    def __str__(self) -> str:
        return f"claim {self.namespace}/{self.name} (uid {self.uid})"


def _edits(value: object) -> dict[str, list[Any]] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not all(isinstance(v, list) for v in value.values()):
        raise TypeError(f"edits: expected an object of lists, found {value!r}")
    return value


def _instance(value: object) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not all(
            isinstance(value.get(k), int) and not isinstance(value.get(k), bool)
            for k in ("gpu", "gi", "ci")):
        raise TypeError(f"instance: expected gpu, gi and ci ids, found {value!r}")
    return value


def describe_entry(uid: str, entry: object) -> str:
    """'claim namespace/name (uid U)' from a raw entry, as far as it says."""
    doc = entry if isinstance(entry, dict) else {}
    ns, name = doc.get("namespace"), doc.get("name")
    who = f"{ns}/{name}" if isinstance(ns, str) and isinstance(name, str) else "(name unknown)"
    return f"claim {who} (uid {uid})"


def _checksum(claims: dict[str, Any], taken_over: list[str] | None = None) -> str:
    """Over the claims (and, once there are any, the UIDs taken over from NVIDIA's file)."""
    body: Any = {"claims": claims, "taken_over": taken_over} if taken_over else claims
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def is_gpukit_format(doc: object) -> bool:
    """The shape of this module's file (whatever its version), not NVIDIA's."""
    return isinstance(doc, dict) and "claims" in doc and "version" in doc


class Checkpoint:
    """The prepared claims by UID, mirrored to `path` on every change (thread-safe).

    `strict`: an entry that cannot be read makes the whole file untrusted (CheckpointError;
    readers that must not guess: the MIG manager). Otherwise (the DRA plugin) such entries are
    kept aside, in `unreadable()`, written back as they were until `quarantine` moves them."""

    def __init__(self, path: Path, strict: bool = True) -> None:
        self.path = path
        self.strict = strict
        self._lock = threading.Lock()
        self._unreadable: dict[str, tuple[Any, str]] = {}  # uid -> (raw entry, why)
        self._claims, self._taken_over = self._load()

    def _load(self) -> tuple[dict[str, PreparedClaim], set[str]]:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}, set()
        try:
            doc = json.loads(text)
            claims = doc["claims"]
            taken = doc.get("taken_over") or []
            if doc.get("version") != VERSION:
                raise CheckpointError(f"{self.path}: version {doc.get('version')!r}, this agent "
                                      f"reads {VERSION}")
            if doc.get("checksum") != _checksum(claims, taken):
                raise CheckpointError(f"{self.path}: checksum mismatch (the file was changed "
                                      "or cut short)")
            if not all(isinstance(u, str) for u in taken):
                raise CheckpointError(f"{self.path}: taken_over: expected claim UIDs, found "
                                      f"{taken!r}")
            return self._entries(claims), set(taken)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CheckpointError(f"{self.path}: not a checkpoint of prepared claims: "
                                  f"{exc}") from exc

    def _entries(self, claims: dict[str, Any]) -> dict[str, PreparedClaim]:
        out = {}
        for uid, entry in claims.items():
            try:
                out[uid] = PreparedClaim.from_json(entry)
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                why = f"entry unreadable ({type(exc).__name__}: {exc})"
                if self.strict:
                    raise CheckpointError(f"{self.path}: {describe_entry(uid, entry)}: "
                                          f"{why}") from exc
                self._unreadable[uid] = (entry, why)
        return out

    def unreadable(self) -> dict[str, str]:
        """UID -> why, of the entries this agent cannot read (strict=False)."""
        with self._lock:
            return {uid: why for uid, (_, why) in self._unreadable.items()}

    def quarantine(self, uid: str, reason: str) -> bool:
        """Move the entry of `uid` (read or not) to QUARANTINE_FILE with `reason`, in that
        order: a crash between leaves it in both, and the next start moves it again. One
        warning names the claim and why. False when the checkpoint has no such entry."""
        with self._lock:
            if uid in self._claims:
                entry: Any = self._claims[uid].to_json()
            elif uid in self._unreadable:
                entry = self._unreadable[uid][0]
            else:
                return False
            where = self.path.with_name(QUARANTINE_FILE)
            kept = read_quarantine(where)
            kept.append({"uid": uid, "claim": describe_entry(uid, entry), "reason": reason,
                         "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                         "entry": entry})
            write_atomically(where, json.dumps({"version": VERSION,
                                                "entries": kept[-QUARANTINE_KEEP:]},
                                               indent=1, sort_keys=True))
            self._claims.pop(uid, None)
            self._unreadable.pop(uid, None)
            self._write()
        log.warning("%s: checkpoint entry quarantined: %s (kept in %s)",
                    describe_entry(uid, entry), reason, where)
        return True

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

    def taken_over(self) -> set[str]:
        """UIDs of NVIDIA's checkpoint's claims gpukit took over (nvidia_claims.py)."""
        with self._lock:
            return set(self._taken_over)

    def take_over(self, claims: Iterable[PreparedClaim], taken_over: Iterable[str]) -> None:
        """Record claims taken over from NVIDIA's checkpoint and the UIDs of all its claims
        gpukit took over so far, in one write."""
        with self._lock:
            for claim in claims:
                self._claims[claim.uid] = claim
            self._taken_over = set(taken_over)
            self._write()

    def replace(self, claims: Iterable[PreparedClaim], taken_over: Iterable[str] = ()) -> None:
        """Everything the file holds, in one write (a migration)."""
        with self._lock:
            self._claims = {c.uid: c for c in claims}
            self._taken_over = set(taken_over)
            self._write()

    def _write(self) -> None:
        # Unreadable entries go back as they were: only `quarantine` moves one.
        claims = {uid: entry for uid, (entry, _) in self._unreadable.items()}
        claims.update((uid, c.to_json()) for uid, c in self._claims.items())
        claims = dict(sorted(claims.items()))
        taken = sorted(self._taken_over)
        doc: dict[str, Any] = {"version": VERSION, "checksum": _checksum(claims, taken),
                               "claims": claims}
        if taken:
            doc["taken_over"] = taken
        write_atomically(self.path, json.dumps(doc, indent=1, sort_keys=True))


def read_quarantine(path: Path) -> list[dict[str, Any]]:
    """The quarantined entries kept at `path` (none when there is no file; a file that is not
    one is kept aside by name, never overwritten unread)."""
    try:
        doc = json.loads(path.read_text())
        entries = doc["entries"]
        if not isinstance(entries, list):
            raise TypeError("entries: expected a list")
        return entries
    except FileNotFoundError:
        return []
    except (ValueError, KeyError, TypeError) as exc:
        aside = path.with_name(f"{path.name}.unreadable")
        os.replace(path, aside)
        log.warning("%s: not a quarantine file (%s): moved to %s", path, exc, aside)
        return []


def write_atomically(path: Path, text: str) -> None:
    """`path` holds `text` or what it held before, also across a crash or power loss."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    sync_dir(path.parent)


def sync_dir(directory: Path) -> None:
    """A rename or unlink in `directory` made durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def open_checkpoint(plugin_dir: Path, strict: bool = True) -> Checkpoint:
    """gpukit's checkpoint in its own file (GPUKIT_CHECKPOINT_FILE), after moving there what
    an earlier gpukit wrote to checkpoint.json in this format. NVIDIA's file there (any other
    content) is left as it is. CheckpointError when gpukit's file, either one, cannot be
    trusted."""
    own, legacy = plugin_dir / GPUKIT_CHECKPOINT_FILE, plugin_dir / CHECKPOINT_FILE
    migrate_legacy(legacy, own)
    return Checkpoint(own, strict)


def migrate_legacy(legacy: Path, own: Path) -> bool:
    """Move gpukit's claims from `legacy` (checkpoint.json in gpukit's format) to `own`:
    `own` written and synced first, `legacy` removed after, so a crash between leaves both and
    the next start ends the move. Where both exist, the later written is the node's state (an
    earlier gpukit run again after this one, then this one). True when a move happened."""
    try:
        text = legacy.read_text()
        legacy_mtime = legacy.stat().st_mtime_ns
    except FileNotFoundError:
        return False
    try:
        doc = json.loads(text)
    except ValueError:
        return False  # not gpukit's (nvidia_claims.py says what it is)
    if not is_gpukit_format(doc):
        return False
    previous = Checkpoint(legacy)  # CheckpointError when it cannot be trusted
    if own.exists() and own.stat().st_mtime_ns >= legacy_mtime:
        log.info("%s: gpukit's earlier checkpoint, already moved to %s: removed", legacy, own)
    else:
        target = Checkpoint(own)
        target.replace(previous.all().values(), target.taken_over())
        log.info("moved gpukit's prepared claims (%d) from %s to %s", len(previous.all()),
                 legacy, own)
    legacy.unlink()
    sync_dir(legacy.parent)
    return True
