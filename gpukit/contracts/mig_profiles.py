"""MIG profile tables, typed.

The tables live once, in ``gpukit/contracts/mig_profiles.yaml``. This module reads them into frozen
dataclasses for the device plugin's MIG planner, the labeler and the conformance suite; the mock
NVML library compiles the same file into a C header at build time
(``gpukit/lab/nvml/gen_mig_tables.py``),
so what the planner believes and what the (mock) GPU accepts cannot drift apart.

Example::

    from gpukit.contracts import mig_profiles

    a100 = mig_profiles.for_product("NVIDIA A100-SXM4-40GB")
    p = a100.gpu_instance_profile("3g.20gb")
    p.profile_id, p.driver_id, p.memory_mb, [pl.start for pl in p.placements]
    # (2, 9, 19968, [0, 4])

``profile_id`` is the ``NVML_GPU_INSTANCE_PROFILE_*`` constant, which only
``nvmlDeviceGetGpuInstanceProfileInfo(V)`` takes; ``driver_id`` is the id the driver gives the
profile (``nvmlGpuInstanceProfileInfo_t.id``, ``nvidia-smi mig -lgip``'s ID), which every call
taking a ``profileId`` takes and ``nvmlGpuInstanceGetInfo`` reports.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

DATA_FILE = Path(__file__).resolve().parent / "mig_profiles.yaml"

# NVML_GPU_INSTANCE_PROFILE_COUNT / NVML_COMPUTE_INSTANCE_PROFILE_COUNT in nvml.h (API 12/13).
GPU_INSTANCE_PROFILE_COUNT = 0x12
COMPUTE_INSTANCE_PROFILE_COUNT = 0x9


class MigTableError(ValueError):
    """The MIG table file is malformed; the message names the file and the field."""


@dataclass(frozen=True)
class Engines:
    """Engines owned by a GPU instance (or present on the whole GPU)."""

    copy: int
    decoder: int
    encoder: int
    jpeg: int
    ofa: int

    def fits_in(self, available: Engines) -> bool:
        return (
            self.copy <= available.copy
            and self.decoder <= available.decoder
            and self.encoder <= available.encoder
            and self.jpeg <= available.jpeg
            and self.ofa <= available.ofa
        )

    def __add__(self, other: Engines) -> Engines:
        return Engines(
            self.copy + other.copy,
            self.decoder + other.decoder,
            self.encoder + other.encoder,
            self.jpeg + other.jpeg,
            self.ofa + other.ofa,
        )

    def __sub__(self, other: Engines) -> Engines:
        return Engines(
            self.copy - other.copy,
            self.decoder - other.decoder,
            self.encoder - other.encoder,
            self.jpeg - other.jpeg,
            self.ofa - other.ofa,
        )


NO_ENGINES = Engines(0, 0, 0, 0, 0)


@dataclass(frozen=True, order=True)
class Placement:
    """A placement: ``start`` slice and ``size`` slices (memory slices for GPU instances,
    compute slices for compute instances), as NVML's placement structs."""

    start: int
    size: int

    @property
    def slices(self) -> frozenset[int]:
        return frozenset(range(self.start, self.start + self.size))

    def overlaps(self, other: Placement) -> bool:
        return self.start < other.start + other.size and other.start < self.start + self.size


@dataclass(frozen=True)
class ComputeInstanceProfile:
    """A compute-instance profile allowed inside a GPU instance of a given size."""

    profile_id: int
    nvml_constant: str
    compute_slices: int
    max_count: int
    placements: tuple[Placement, ...]

    def name_in(self, gi: GpuInstanceProfile) -> str:
        """NVIDIA's name, e.g. ``1c.3g.20gb``; a compute instance spanning the whole GPU
        instance is named like the GPU instance (``3g.20gb``)."""
        if self.compute_slices == gi.compute_slices:
            return gi.name
        return f"{self.compute_slices}c.{gi.name}"


@dataclass(frozen=True)
class GpuInstanceProfile:
    """One GPU-instance profile of one GPU model (NVML ``nvmlGpuInstanceProfileInfo_v2_t``).

    ``profile_id``: the ``NVML_GPU_INSTANCE_PROFILE_*`` constant (what
    ``nvmlDeviceGetGpuInstanceProfileInfo`` takes); ``driver_id``: the driver's id for it (the
    info's ``id``, what the calls taking a ``profileId`` take)."""

    name: str
    profile_id: int
    driver_id: int
    nvml_constant: str
    compute_slices: int
    memory_slices: int
    multiprocessors: int
    memory_mb: int
    max_count: int
    placements: tuple[Placement, ...]
    engines: Engines
    compute_instance_profiles: tuple[ComputeInstanceProfile, ...]

    @property
    def media_extensions(self) -> bool:
        """``+me`` and ``+me.all`` profiles own the GPU's media engines (JPEG and OFA, or all of
        them); ``-me`` profiles have none and are not extensions."""
        return "+me" in self.name

    @property
    def resource_suffix(self) -> str:
        """The profile as a Kubernetes resource name suffix (``+`` is not allowed: ``.``)."""
        return self.name.replace("+", ".")

    def compute_instance_profile(self, compute_slices: int) -> ComputeInstanceProfile:
        for cip in self.compute_instance_profiles:
            if cip.compute_slices == compute_slices:
                return cip
        raise KeyError(f"{self.name}: no compute-instance profile with {compute_slices} slices")

    def multiprocessors_per_slice(self) -> int:
        return self.multiprocessors // self.compute_slices

    def compute_instance_multiprocessors(self, cip: ComputeInstanceProfile) -> int:
        """SMs of a compute instance of this profile: all of the GPU instance's when it spans
        the GPU instance, else its slices times the per-slice share (an approximation the mock
        NVML uses too: a real driver's partial compute instances were not recorded)."""
        if cip.compute_slices == self.compute_slices:
            return self.multiprocessors
        return cip.compute_slices * self.multiprocessors_per_slice()


@dataclass(frozen=True)
class MigGpu:
    """MIG geometry of one GPU model."""

    key: str
    product_names: tuple[str, ...]
    memory_slices: int
    compute_slices: int
    multiprocessors: int
    engines: Engines
    gpu_instance_profiles: tuple[GpuInstanceProfile, ...]

    def gpu_instance_profile(self, name_or_id: str | int) -> GpuInstanceProfile:
        """Look a profile up by name (``1g.5gb+me``, or its resource suffix ``1g.5gb.me``) or
        by ``NVML_GPU_INSTANCE_PROFILE_*`` constant (``profile_id``; for the id a driver reports,
        see :meth:`gpu_instance_profile_by_driver_id`)."""
        for p in self.gpu_instance_profiles:
            if isinstance(name_or_id, int):
                if p.profile_id == name_or_id:
                    return p
            elif name_or_id in (p.name, p.resource_suffix):
                return p
        known = ", ".join(p.name for p in self.gpu_instance_profiles)
        raise KeyError(f"{self.key} has no MIG profile {name_or_id!r} (known: {known})")

    def gpu_instance_profile_by_driver_id(self, driver_id: int) -> GpuInstanceProfile:
        """The profile a driver's profile id names (``nvmlGpuInstanceInfo_t.profileId``, the
        ``id`` of a profile info, ``nvidia-smi mig -lgip``'s ID)."""
        for p in self.gpu_instance_profiles:
            if p.driver_id == driver_id:
                return p
        known = ", ".join(f"{p.name} {p.driver_id}" for p in self.gpu_instance_profiles)
        raise KeyError(f"{self.key} has no MIG profile with driver id {driver_id} (known: {known})")

    def fits(self, placed: list[tuple[GpuInstanceProfile, Placement]]) -> bool:
        """Whether these GPU instances can coexist on one GPU (placements valid, no overlap,
        counts, compute slices and engines within the GPU's), as the driver checks."""
        used_compute = 0
        engines = NO_ENGINES
        counts: dict[int, int] = {}
        for i, (p, pl) in enumerate(placed):
            if pl not in p.placements:
                return False
            if any(pl.overlaps(ql) for _, ql in placed[:i]):
                return False
            counts[p.profile_id] = counts.get(p.profile_id, 0) + 1
            if counts[p.profile_id] > p.max_count:
                return False
            used_compute += p.compute_slices
            engines = engines + p.engines
        return used_compute <= self.compute_slices and engines.fits_in(self.engines)


@dataclass(frozen=True)
class MigTables:
    gpus: Mapping[str, MigGpu]
    not_mig_capable: frozenset[str] = frozenset()  # lower-cased NVML product names

    def no_table_reason(self, product_name: str) -> str:
        """Why a product has no table, honestly: NVIDIA says it has no MIG, or gpukit lacks
        its table (never "not MIG capable" for a product gpukit merely does not know)."""
        if product_name.strip().lower() in self.not_mig_capable:
            return f"{product_name} is not MIG capable"
        return (f"no MIG table for {product_name!r} in gpukit (known: "
                f"{', '.join(n for g in self.gpus.values() for n in g.product_names[:1])})")

    def for_product(self, product_name: str) -> MigGpu | None:
        """The table for an NVML product name (``nvmlDeviceGetName``), or None when the GPU is
        not MIG capable (or unknown)."""
        wanted = product_name.strip().lower()
        for gpu in self.gpus.values():
            if wanted in (n.lower() for n in gpu.product_names) or wanted == gpu.key.lower():
                return gpu
        return None


class _Reader:
    """Typed access to the parsed YAML that reports errors with file and field path."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, field: str, msg: str) -> MigTableError:
        return MigTableError(f"{self.path}: {field}: {msg}")

    def mapping(self, value: object, field: str) -> Mapping[Any, Any]:
        if not isinstance(value, Mapping):
            raise self.fail(field, f"expected a mapping, got {type(value).__name__}")
        return value

    def get(self, m: Mapping[Any, Any], key: str, field: str) -> object:
        if key not in m:
            raise self.fail(f"{field}.{key}", "missing")
        return m[key]

    def integer(self, m: Mapping[Any, Any], key: str, field: str, minimum: int = 0) -> int:
        v = self.get(m, key, field)
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.fail(f"{field}.{key}", f"expected an integer, got {v!r}")
        if v < minimum:
            raise self.fail(f"{field}.{key}", f"must be >= {minimum}, got {v}")
        return v

    def string(self, m: Mapping[Any, Any], key: str, field: str) -> str:
        v = self.get(m, key, field)
        if not isinstance(v, str) or not v:
            raise self.fail(f"{field}.{key}", f"expected a non-empty string, got {v!r}")
        return v

    def int_list(self, m: Mapping[Any, Any], key: str, field: str) -> tuple[int, ...]:
        v = self.get(m, key, field)
        if not isinstance(v, list) or not v:
            raise self.fail(f"{field}.{key}", f"expected a non-empty list, got {v!r}")
        out: list[int] = []
        for i, item in enumerate(v):
            if isinstance(item, bool) or not isinstance(item, int) or item < 0:
                raise self.fail(f"{field}.{key}[{i}]", f"expected an integer >= 0, got {item!r}")
            out.append(item)
        return tuple(out)

    def engines(self, m: Mapping[Any, Any], key: str, field: str) -> Engines:
        e = self.mapping(self.get(m, key, field), f"{field}.{key}")
        f = f"{field}.{key}"
        return Engines(
            copy=self.integer(e, "copy", f),
            decoder=self.integer(e, "decoder", f),
            encoder=self.integer(e, "encoder", f),
            jpeg=self.integer(e, "jpeg", f),
            ofa=self.integer(e, "ofa", f),
        )


def _parse_ci_layout(
    r: _Reader, raw: Mapping[Any, Any], field: str
) -> dict[int, tuple[ComputeInstanceProfile, ...]]:
    layout: dict[int, tuple[ComputeInstanceProfile, ...]] = {}
    for gi_slices, entries in raw.items():
        f = f"{field}.{gi_slices}"
        if isinstance(gi_slices, bool) or not isinstance(gi_slices, int) or gi_slices < 1:
            raise r.fail(f, "keys must be GPU-instance compute slice counts (integers >= 1)")
        if not isinstance(entries, list) or not entries:
            raise r.fail(f, "expected a non-empty list of compute-instance profiles")
        cips: list[ComputeInstanceProfile] = []
        for i, e in enumerate(entries):
            ef = f"{f}[{i}]"
            em = r.mapping(e, ef)
            slices = r.integer(em, "compute_slices", ef, 1)
            pid = r.integer(em, "profile_id", ef)
            if pid >= COMPUTE_INSTANCE_PROFILE_COUNT:
                raise r.fail(f"{ef}.profile_id", f"{pid} is not an NVML compute-instance profile")
            starts = r.int_list(em, "placements", ef)
            for s in starts:
                if s + slices > gi_slices:
                    raise r.fail(f"{ef}.placements", f"start {s} + {slices} exceeds {gi_slices}")
            cips.append(
                ComputeInstanceProfile(
                    profile_id=pid,
                    nvml_constant=r.string(em, "nvml_constant", ef),
                    compute_slices=slices,
                    max_count=r.integer(em, "max_count", ef, 1),
                    placements=tuple(Placement(s, slices) for s in starts),
                )
            )
        layout[gi_slices] = tuple(cips)
    return layout


def _parse_gpu(r: _Reader, key: str, raw: object) -> MigGpu:
    field = f"gpus.{key}"
    m = r.mapping(raw, field)
    names = r.get(m, "product_names", field)
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise r.fail(f"{field}.product_names", "expected a list of product names")
    memory_slices = r.integer(m, "memory_slices", field, 1)
    compute_slices = r.integer(m, "compute_slices", field, 1)
    ci_field = f"{field}.compute_instance_profiles"
    layout = _parse_ci_layout(
        r, r.mapping(r.get(m, "compute_instance_profiles", field), ci_field), ci_field
    )
    raw_profiles = r.get(m, "gpu_instance_profiles", field)
    if not isinstance(raw_profiles, list) or not raw_profiles:
        raise r.fail(f"{field}.gpu_instance_profiles", "expected a non-empty list")
    profiles: list[GpuInstanceProfile] = []
    seen_ids: set[int] = set()
    seen_driver_ids: set[int] = set()
    for i, rp in enumerate(raw_profiles):
        pf = f"{field}.gpu_instance_profiles[{i}]"
        pm = r.mapping(rp, pf)
        pid = r.integer(pm, "profile_id", pf)
        if pid >= GPU_INSTANCE_PROFILE_COUNT:
            raise r.fail(f"{pf}.profile_id", f"{pid} is not an NVML GPU-instance profile")
        if pid in seen_ids:
            raise r.fail(f"{pf}.profile_id", f"duplicate profile id {pid}")
        seen_ids.add(pid)
        driver_id = r.integer(pm, "driver_id", pf)
        if driver_id in seen_driver_ids:
            raise r.fail(f"{pf}.driver_id", f"duplicate driver id {driver_id}")
        seen_driver_ids.add(driver_id)
        gi_compute = r.integer(pm, "compute_slices", pf, 1)
        gi_memory = r.integer(pm, "memory_slices", pf, 1)
        if gi_compute > compute_slices:
            raise r.fail(f"{pf}.compute_slices", f"exceeds the GPU's {compute_slices}")
        starts = r.int_list(pm, "placements", pf)
        for s in starts:
            if s % gi_memory or s + gi_memory > memory_slices:
                raise r.fail(f"{pf}.placements", f"start {s} (size {gi_memory}) is invalid")
        if gi_compute not in layout:
            raise r.fail(
                f"{field}.compute_instance_profiles", f"no entry for {gi_compute}-slice instances"
            )
        profiles.append(
            GpuInstanceProfile(
                name=r.string(pm, "name", pf),
                profile_id=pid,
                driver_id=driver_id,
                nvml_constant=r.string(pm, "nvml_constant", pf),
                compute_slices=gi_compute,
                memory_slices=gi_memory,
                multiprocessors=r.integer(pm, "multiprocessors", pf, 1),
                memory_mb=r.integer(pm, "memory_mb", pf, 1),
                max_count=r.integer(pm, "max_count", pf, 1),
                placements=tuple(Placement(s, gi_memory) for s in starts),
                engines=r.engines(pm, "engines", pf),
                compute_instance_profiles=layout[gi_compute],
            )
        )
    return MigGpu(
        key=key,
        product_names=tuple(names),
        memory_slices=memory_slices,
        compute_slices=compute_slices,
        multiprocessors=r.integer(m, "multiprocessors", field, 1),
        engines=r.engines(m, "engines", field),
        gpu_instance_profiles=tuple(profiles),
    )


def load(path: Path | str | None = None) -> MigTables:
    """Read and validate a MIG table file (default: the packaged one)."""
    p = Path(path) if path is not None else DATA_FILE
    r = _Reader(p)
    try:
        raw = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise MigTableError(f"{p}: not valid YAML: {e}") from e
    top = r.mapping(raw, "(top level)")
    if top.get("version") != 1:
        raise r.fail("version", f"expected 1, got {top.get('version')!r}")
    gpus_raw = r.mapping(r.get(top, "gpus", "(top level)"), "gpus")
    gpus = {str(k): _parse_gpu(r, str(k), v) for k, v in gpus_raw.items()}
    without = top.get("not_mig_capable", [])
    if not isinstance(without, list) or not all(isinstance(n, str) for n in without):
        raise r.fail("not_mig_capable", "expected a list of product names")
    return MigTables(gpus=gpus, not_mig_capable=frozenset(n.lower() for n in without))


@functools.cache
def tables() -> MigTables:
    """The packaged tables (read once)."""
    return load()


def no_table_reason(product_name: str) -> str:
    return tables().no_table_reason(product_name)


def for_product(product_name: str) -> MigGpu | None:
    """The MIG table for an NVML product name, or None when not MIG capable."""
    return tables().for_product(product_name)


def gpu(key: str) -> MigGpu:
    """A table by key (``A100-SXM4-40GB``, ``A100-80GB``, ``H100-80GB``)."""
    try:
        return tables().gpus[key]
    except KeyError:
        raise KeyError(f"no MIG table {key!r} (known: {', '.join(tables().gpus)})") from None
