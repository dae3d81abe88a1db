"""The runtime's hardening in the roles, without a lab: container_toolkit and device_plugin
refuse a device plugin config that serves only through NVIDIA_VISIBLE_DEVICES while the runtime
ignores it in unprivileged pods, as their first task (before any package or file changes),
naming host, variable and config. (The opt-out and the agreeing strategies: unit tests of
gpukit.provision.toolkit_config.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from labplay import run_playbook

HERE = Path(__file__).resolve().parent
CONFIGS = {
    "mounts": {"version": "v1", "flags": {"plugin": {"deviceListStrategy": "volume-mounts"}}},
    "legacy": {"version": "v1", "flags": {"plugin": {"deviceListStrategy": "envvar"}}},
}


def play(role: str, *args: str, **extra: Any) -> Any:
    return run_playbook(str(HERE / "playbooks/argspec.yml"), "localhost,", *args, var_files=(),
                        extra_vars={"role_under_test": role, **extra})  # fmt: skip


@pytest.mark.parametrize("role", ["container_toolkit", "device_plugin"])
def test_envvar_config_refused_under_the_hardening(role: str) -> None:
    r = play(role, gpukit_device_plugin_configs=CONFIGS)
    assert r.rc != 0
    failed = json.dumps(r.failed)
    assert ("host localhost: gpukit_device_plugin_configs['legacy'] uses deviceListStrategy envvar"
            in failed), failed
    assert "gpukit_runtime_accept_envvar_unprivileged is false" in failed
    assert "'mounts'" not in failed
    # the check is the role's first task: nothing else ran
    tasks = [t for t in r.results["localhost"] if t != "Gathering Facts"
             and t != "Include the role under test" and not t.startswith("Validating arguments")]
    assert len(tasks) == 1 and "runtime's hardening" in tasks[0], tasks
