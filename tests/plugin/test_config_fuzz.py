"""The agent's config loader and the CLIs that read users' files answer any input with their own
error: ConfigSource.load (what the running agent calls, start and reload) raises nothing but
ConfigError, so every unreadable config takes the last-good path (issue 30);
`gpukit-device-plugin --check-config` and `gpukit mig plan` exit 2, with one line for a file
refused before parsing (binary, not UTF-8, oversized; issue 29). Each input within a second."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpukit.contracts import bounded_yaml
from gpukit.contracts.plugin_config import ConfigError
from gpukit.plugin import cli as plugin_cli
from gpukit.plugin.config_source import ConfigSource
from gpukit.plugin.mig import cli as mig_cli

FUZZ = settings(max_examples=100, deadline=1000,
                suppress_health_check=[HealthCheck.function_scoped_fixture])

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                    st.text(max_size=20))
keys = st.sampled_from(["version", "flags", "sharing", "timeSlicing", "mps", "resources",
                        "name", "replicas", "migStrategy", "mig-configs", "devices",
                        "mig-enabled", "mig-devices", "all", "gpukit", "x"])
documents = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=5)), max_leaves=30)


def _refused_unread(data: bytes) -> bool:
    try:
        bounded_yaml.decode(data)
    except bounded_yaml.UnreadableText:
        return True
    return False


def _feed(tmp_path: Path, data: bytes, capsys: pytest.CaptureFixture[str]) -> None:
    configs = tmp_path / "configs"
    configs.mkdir(exist_ok=True)
    path = configs / "selected"
    path.write_bytes(data)
    t0 = time.monotonic()
    try:  # the running agent's loader: a ConfigError is the last-good path
        ConfigSource(config_dir=configs, default_config="selected").load()
    except ConfigError:
        pass
    capsys.readouterr()
    rc = plugin_cli.main(["--check-config", "--config-file", str(path)])
    err = capsys.readouterr().err
    assert rc in (0, 2), err
    if _refused_unread(data):
        assert rc == 2 and len(err.splitlines()) == 1 and str(path) in err, err
    rc = mig_cli.main(["plan", "--config-file", str(path), "--selected", "a",
                       "--nvml-library", str(tmp_path / "no-nvml.so")])
    err = capsys.readouterr().err
    assert rc in (1, 2), err  # invalid (2), or valid but no NVML here (1)
    if _refused_unread(data):
        assert rc == 2 and len(err.splitlines()) == 1 and str(path) in err, err
    assert "Traceback" not in err
    assert time.monotonic() - t0 < 1.0


@FUZZ
@given(data=st.binary(max_size=1024))
def test_any_bytes(tmp_path: Path, data: bytes, capsys: pytest.CaptureFixture[str]) -> None:
    _feed(tmp_path, data, capsys)


@FUZZ
@given(doc=documents)
def test_any_yaml_structure(tmp_path: Path, doc: Any,
                            capsys: pytest.CaptureFixture[str]) -> None:
    _feed(tmp_path, yaml.safe_dump(doc).encode(), capsys)
