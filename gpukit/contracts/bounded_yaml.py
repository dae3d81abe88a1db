"""YAML for files users hand to the agent (plugin configs, MIG layouts), with bounds.

PyYAML's safe loader shares an aliased node instead of copying it, so a 1 KB "billion laughs"
document loads quickly, but anything that then walks it (validation, a JSON dump) expands
it: the config and MIG layout parsers went to 4.6 GB RSS on one. Deep nesting ends in
RecursionError. Neither is a real config: both are refused while composing, before any
Python object is built, with a message that says which bound was hit.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

# Real configs use a handful of anchors (a shared timeSlicing block, a MIG layout reused by
# several configs), nest fewer than ten levels deep and hold a few hundred values.
MAX_ALIASES = 100
MAX_DEPTH = 50
MAX_NODES = 100_000  # values after expanding every alias
MAX_BYTES = 1 << 20  # NVIDIA's configs are a few KB; a ConfigMap holds at most 1 MiB




@dataclass(frozen=True)
class Bounds:
    """What a document may hold; the agent's files use the defaults above, inventories their
    own (gpukit.inventory.files)."""

    max_bytes: int = MAX_BYTES
    max_aliases: int = MAX_ALIASES
    max_depth: int = MAX_DEPTH
    max_nodes: int = MAX_NODES


AGENT_FILES = Bounds()


class BoundExceeded(yaml.YAMLError):
    """The document is over one of the bounds above; the message names it. `line` (1-based)
    is where it was hit, when known."""

    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(message)
        self.line = line


class _BoundedLoader(yaml.SafeLoader):
    def __init__(self, stream: str, bounds: Bounds) -> None:
        super().__init__(stream)
        self._bounds = bounds
        self._aliases = 0
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        bounds = self._bounds
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > bounds.max_aliases:
                raise BoundExceeded(f"more than {bounds.max_aliases} alias references (*name)",
                                    self._line())
        self._depth += 1
        try:
            if self._depth > bounds.max_depth:
                raise BoundExceeded(f"nested deeper than {bounds.max_depth} levels",
                                    self._line())
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def _line(self) -> int | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        return event.start_mark.line + 1 if event is not None and event.start_mark else None


def compose(text: str, bounds: Bounds = AGENT_FILES) -> tuple[yaml.Node | None, yaml.SafeLoader]:
    """The document's node graph, checked against `bounds`, nothing constructed (so tags of
    other loaders, e.g. Ansible's !vault, pass). Raises yaml.YAMLError / BoundExceeded; the
    caller disposes of the loader."""
    if len(text) > bounds.max_bytes:
        raise BoundExceeded(f"larger than {bounds.max_bytes} bytes ({len(text)})")
    loader = _BoundedLoader(text, bounds)
    try:
        node = loader.get_single_node()
        if node is not None and _expanded_size(node, bounds.max_nodes) > bounds.max_nodes:
            raise BoundExceeded(f"more than {bounds.max_nodes} values once aliases are "
                                "expanded", node.start_mark.line + 1)
    except BaseException:
        loader.dispose()
        raise
    return node, loader


def _expanded_size(root: yaml.Node, limit: int) -> int:
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
        sizes[key] = min(total, limit + 1)  # saturate: no huge integers either
        return sizes[key]

    return size(root)


def load(text: str) -> Any:
    """One YAML (or JSON) document; raises yaml.YAMLError, BoundExceeded for the bounds."""
    node, loader = compose(text)
    try:
        if node is None:
            return None
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


def read_text(path: Path, max_bytes: int = MAX_BYTES) -> str:
    """A user's config file as text, refused before parsing when it cannot be one: larger
    than MAX_BYTES, a NUL byte (binary), or not UTF-8 (a ConfigMap `binaryData` entry, a
    file saved in another encoding). Raises OSError when it cannot be read."""
    with path.open("rb") as f:
        data = f.read(max_bytes + 1)
    return decode(data, max_bytes)


def decode(data: bytes, max_bytes: int = MAX_BYTES) -> str:
    """As `read_text`, for bytes already in hand."""
    if len(data) > max_bytes:
        raise UnreadableText(f"larger than {max_bytes} bytes")
    nul = data.find(b"\0")
    if nul >= 0:
        raise UnreadableText(f"binary, not text (a NUL byte at offset {nul})")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnreadableText(f"not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                             f"{exc.start})") from None
