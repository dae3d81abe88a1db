"""The loaders of files users bring (NVIDIA's plugin config, mig-parted layouts) answer any
input with their own error, one message naming the file, within a second: never a traceback,
never a hang. A UnicodeDecodeError from a ConfigMap `binaryData` entry once escaped the agent's
loader, skipped the last-good path and crash-looped the node at 0 GPUs."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpukit.contracts import mig_parted, plugin_config
from gpukit.contracts.mig_parted import MigConfigError
from gpukit.contracts.plugin_config import ConfigError

FUZZ = settings(max_examples=150, deadline=1000,
                suppress_health_check=[HealthCheck.function_scoped_fixture])

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                    st.text(max_size=20))
documents = st.recursive(
    scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                     st.dictionaries(st.text(max_size=12), inner, max_size=4)),
    max_leaves=30)
# Keys the real formats use, so that generated documents reach the parsers' deeper paths.
keys = st.sampled_from(["version", "flags", "sharing", "timeSlicing", "mps", "resources",
                        "name", "replicas", "migStrategy", "plugin", "deviceListStrategy",
                        "mig-configs", "devices", "mig-enabled", "mig-devices", "all",
                        "renameByDefault", "failRequestsGreaterThanOne", "gpukit"])
shaped = st.recursive(
    scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                     st.dictionaries(keys, inner, max_size=5)),
    max_leaves=30)


def _both(path: Path) -> None:
    t0 = time.monotonic()
    try:
        plugin_config.parse_config(plugin_config.load_document(path), str(path))
    except ConfigError as exc:
        assert str(path) in str(exc)
    try:
        mig_parted.load_file(path)
    except MigConfigError as exc:
        assert str(path) in str(exc)
    assert time.monotonic() - t0 < 1.0


@FUZZ
@given(data=st.binary(max_size=2048))
def test_any_bytes(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "config"
    path.write_bytes(data)
    _both(path)


@FUZZ
@given(doc=st.one_of(documents, shaped))
def test_any_yaml_structure(tmp_path: Path, doc: Any) -> None:
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(doc))
    _both(path)
    try:
        plugin_config.parse_config(doc if isinstance(doc, dict) else {"x": doc})
    except ConfigError:
        pass
    try:
        mig_parted.parse(doc)
    except MigConfigError:
        pass


@pytest.mark.parametrize(("content", "why"), [
    (b"version: v1\n\x00\x01\x02", "binary, not text (a NUL byte at offset 12)"),
    ("version: v1\nflags: {migStrategy: n\xe9}\n".encode("latin-1"),
     "not UTF-8 text (byte 0xe9 at offset 34)"),
    (b"\x89PNG\r\n\x1a\n" + bytes(range(256)), "binary, not text"),
    (b"version: v1\n" + b"#" * (2 << 20), "larger than 1048576 bytes"),
])
def test_unreadable_files_are_refused_by_name(tmp_path: Path, content: bytes, why: str) -> None:
    path = tmp_path / "config"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as plugin:
        plugin_config.load_document(path)
    assert why in str(plugin.value) and str(path) in str(plugin.value)
    assert len(str(plugin.value).splitlines()) == 1  # one problem, one line
    with pytest.raises(MigConfigError) as mig:
        mig_parted.load_file(path)
    assert why in str(mig.value) and str(path) in str(mig.value)


def test_a_value_yaml_cannot_construct_is_a_config_error(tmp_path: Path) -> None:
    # PyYAML raised ValueError ("month must be in 1..12") out of its constructor.
    path = tmp_path / "config"
    path.write_text("version: v1\nflags: {migStrategy: 2001-13-45}\n")
    with pytest.raises(ConfigError, match=r"month must be in 1\.\.12"):
        plugin_config.load_document(path)
    with pytest.raises(MigConfigError, match=r"month must be in 1\.\.12"):
        mig_parted.load_file(path)
