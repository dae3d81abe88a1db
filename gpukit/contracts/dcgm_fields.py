"""dcgm-exporter's GPU fields (names, kinds, help texts) as gpukit exports them, read once from
``dcgm_fields.yaml`` beside this module (its comment says where they come from)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml

DATA_FILE = Path(__file__).resolve().parent / "dcgm_fields.yaml"
KINDS = ("gauge", "untyped")


@dataclass(frozen=True)
class Field:
    reading: str  # key in gpukit.plugin.nvml.telemetry.Reading.values ("" for the agent's own)
    name: str
    kind: str  # gauge | untyped (dcgm-exporter's counters, see the YAML file)
    help: str
    mig: bool = False  # also exported for a MIG device


@cache
def gpu_fields() -> tuple[Field, ...]:
    """The GPU fields, in the file's order (a malformed file fails loudly: it ships with gpukit)."""
    doc = yaml.safe_load(DATA_FILE.read_text(encoding="utf-8"))
    fields = tuple(Field(str(f["reading"]), str(f["name"]), str(f["kind"]), str(f["help"]),
                         bool(f.get("mig", False))) for f in doc["gpu_fields"])
    unknown = sorted({f.kind for f in fields} - set(KINDS))
    if unknown:
        raise ValueError(f"{DATA_FILE}: unknown kind {unknown[0]!r} (known: {', '.join(KINDS)})")
    return fields
