"""YAML for files users hand to the agent (plugin configs, MIG layouts), with bounds.

PyYAML's safe loader shares an aliased node instead of copying it, so a 1 KB "billion laughs"
document loads quickly, but anything that then walks it (validation, a JSON dump) expands
it: the config and MIG layout parsers went to 4.6 GB RSS on one. Deep nesting ends in
RecursionError. Neither is a real config: both are refused while composing, before any
Python object is built, with a message that says which bound was hit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

# Real configs use a handful of anchors (a shared timeSlicing block, a MIG layout reused by
# several configs), nest fewer than ten levels deep and hold a few hundred values.
MAX_ALIASES = 100
MAX_DEPTH = 50
MAX_NODES = 100_000  # values after expanding every alias
MAX_BYTES = 1 << 20  # NVIDIA's configs are a few KB; a ConfigMap holds at most 1 MiB


class BoundExceeded(yaml.YAMLError):
    """The document is over one of the bounds above; the message names it."""


class _BoundedLoader(yaml.SafeLoader):
    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._aliases = 0
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise BoundExceeded(f"more than {MAX_ALIASES} alias references (*name)")
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise BoundExceeded(f"nested deeper than {MAX_DEPTH} levels")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _expanded_size(root: yaml.Node) -> int:
    """Values the document holds once aliases are expanded (shared nodes counted each time
    they are referenced), without expanding anything: each distinct node is sized once."""
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in active:
            raise BoundExceeded("an alias refers to a node that contains it (recursive)")
        active.add(key)
        total = 1
        if isinstance(node, yaml.SequenceNode):
            total += sum(size(child) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            total += sum(size(k) + size(v) for k, v in node.value)
        active.discard(key)
        sizes[key] = min(total, MAX_NODES + 1)  # saturate: no huge integers either
        return sizes[key]

    return size(root)


def load(text: str) -> Any:
    """One YAML (or JSON) document; raises yaml.YAMLError, BoundExceeded for the bounds."""
    if len(text) > MAX_BYTES:
        raise BoundExceeded(f"larger than {MAX_BYTES} bytes ({len(text)})")
    loader = _BoundedLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if _expanded_size(node) > MAX_NODES:
            raise BoundExceeded(f"more than {MAX_NODES} values once aliases are expanded")
        try:
            return loader.construct_document(node)
        except (ValueError, TypeError, OverflowError) as exc:
            # PyYAML's constructors raise these for values that look typed but are not, e.g.
            # a date `2001-13-45`: the document is bad, like any other YAML error.
            raise Unconstructable(f"{type(exc).__name__}: {str(exc)[:200]}") from exc
    finally:
        loader.dispose()


class Unconstructable(yaml.YAMLError):
    """A value PyYAML could parse but not construct (an impossible date, ...)."""


class UnreadableText(ValueError):
    """A file that is not a YAML/JSON text at all: too large, binary, not UTF-8. One line,
    naming what was found (callers add the file)."""


def read_text(path: Path) -> str:
    """A user's config file as text, refused before parsing when it cannot be one: larger
    than MAX_BYTES, a NUL byte (binary), or not UTF-8 (a ConfigMap `binaryData` entry, a
    file saved in another encoding). Raises OSError when it cannot be read."""
    with path.open("rb") as f:
        data = f.read(MAX_BYTES + 1)
    return decode(data)


def decode(data: bytes) -> str:
    """As `read_text`, for bytes already in hand."""
    if len(data) > MAX_BYTES:
        raise UnreadableText(f"larger than {MAX_BYTES} bytes")
    nul = data.find(b"\0")
    if nul >= 0:
        raise UnreadableText(f"binary, not text (a NUL byte at offset {nul})")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnreadableText(f"not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                             f"{exc.start})") from None
