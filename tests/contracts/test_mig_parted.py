"""mig-parted v1 configs and the inventory's gpukit_mig_configs: parsing and every bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpukit.contracts import mig_parted as schema
from gpukit.contracts.mig_parted import MigConfigError

REPO = Path(__file__).resolve().parents[2]

GOOD = """
version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  mixed-a100:
    - devices: [0, 1]
      device-filter: ["0x20B010DE", "NVIDIA A100-SXM4-40GB"]
      mig-enabled: true
      mig-devices:
        "3g.20gb": 1
        "2g.10gb": 1
        "1g.5gb": 2
        "1g.5gb+me": 0
    - devices: [2, 3]
      device-filter: A100-SXM4-40GB
      mig-enabled: false
"""


def problems(doc: Any) -> list[str]:
    with pytest.raises(MigConfigError) as e:
        schema.parse(doc)
    return e.value.problems


def test_parse_mig_parted_file() -> None:
    c = schema.load_text(GOOD, "mig.yaml")
    assert sorted(c.configs) == ["all-disabled", "mixed-a100"]
    (dis,) = c.select("all-disabled")
    assert dis.devices is None and not dis.mig_enabled and dis.path == "mig-configs.all-disabled[0]"
    first, second = c.select("mixed-a100")
    assert first.devices == (0, 1)
    assert dict(first.mig_devices) == {"3g.20gb": 1, "2g.10gb": 1, "1g.5gb": 2}  # 0 dropped
    assert [f.pci_device_id for f in first.device_filter] == [0x20B010DE, None]
    assert first.matches(1, 0x20B010DE, "NVIDIA A100-SXM4-40GB")
    assert not first.matches(2, 0x20B010DE, "NVIDIA A100-SXM4-40GB")
    assert second.matches(3, None, "NVIDIA A100-SXM4-40GB")  # "NVIDIA " prefix optional
    assert not second.matches(3, 0x1EB810DE, "Tesla T4")
    # round trip through to_doc
    assert schema.parse(c.to_doc()).configs == c.configs


def test_inventory_form_and_json_arg(tmp_path: Path) -> None:
    inv = yaml.safe_load((REPO / "inventories/lab/group_vars/gpu_nodes.yml").read_text())
    inner = inv["gpukit_mig_configs"]
    c = schema.parse(inner)
    assert {"all-disabled", "all-3g.20gb", "mixed-a100"} <= set(c.configs)
    assert schema.load_json_arg(json.dumps(inner)).configs == c.configs
    f = tmp_path / "c.json"
    f.write_text(json.dumps(inner))
    assert schema.load_json_arg(str(f)).configs == c.configs
    with pytest.raises(MigConfigError, match=r"no config named 'nope' .*known: all-3g\.20gb"):
        c.select("nope")


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        ({"version": "v2", "mig-configs": {"a": [{"devices": "all", "mig-enabled": False}]}},
         'version: expected v1, got "v2"'),
        ({"version": "v1"}, "mig-configs: missing"),
        ({"version": "v1", "mig-configs": [], "extra": 1}, "extra: unknown key"),
        ({"a": []}, "mig-configs.a: expected a non-empty list of device entries, got []"),
        ({"a": ["x"]}, 'mig-configs.a[0]: expected a mapping, got "x"'),
        ({"a": [{"mig-enabled": False}]}, "mig-configs.a[0].devices: missing"),
        ({"a": [{"devices": "some", "mig-enabled": False}]},
         "mig-configs.a[0].devices: expected 'all' or a list of GPU indices, got \"some\""),
        ({"a": [{"devices": [0, -1], "mig-enabled": False}]},
         "mig-configs.a[0].devices[1]: expected a GPU index (integer >= 0), got -1"),
        ({"a": [{"devices": [1, 1], "mig-enabled": False}]},
         "mig-configs.a[0].devices[1]: GPU 1 listed twice"),
        ({"a": [{"devices": "all"}]}, "mig-configs.a[0].mig-enabled: missing"),
        ({"a": [{"devices": "all", "mig-enabled": "yes"}]},
         'mig-configs.a[0].mig-enabled: expected true or false, got "yes"'),
        ({"a": [{"devices": "all", "mig-enabled": True, "mig-device": {}}]},
         "mig-configs.a[0].mig-device: unknown key"),
        ({"a": [{"devices": "all", "mig-enabled": True, "mig-devices": {"3g.20gb": -1}}]},
         "mig-configs.a[0].mig-devices.3g.20gb: expected a count (integer >= 0), got -1"),
        ({"a": [{"devices": "all", "mig-enabled": True, "mig-devices": {"3g.20gb": "2"}}]},
         'mig-configs.a[0].mig-devices.3g.20gb: expected a count (integer >= 0), got "2"'),
        ({"a": [{"devices": "all", "mig-enabled": True, "mig-devices": {"big": 1}}]},
         "mig-configs.a[0].mig-devices.big: not a MIG profile name"),
        ({"a": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1c.3g.20gb": 1}}]},
         "mig-configs.a[0].mig-devices.1c.3g.20gb: compute-instance profiles"),
        ({"a": [{"devices": "all", "mig-enabled": False, "mig-devices": {"3g.20gb": 1}}]},
         "mig-configs.a[0].mig-devices: MIG devices listed but mig-enabled is not true"),
        ({"a": [{"devices": "all", "mig-enabled": True, "device-filter": [3]}]},
         "mig-configs.a[0].device-filter[0]: expected a PCI device id (0x20B010DE) or a product"),
        ({"mixed-a100": [{"devices": "all", "device-filter": "NVIDIA A100-SXM4-40GB",
                          "mig-enabled": True, "mig-devices": {"3g.40gb": 1}}]},
         "mig-configs.mixed-a100[0].mig-devices.3g.40gb: unknown profile for "
         "NVIDIA A100-SXM4-40GB (known: 1g.5gb, 1g.5gb+me"),
        ("just text", 'mig-configs: expected a mapping of config names to lists, got "just text"'),
    ],
)
def test_schema_errors_name_path_and_value(doc: Any, expected: str) -> None:
    found = problems(doc)
    assert any(expected in p for p in found), found


def test_every_problem_is_reported_at_once() -> None:
    found = problems({
        "a": [{"devices": "x", "mig-enabled": 1}],
        "b": [{"devices": "all", "mig-enabled": True, "mig-devices": {"zz": 1}}],
    })
    assert [p.split(":")[0] for p in found] == [
        "mig-configs.a[0].devices", "mig-configs.a[0].mig-enabled",
        "mig-configs.b[0].mig-devices.zz"]


def test_file_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: v1\nmig-configs: {a: [\n")
    with pytest.raises(MigConfigError, match=r"bad.yaml: not valid YAML"):
        schema.load_file(bad)
    with pytest.raises(MigConfigError, match=r"missing.yaml: cannot read"):
        schema.load_file(tmp_path / "missing.yaml")
    bad.write_text("version: v1\nmig-configs:\n  a:\n    - {devices: all}\n")
    with pytest.raises(MigConfigError, match=r"bad.yaml: mig-configs.a\[0\].mig-enabled"):
        schema.load_file(bad)
    with pytest.raises(MigConfigError, match="--configs-json: not valid JSON"):
        schema.load_json_arg("{nope")
