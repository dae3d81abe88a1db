"""Dynamic MIG through DRA partitionable devices (KEP-4815, resource.k8s.io/v1, beta and on by
default in 1.37): the names gpukit adopts, NVIDIA's where its k8s-dra-driver-gpu has one, and
the declaration of which GPUs and profiles a node carves on demand.

A GPU declared dynamic publishes one counter set, `gpu-<minor>-counter-set` (NVIDIA's name),
holding the GPU's figures as counters: `multiprocessors`, `copy-engines`, `decoders`,
`encoders`, `jpeg-engines`, `ofa-engines`, `memory` (bytes), each the largest profile's, and
`memory-slice-<i>` (1 each, i from 0 to the GPU's memory slices - 1). Every allowed profile x
placement is a device named as a static MIG device is (`gpu-<minor>-mig-<profile>-<GI profile
id>-<start>`, gpukit.contracts.dra) consuming its profile's figures and its placement's memory
slices; the whole GPU (`gpu-<minor>`) consumes all of it, so the scheduler never hands out the
GPU and a MIG device of it together, nor two overlapping placements.

API rules (resource.k8s.io/v1 ResourceSliceSpec): a slice holds devices or sharedCounters,
never both; a counter set has at most 32 counters and a device's consumesCounters at most 32
per set; a slice whose devices consume counters (or carry taints) holds at most 64 devices.
gpukit writes one counter set per slice.

Declaration (inventory `gpukit_dra_dynamic_mig`, a DRA node's): GPU index -> the profiles that
may be carved on it, or `all` (every profile of the GPU's table):

    gpukit_dra_dynamic_mig: {0: [1g.10gb, 3g.40gb], 1: all}

The MIG manager leaves a dynamic GPU alone: the DRA plugin lists the GPUs it carves in
`gpukit-dynamic-mig.json` beside its checkpoint, and a layout that would change one skips it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from . import mig_profiles

VARIABLE = "gpukit_dra_dynamic_mig"
ALL_PROFILES = "all"
# Beside the DRA plugin's checkpoint (gpukit.contracts.dra.PLUGIN_DIR): the GPUs it carves.
OWNED_FILE = "gpukit-dynamic-mig.json"

MAX_COUNTERS_PER_SET = 32
MAX_CONSUMING_DEVICES_PER_SLICE = 64

# Device capacity name -> counter name (a counter is a DNS label: no capitals).
CAPACITY_COUNTERS = {
    "multiprocessors": "multiprocessors",
    "copyEngines": "copy-engines",
    "decoders": "decoders",
    "encoders": "encoders",
    "jpegEngines": "jpeg-engines",
    "ofaEngines": "ofa-engines",
    "memory": "memory",
}


def counter_set_name(minor: int) -> str:
    return f"gpu-{minor}-counter-set"


def memory_slice_counter(index: int) -> str:
    return f"memory-slice-{index}"


class DynamicMigError(ValueError):
    """A declaration that cannot be used; one line naming the field and the value."""


@dataclass(frozen=True)
class DynamicGpu:
    """One GPU carved on demand: its NVML index and the profiles allowed on it."""

    index: int
    profiles: tuple[str, ...]


def _index(key: object, field: str) -> int:
    if isinstance(key, bool):
        raise DynamicMigError(f"{field}: {key!r} is not a GPU index")
    if isinstance(key, int):
        value = key
    elif isinstance(key, str) and key.isdigit():
        value = int(key)
    else:
        raise DynamicMigError(f"{field}: {key!r} is not a GPU index")
    if value < 0:
        raise DynamicMigError(f"{field}: {key!r} is not a GPU index")
    return value


def parse(raw: object, product: str | None = None, count: int | None = None,
          field: str = VARIABLE) -> tuple[DynamicGpu, ...]:
    """The declaration, checked: indices (below `count` when given), profiles of `product`'s
    MIG table (when given; names as the table spells them, `+me` or its `.me` suffix).
    DynamicMigError names the first problem."""
    if raw is None:
        return ()
    if isinstance(raw, str):
        text = raw
        try:
            raw = json.loads(text) if text.strip() else {}
        except ValueError as exc:
            raise DynamicMigError(f"{field}: {text[:80]!r} is not a mapping (JSON): "
                                  f"{exc}") from exc
    if not isinstance(raw, Mapping):
        raise DynamicMigError(f"{field}: {raw!r} is not a mapping of GPU index to profiles")
    table = mig_profiles.for_product(product) if product else None
    if product and table is None:
        raise DynamicMigError(f"{field}: {mig_profiles.no_table_reason(product)}: no GPU of "
                              "it can be carved")
    out: dict[int, DynamicGpu] = {}
    for key, value in raw.items():
        index = _index(key, f"{field}.{key}")
        where = f"{field}.{index}"
        if index in out:
            raise DynamicMigError(f"{where}: GPU {index} declared twice")
        if count is not None and index >= count:
            raise DynamicMigError(f"{where}: GPU {index} is not among the node's {count} "
                                  "GPU(s) (gpukit_gpu.count)")
        out[index] = DynamicGpu(index, _profiles(value, table, where))
    return tuple(out[i] for i in sorted(out))


def _profiles(value: object, table: mig_profiles.MigGpu | None, where: str
              ) -> tuple[str, ...]:
    if value == ALL_PROFILES:
        return (ALL_PROFILES,) if table is None else tuple(
            p.name for p in table.gpu_instance_profiles)
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise DynamicMigError(f"{where}: {value!r} is not a list of MIG profiles or "
                              f"{ALL_PROFILES!r}")
    names: list[str] = []
    for name in value:
        if table is None:
            names.append(name)
            continue
        try:
            names.append(table.gpu_instance_profile(name).name)
        except KeyError:
            known = ", ".join(p.name for p in table.gpu_instance_profiles)
            raise DynamicMigError(f"{where}: {name!r} is not a MIG profile of "
                                  f"{table.product_names[0]} (known: {known})") from None
    return tuple(dict.fromkeys(names))


def as_plain(gpus: tuple[DynamicGpu, ...]) -> dict[str, list[str]]:
    """The declaration as JSON (string keys), what the plugin's --dynamic-mig takes."""
    return {str(g.index): list(g.profiles) for g in gpus}


def owned_document(gpus: Mapping[int, str]) -> dict[str, Any]:
    """`gpukit-dynamic-mig.json`: NVML index -> UUID of each GPU the DRA plugin carves."""
    return {"version": "v1", "gpus": {str(i): uuid for i, uuid in sorted(gpus.items())}}


def parse_owned(text: str, source: str) -> dict[int, str]:
    """`gpukit-dynamic-mig.json` back; DynamicMigError when it cannot be trusted."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise DynamicMigError(f"{source}: not JSON: {exc}") from exc
    gpus = doc.get("gpus") if isinstance(doc, Mapping) and doc.get("version") == "v1" else None
    if not isinstance(gpus, Mapping):
        raise DynamicMigError(f"{source}: not a v1 list of dynamic MIG GPUs")
    return {_index(k, f"{source}.gpus.{k}"): str(v) for k, v in gpus.items()}
