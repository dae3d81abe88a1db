"""Hostile input to the parsers users feed (issue 15, hardened parsers): the plugin config, the
MIG layout and the inventory model end in their own validation error or a result, quickly and
in bounded memory; never a traceback, a hang or a RecursionError."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpukit import inventory as inv
from gpukit.contracts import bounded_yaml
from gpukit.contracts.mig_parted import MigConfigError
from gpukit.contracts.mig_parted import load_text as load_mig_layout
from gpukit.contracts.plugin_config import MAX_REPLICAS, ConfigError, parse_config, parse_document
from gpukit.plugin.api import deviceplugin_pb2 as pb


def alias_bomb(levels: int = 9) -> str:
    lines = ['a0: &a0 ["x","x","x","x","x","x","x","x","x"]']
    for i in range(1, levels):
        refs = ",".join([f"*a{i - 1}"] * 9)
        lines.append(f"a{i}: &a{i} [{refs}]")
    return "\n".join(lines) + "\n"


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_an_alias_bomb_is_refused_before_it_expands() -> None:
    bomb = alias_bomb()
    assert len(bomb) < 1024  # 9^9 = 387 million values once expanded
    start = time.monotonic()
    with pytest.raises(ConfigError, match=f"more than {bounded_yaml.MAX_NODES} values"):
        parse_document(bomb, "bomb.yaml")
    with pytest.raises(MigConfigError, match="refused, the document is more than"):
        load_mig_layout(bomb, "bomb.yaml")
    assert time.monotonic() - start < 2


def test_many_aliases_and_recursive_aliases_are_refused() -> None:
    many = "a: &a 1\nb: [" + ",".join(["*a"] * (bounded_yaml.MAX_ALIASES + 1)) + "]\n"
    with pytest.raises(ConfigError, match=f"more than {bounded_yaml.MAX_ALIASES} alias"):
        parse_document(many)
    with pytest.raises(ConfigError, match="recursive"):
        parse_document("a: &a [*a]\n")


def test_a_few_anchors_as_real_configs_use_them_still_load() -> None:
    doc = parse_document(
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
        "    - &ts {name: nvidia.com/gpu, replicas: 4}\n    - <<: *ts\n"
        "      name: nvidia.com/mig-1g.5gb\n")
    assert parse_config(doc).time_slicing.resources[1].replicas == 4


def test_deep_nesting_is_refused_not_a_recursion_error() -> None:
    with pytest.raises(ConfigError, match=f"nested deeper than {bounded_yaml.MAX_DEPTH}"):
        parse_document("version: v1\nx: " + nested(5000) + "\n")
    with pytest.raises(MigConfigError, match="nested deeper"):
        load_mig_layout(nested(5000), "deep.yaml")


def test_an_oversized_document_is_refused() -> None:
    with pytest.raises(ConfigError, match="larger than"):
        parse_document("# " + "x" * bounded_yaml.MAX_BYTES + "\nversion: v1\n")


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan", "13.5", "true", "'x'"])
def test_ignored_xids_must_be_integers(value: str) -> None:
    doc = parse_document(f"version: v1\ngpukit:\n  health:\n    ignoredXids: [13, {value}]\n")
    with pytest.raises(ConfigError, match=r"gpukit\.health\.ignoredXids\[1\]: .* is not an XID"):
        parse_config(doc)


@pytest.mark.parametrize("value", [".inf", ".nan"])
def test_seconds_must_be_finite(value: str) -> None:
    doc = parse_document(f"version: v1\ngpukit:\n  health:\n    recoverySeconds: {value}\n")
    with pytest.raises(ConfigError, match=r"gpukit\.health\.recoverySeconds: .* is not a number"):
        parse_config(doc)


def _ts(replicas: int) -> dict[str, Any]:
    return {"version": "v1", "sharing": {"timeSlicing": {"resources": [
        {"name": "nvidia.com/gpu", "replicas": replicas}]}}}


def test_replicas_are_bounded_so_list_and_watch_fits_grpc_limits() -> None:
    with pytest.raises(ConfigError, match=f"100000 is more than {MAX_REPLICAS}"):
        parse_config(_ts(100000))
    assert parse_config(_ts(MAX_REPLICAS)).time_slicing.resources[0].replicas == MAX_REPLICAS
    # The bound's reason: 16 GPUs x 7 MIG devices x MAX_REPLICAS IDs in one message.
    devices = [pb.Device(ID=f"MIG-{i:08x}-1111-2222-3333-444444444444::{r}", health="Unhealthy",
                         topology=pb.TopologyInfo(nodes=[pb.NUMANode(ID=7)]))
               for i in range(16 * 7) for r in range(MAX_REPLICAS)]
    assert pb.ListAndWatchResponse(devices=devices).ByteSize() < 4 * 1024 * 1024


# -- property-based: any input ends in the project's error or a result --------------------------

yaml_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8))
json_like = st.recursive(
    yaml_scalars,
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.sampled_from([
        "version", "flags", "migStrategy", "plugin", "sharing", "timeSlicing", "resources",
        "name", "replicas", "rename", "devices", "gpukit", "health", "ignoredXids",
        "mig-configs", "mig-enabled", "mig-devices", "all", "1g.5gb", "x"]) | st.text(max_size=6),
        children, max_size=4),
    max_leaves=20)
FUZZ = settings(max_examples=150, deadline=2000,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@FUZZ
@given(st.text(max_size=300))
def test_any_text_is_a_config_or_a_config_error(text: str) -> None:
    try:
        parse_config(parse_document(text))
    except ConfigError:
        pass


@FUZZ
@given(json_like)
def test_any_document_is_a_config_or_a_config_error(doc: Any) -> None:
    try:
        parse_config(doc if isinstance(doc, dict) else {"flags": doc})
    except ConfigError:
        pass


@FUZZ
@given(st.text(max_size=300) | json_like.map(repr))
def test_any_text_is_a_mig_layout_or_a_mig_error(text: str) -> None:
    try:
        load_mig_layout(text, "fuzz.yaml")
    except MigConfigError:
        pass


@FUZZ
@given(st.dictionaries(st.sampled_from([
    "gpukit_gpu", "gpukit_device_plugin_configs", "gpukit_device_plugin_config",
    "gpukit_mig_config", "gpukit_mig_configs", "gpukit_node_labels", "gpukit_node_taints",
    "nvidia_driver_branch", "nvidia_driver_version", "gpukit_sharing"]), json_like, max_size=5))
def test_any_host_variables_are_a_declaration_or_an_inventory_error(raw: dict[str, Any]
                                                                   ) -> None:
    try:
        inv.node_from_vars("n1", raw)
    except inv.InventoryError:
        pass


def test_hostile_files_through_the_agents_file_reader(tmp_path: Path) -> None:
    from gpukit.contracts.plugin_config import load_document

    f = tmp_path / "bomb"
    f.write_text(alias_bomb())
    with pytest.raises(ConfigError, match=str(f)):
        load_document(f)
