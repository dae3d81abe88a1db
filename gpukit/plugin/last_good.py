"""The last config the agent served, kept on the node so a restart survives bad input.

A running agent that meets an invalid or unknown selected config keeps serving the one it has;
a restarted one (reboot, rollout, eviction, OOM) has nothing in memory. Without this record it
would exit and crash-loop with the node at 0 GPUs until someone fixed the input. The record
holds the selected config's name, where it came from and its document before overrides (the
restarted pod applies its own), written atomically after every successful load.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

FORMAT = 1


@dataclass(frozen=True)
class LastGood:
    name: str  # the named config, "" for a plain file or defaults
    path: str  # the file it was read from, "" for defaults
    document: Mapping[str, Any]
    saved_at: float = 0.0

    def describe(self) -> str:
        what = f"config {self.name!r}" if self.name else (self.path or "the default config")
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.saved_at))
        return f"{what} (last served {when})"


def save(path: str, record: LastGood) -> None:
    """Replace the record atomically; the caller decides what a failure means."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    body = {"format": FORMAT, "name": record.name, "path": record.path,
            "document": dict(record.document), "savedAt": record.saved_at or time.time()}
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(body, fh, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())  # a reboot right after must not leave an empty record
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load(path: str) -> LastGood | None:
    """The record, or None when there is none or it cannot be used (said in the log)."""
    try:
        body = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("ignoring the last good config record %s: %s", path, exc)
        return None
    if (not isinstance(body, dict) or body.get("format") != FORMAT
            or not isinstance(body.get("document"), dict)):
        log.warning("ignoring the last good config record %s: not a format %d record",
                    path, FORMAT)
        return None
    return LastGood(name=str(body.get("name") or ""), path=str(body.get("path") or ""),
                    document=body["document"], saved_at=float(body.get("savedAt") or 0.0))
