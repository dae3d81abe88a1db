"""gpukit.provision.toolkit_config: the runtime's hardening keys edited in place (planned,
idempotent, readable diffs) and the device plugin configs checked against them."""

from __future__ import annotations

import tomllib

import pytest

from gpukit.lab.packages.catalog import RUNTIME_CONFIG
from gpukit.lab.runtime import nvidia_container_runtime as ncr
from gpukit.provision import toolkit_config as tc

HARDENED = tc.ToolkitSettings()
OPT_OUT = tc.ToolkitSettings(accept_envvar_unprivileged=True)


def test_packaged_config_hardened_in_place_then_idempotent() -> None:
    edit = tc.plan(RUNTIME_CONFIG, HARDENED)
    assert edit.changed
    assert edit.changes == (
        "accept-nvidia-visible-devices-envvar-when-unprivileged: unset -> False",
        "accept-nvidia-visible-devices-as-volume-mounts: unset -> True",
    )
    after = edit.after or ""
    # the commented-out defaults are replaced where they stand; nothing else moves
    assert after.splitlines()[:2] == ["accept-nvidia-visible-devices-as-volume-mounts = true",
                                      "accept-nvidia-visible-devices-envvar-when-unprivileged = false"]
    assert after.splitlines()[2:] == RUNTIME_CONFIG.splitlines()[2:]
    # the lab's runtime reads it as hardened
    cfg = ncr.load_config(after)
    assert not cfg.envvar_when_unprivileged and cfg.volume_mounts and cfg.mode == "auto"
    again = tc.plan(after, HARDENED)
    assert not again.changed and again.changes == () and again.after == after


def test_opt_out_sets_the_variable_back() -> None:
    hardened = tc.plan(RUNTIME_CONFIG, HARDENED).after
    edit = tc.plan(hardened, OPT_OUT)
    assert edit.changes == ("accept-nvidia-visible-devices-envvar-when-unprivileged: False -> True",)
    assert tomllib.loads(edit.after or "")[tc.ENVVAR_UNPRIVILEGED] is True
    assert "envvar-when-unprivileged = true" in (edit.unified_diff())


def test_keys_go_before_the_first_table_when_absent() -> None:
    text = '# mine\n[nvidia-container-runtime]\nmode = "cdi"\n'
    after = tc.plan(text, HARDENED).after or ""
    doc = tomllib.loads(after)
    assert doc[tc.ENVVAR_UNPRIVILEGED] is False and doc[tc.VOLUME_MOUNTS] is True
    assert doc["nvidia-container-runtime"] == {"mode": "cdi"}
    assert after.startswith("# mine\naccept-")


def test_missing_file_is_created_and_non_bool_is_replaced() -> None:
    edit = tc.plan(None, HARDENED)
    assert edit.changes[0] == "/etc/nvidia-container-runtime/config.toml: created"
    assert tomllib.loads(edit.after or "") == {tc.ENVVAR_UNPRIVILEGED: False, tc.VOLUME_MOUNTS: True}
    edit = tc.plan(f'{tc.VOLUME_MOUNTS} = "yes"\n', HARDENED)
    assert f"{tc.VOLUME_MOUNTS}: 'yes' (not a boolean) -> True" in edit.changes


def test_broken_toml_is_refused_before_any_change() -> None:
    with pytest.raises(tc.ToolkitConfigError, match=r"config.toml: not valid TOML .*fix the file first"):
        tc.plan("[nvidia-container-runtime\n", HARDENED)


CONFIGS = {
    "default": {"version": "v1", "flags": {"plugin": {"deviceListStrategy": "envvar"}}},
    "mounts": {"version": "v1", "flags": {"plugin": {"deviceListStrategy": ["envvar", "volume-mounts"]}}},
    "cdi": {"version": "v1", "flags": {"plugin": {"deviceListStrategy": "cdi-cri"}}},
    "unset": {"version": "v1", "flags": {"migStrategy": "mixed"}},
}


def test_envvar_only_configs_refused_under_the_hardening_by_name() -> None:
    problems = tc.hardening_problems(CONFIGS, False, "gpu-t4")
    assert [p.split(" uses ")[0] for p in problems] == [
        "host gpu-t4: gpukit_device_plugin_configs['default']",
        "host gpu-t4: gpukit_device_plugin_configs['unset']"]
    p = problems[0]
    assert "deviceListStrategy envvar, but gpukit_runtime_accept_envvar_unprivileged is false" in p
    assert "set its flags.plugin.deviceListStrategy to volume-mounts" in p
    assert "envvar (not set: NVIDIA's default)" in problems[1]
    assert tc.hardening_problems(CONFIGS, True, "gpu-t4") == []
    assert tc.hardening_problems({k: CONFIGS[k] for k in ("mounts", "cdi")}, False, "h") == []
