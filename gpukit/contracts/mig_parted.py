"""mig-parted ``version: v1`` MIG configs, parsed into typed, validated data.

Two spellings of the same thing are accepted:

* a mig-parted file::

      version: v1
      mig-configs:
        all-3g.20gb:
          - devices: all
            mig-enabled: true
            mig-devices: {"3g.20gb": 2}

* the inner mapping alone, as the inventory variable ``gpukit_mig_configs`` holds it
  (``{all-3g.20gb: [...]}``).

Every error names the path and the value, e.g.
``mig-configs.mixed-a100[0].mig-devices.5g.20gb: unknown profile for NVIDIA A100-SXM4-40GB (...)``.
Profile names are checked for shape here (and against the table of a product named in
``device-filter``); whether a profile exists on the GPUs a node actually has is checked by the
planner, which knows them (``...: unknown profile for NVIDIA A100-SXM4-40GB``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpukit.contracts import bounded_yaml, mig_profiles

ROOT = "mig-configs"
ENTRY_KEYS = ("devices", "device-filter", "mig-enabled", "mig-devices")
_PCI_ID = re.compile(r"^0[xX][0-9a-fA-F]{1,8}$")
_GI_PROFILE = re.compile(r"^\d+g\.\d+gb(\+me)?$")
_CI_PROFILE = re.compile(r"^\d+c\.\d+g\.\d+gb(\+me)?$")


class MigConfigError(ValueError):
    """The config is invalid; ``problems`` lists every error (path: what is wrong)."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


@dataclass(frozen=True)
class DeviceFilter:
    """``device-filter`` item: a PCI device id (``0x20B010DE``: device << 16 | vendor) or a
    product name as NVML reports it (``NVIDIA A100-SXM4-40GB``; the ``NVIDIA `` prefix and case
    are optional)."""

    text: str
    pci_device_id: int | None

    def matches(self, pci_device_id: int | None, product: str) -> bool:
        if self.pci_device_id is not None:
            return pci_device_id is not None and pci_device_id == self.pci_device_id
        return _product_key(self.text) == _product_key(product)


def _product_key(name: str) -> str:
    n = name.strip().lower()
    return n.removeprefix("nvidia ").strip()


@dataclass(frozen=True)
class MigConfigEntry:
    """One item of a named config: which GPUs, and what they should look like."""

    path: str  # "mig-configs.mixed-a100[0]", for messages
    devices: tuple[int, ...] | None  # None: all
    device_filter: tuple[DeviceFilter, ...]  # empty: any GPU
    mig_enabled: bool
    mig_devices: Mapping[str, int] = field(default_factory=dict)  # profile -> count (> 0)

    def matches(self, index: int, pci_device_id: int | None, product: str) -> bool:
        if self.devices is not None and index not in self.devices:
            return False
        return not self.device_filter or any(
            f.matches(pci_device_id, product) for f in self.device_filter
        )

    def to_doc(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"devices": "all" if self.devices is None else list(self.devices)}
        if self.device_filter:
            texts = [f.text for f in self.device_filter]
            doc["device-filter"] = texts[0] if len(texts) == 1 else texts
        doc["mig-enabled"] = self.mig_enabled
        if self.mig_enabled:
            doc["mig-devices"] = dict(self.mig_devices)
        return doc


@dataclass(frozen=True)
class MigConfigs:
    """Named MIG configs (``mig-configs``)."""

    configs: Mapping[str, tuple[MigConfigEntry, ...]]

    def select(self, name: str) -> tuple[MigConfigEntry, ...]:
        try:
            return self.configs[name]
        except KeyError:
            known = ", ".join(sorted(self.configs)) or "none"
            raise MigConfigError([f"{ROOT}: no config named {name!r} (known: {known})"]) from None

    def to_doc(self) -> dict[str, Any]:
        return {
            "version": "v1",
            ROOT: {n: [e.to_doc() for e in entries] for n, entries in self.configs.items()},
        }


def _known_profiles() -> dict[str, str]:
    """Every GPU-instance profile name (and resource spelling) of every table -> its name."""
    out: dict[str, str] = {}
    for gpu in mig_profiles.tables().gpus.values():
        for p in gpu.gpu_instance_profiles:
            out[p.name] = p.name
            out[p.resource_suffix] = p.name
    return out


def canonical_profile(name: str) -> str | None:
    """The table spelling of a profile name (``1g.5gb.me`` -> ``1g.5gb+me``), None if unknown."""
    return _known_profiles().get(name.strip())


def _table_for_filter(f: DeviceFilter) -> mig_profiles.MigGpu | None:
    if f.pci_device_id is not None:
        return None
    return mig_profiles.for_product(f.text) or mig_profiles.for_product("NVIDIA " + f.text)


class _Parser:
    def __init__(self) -> None:
        self.problems: list[str] = []

    def fail(self, path: str, msg: str) -> None:
        self.problems.append(f"{path}: {msg}")

    def configs(self, raw: object, path: str) -> dict[str, tuple[MigConfigEntry, ...]]:
        if not isinstance(raw, Mapping):
            self.fail(path, f"expected a mapping of config names to lists, got {_show(raw)}")
            return {}
        if not raw:
            self.fail(path, "no configs defined")
        out: dict[str, tuple[MigConfigEntry, ...]] = {}
        for name, entries in raw.items():
            if not isinstance(name, str) or not name.strip():
                self.fail(path, f"config names must be non-empty strings, got {_show(name)}")
                continue
            cpath = f"{path}.{name}"
            if not isinstance(entries, list) or not entries:
                self.fail(cpath, "expected a non-empty list of device entries, got "
                                 f"{_show(entries)}")
                continue
            parsed = [self.entry(e, f"{cpath}[{i}]") for i, e in enumerate(entries)]
            out[name] = tuple(e for e in parsed if e is not None)
        return out

    def entry(self, raw: object, path: str) -> MigConfigEntry | None:
        if not isinstance(raw, Mapping):
            self.fail(path, f"expected a mapping, got {_show(raw)}")
            return None
        before = len(self.problems)
        for key in raw:
            if key not in ENTRY_KEYS:
                self.fail(f"{path}.{key}", f"unknown key (known: {', '.join(ENTRY_KEYS)})")
        devices = self.devices(raw, path)
        filters = self.device_filter(raw.get("device-filter"), f"{path}.device-filter")
        enabled = raw.get("mig-enabled")
        if "mig-enabled" not in raw:
            self.fail(f"{path}.mig-enabled", "missing (true or false)")
        elif not isinstance(enabled, bool):
            self.fail(f"{path}.mig-enabled", f"expected true or false, got {_show(enabled)}")
        mig_devices = self.mig_devices(raw, path, filters, enabled is True)
        if len(self.problems) > before:
            return None
        return MigConfigEntry(
            path=path,
            devices=devices,
            device_filter=filters,
            mig_enabled=bool(enabled),
            mig_devices=mig_devices,
        )

    def devices(self, raw: Mapping[Any, Any], path: str) -> tuple[int, ...] | None:
        p = f"{path}.devices"
        if "devices" not in raw:
            self.fail(p, "missing ('all' or a list of GPU indices)")
            return None
        value = raw["devices"]
        if value == "all":
            return None
        if isinstance(value, bool) or not isinstance(value, list | int):
            self.fail(p, f"expected 'all' or a list of GPU indices, got {_show(value)}")
            return None
        items = [value] if isinstance(value, int) else value
        if not items:
            self.fail(p, "empty list (use 'all', or list GPU indices)")
        out: list[int] = []
        for i, v in enumerate(items):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                self.fail(f"{p}[{i}]", f"expected a GPU index (integer >= 0), got {_show(v)}")
            elif v in out:
                self.fail(f"{p}[{i}]", f"GPU {v} listed twice")
            else:
                out.append(v)
        return tuple(out)

    def device_filter(self, value: object, path: str) -> tuple[DeviceFilter, ...]:
        if value is None:
            return ()
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not items:
            self.fail(path, f"expected a PCI device id, a product name or a list of them, "
                            f"got {_show(value)}")
            return ()
        out: list[DeviceFilter] = []
        for i, v in enumerate(items):
            p = path if isinstance(value, str) else f"{path}[{i}]"
            if not isinstance(v, str) or not v.strip():
                self.fail(p, f"expected a PCI device id (0x20B010DE) or a product name, "
                             f"got {_show(v)}")
                continue
            text = v.strip()
            pci = int(text, 16) if _PCI_ID.match(text) else None
            out.append(DeviceFilter(text=text, pci_device_id=pci))
        return tuple(out)

    def mig_devices(
        self, raw: Mapping[Any, Any], path: str, filters: tuple[DeviceFilter, ...], enabled: bool
    ) -> dict[str, int]:
        p = f"{path}.mig-devices"
        value = raw.get("mig-devices")
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.fail(p, f"expected a mapping of MIG profile to count, got {_show(value)}")
            return {}
        known = _known_profiles()
        # When the filter names products we know, check the profiles against exactly those.
        tables = [t for t in (_table_for_filter(f) for f in filters) if t is not None]
        if len(tables) != len(filters):
            tables = []
        out: dict[str, int] = {}
        for name, count in value.items():
            ppath = f"{p}.{name}"
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                self.fail(ppath, f"expected a count (integer >= 0), got {_show(count)}")
                continue
            if not isinstance(name, str):
                self.fail(ppath, f"expected a MIG profile name, got {_show(name)}")
                continue
            canonical = known.get(name.strip())
            if canonical is None:
                if _CI_PROFILE.match(name.strip()):
                    self.fail(ppath, "compute-instance profiles (Nc.Mg.Xgb) are not supported: "
                                     "list GPU-instance profiles, each gets one full compute "
                                     "instance")
                    continue
                if not _GI_PROFILE.match(name.strip()):
                    self.fail(ppath, f"not a MIG profile name: {name!r} (expected like 3g.20gb "
                                     "or 1g.5gb+me)")
                    continue
                # Well formed but in no table we know: the planner reports it per GPU, with
                # the product, on the node that has the GPUs.
                canonical = name.strip()
            for t in tables:
                try:
                    t.gpu_instance_profile(canonical)
                except KeyError:
                    names = ", ".join(pp.name for pp in t.gpu_instance_profiles)
                    self.fail(ppath, f"unknown profile for {t.product_names[0]} (known: {names})")
            if canonical in out:
                self.fail(ppath, f"profile {canonical} listed twice")
                continue
            if count > 0:
                out[canonical] = count
        if out and not enabled:
            self.fail(p, "MIG devices listed but mig-enabled is not true")
        return out


def _show(value: object) -> str:
    text = json.dumps(value) if isinstance(value, str | int | float | bool | None) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def parse(doc: object) -> MigConfigs:
    """A mig-parted document (``version: v1`` + ``mig-configs``) or the bare ``mig-configs``
    mapping (the inventory's ``gpukit_mig_configs``). Raises MigConfigError."""
    p = _Parser()
    if isinstance(doc, Mapping) and ("version" in doc or ROOT in doc):
        for key in doc:
            if key not in ("version", ROOT):
                p.fail(str(key), "unknown key (known: version, mig-configs)")
        if doc.get("version") != "v1":
            p.fail("version", f"expected v1, got {_show(doc.get('version'))}")
        if ROOT not in doc:
            p.fail(ROOT, "missing")
            raise MigConfigError(p.problems)
        configs = p.configs(doc[ROOT], ROOT)
    else:
        configs = p.configs(doc, ROOT)
    if p.problems:
        raise MigConfigError(p.problems)
    return MigConfigs(configs=configs)


def load_text(text: str, source: str) -> MigConfigs:
    """Parse YAML (or JSON, a subset) text; ``source`` names it in errors."""
    try:
        doc = bounded_yaml.load(text)
    except bounded_yaml.BoundExceeded as e:
        raise MigConfigError([f"{source}: refused, the document is {e}"]) from e
    except yaml.YAMLError as e:
        raise MigConfigError([f"{source}: not valid YAML or JSON: {e}"]) from e
    return _parse_from(doc, source)


def _parse_from(doc: Any, source: str) -> MigConfigs:
    """parse(doc), each problem prefixed with `source`."""
    try:
        return parse(doc)
    except MigConfigError as e:
        raise MigConfigError([f"{source}: {x}" for x in e.problems]) from None


def load_file(path: str | Path) -> MigConfigs:
    p = Path(path)
    try:
        text = bounded_yaml.read_text(p)
    except OSError as e:
        raise MigConfigError([f"{p}: cannot read: {e.strerror or e}"]) from e
    except bounded_yaml.UnreadableText as e:
        raise MigConfigError([f"{p}: refused, the file is {e}"]) from None
    return load_text(text, str(p))


def load_json_arg(value: str) -> MigConfigs:
    """``--configs-json``: inline JSON (the inventory variable, ``| to_json``), or a path to a
    JSON/YAML file holding it."""
    stripped = value.strip()
    if stripped.startswith(("{", "[")):
        try:
            doc = json.loads(stripped)
        except json.JSONDecodeError as e:
            raise MigConfigError([f"--configs-json: not valid JSON: {e}"]) from e
        return _parse_from(doc, "--configs-json")
    return load_file(stripped)
