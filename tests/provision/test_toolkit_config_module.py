"""The gpukit.gpu.toolkit_config module as the container_toolkit role runs it (ansible-playbook on
localhost with a temporary config.toml): check mode writes nothing, diff mode shows the keys,
a run writes them, a second run changes nothing, the opt-out flips one key, broken TOML is
refused untouched."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import moduletest

from gpukit.lab.packages.catalog import RUNTIME_CONFIG

ENVVAR = "accept-nvidia-visible-devices-envvar-when-unprivileged"
MOUNTS = "accept-nvidia-visible-devices-as-volume-mounts"


def run_module(tmp: Path, args: dict[str, Any], *flags: str) -> dict[str, Any]:
    return moduletest.run_module(tmp, "toolkit_config", args, *flags)


def test_module_hardens_in_check_diff_and_real_runs(tmp_path: Path) -> None:
    conf = tmp_path / "config.toml"
    conf.write_text(RUNTIME_CONFIG)
    args = {"path": str(conf)}
    r = run_module(tmp_path, args, "--check", "--diff")
    assert r["changed"] and conf.read_text() == RUNTIME_CONFIG
    assert f"{ENVVAR} = false" in r["diff"]["after"] and f"{MOUNTS} = true" in r["diff"]["after"]
    r = run_module(tmp_path, args)
    assert r["changed"], r
    doc = tomllib.loads(conf.read_text())
    assert doc[ENVVAR] is False and doc[MOUNTS] is True
    assert doc["nvidia-container-runtime"]["mode"] == "auto"  # the rest of the file is kept
    assert not run_module(tmp_path, args)["changed"]
    r = run_module(tmp_path, {**args, "accept_envvar_unprivileged": True})
    assert r["changes"] == [f"{ENVVAR}: False -> True"]
    assert tomllib.loads(conf.read_text())[ENVVAR] is True


def test_module_refuses_broken_toml_without_writing(tmp_path: Path) -> None:
    conf = tmp_path / "config.toml"
    conf.write_text("[nvidia-container-runtime\n")
    r = run_module(tmp_path, {"path": str(conf)})
    assert r.get("failed") and "not valid TOML" in r["msg"], r
    assert conf.read_text() == "[nvidia-container-runtime\n"
