"""Versioned device plugin config names: `<name>-<8 hex of sha256 of the content>`.

A rolling change of a config's content publishes the new content under a versioned name and
moves each node's `nvidia.com/device-plugin.config` label to it in turn (see
gpukit.provision.sharing_rollout); the conformance suite accepts a node labelled with the
versioned name of exactly the content its inventory declares. Both read the format here.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from typing import Any

DIGEST_LENGTH = 8
# A label value and a ConfigMap key: at most 63 characters.
MAX_NAME = 63


def canonical(content: Any) -> str:
    """One text for equal contents, whatever the key order."""
    return json.dumps(content, sort_keys=True, separators=(",", ":"), default=str)


def digest(content: Any) -> str:
    return hashlib.sha256(canonical(content).encode()).hexdigest()[:DIGEST_LENGTH]


def _stem(name: str) -> str:
    """`name` cut so that `<stem>-<digest>` fits a label value, alphanumeric at its end."""
    stem = name[: MAX_NAME - DIGEST_LENGTH - 1]
    return re.sub(r"[^A-Za-z0-9]+$", "", stem) or "config"


def versioned_name(name: str, content: Any) -> str:
    """`time-sliced` + content -> `time-sliced-1a2b3c4d` (a valid ConfigMap key and label)."""
    return f"{_stem(name)}-{digest(content)}"


def is_version_of(value: str | None, name: str) -> bool:
    """`value` is a versioned name of config `name` (of any content)."""
    if not value or value == name:
        return False
    pattern = re.escape(_stem(name)) + "-[0-9a-f]{" + str(DIGEST_LENGTH) + "}"
    return re.fullmatch(pattern, value) is not None


def label_selects(value: str | None, name: str, content: Any) -> bool:
    """A node labelled `value` serves config `name` with `content`: the plain name, or the
    versioned name of exactly that content (a node in a rollout's batch)."""
    return value == name or value == versioned_name(name, content)


def base_of(value: str, names: Sequence[str]) -> str | None:
    """The declared config `value` is a versioned name of, if any (the longest match)."""
    found = [n for n in names if is_version_of(value, n)]
    return max(found, key=len) if found else None
