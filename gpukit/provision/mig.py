"""MIG layouts from the inventory, through the MIG manager (`python -m gpukit.plugin.mig`).

The role writes the inventory's `gpukit_mig_configs` as a mig-parted `version: v1` file on
the node (the MIG manager's config) and runs `plan` (check mode) or `apply` with `--json`;
the MIG manager validates the whole layout against the node's GPUs before touching any,
refuses while GPU processes run (unless forced) and pauses the device plugin.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

DEFAULT_CONFIG_FILE = "/etc/gpukit/mig-parted.yaml"
HEADER = "# Managed by gpukit (gpu_sharing): the inventory's gpukit_mig_configs.\n"


class MigRunError(RuntimeError):
    """The MIG manager failed; the message is its own (which GPU, what to do)."""

    def __init__(self, message: str, result: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.result = dict(result or {})


# NVML_ERROR_LIB_RM_VERSION_MISMATCH as nvmlErrorString and the MIG manager word it: the
# installed driver library is not the loaded kernel module's (an upgrade not activated yet).
_VERSION_MISMATCH = ("NVML/RM version mismatch", "NVML error 18")


def driver_not_activated(error: MigRunError) -> bool:
    """Whether the MIG manager could not read the GPUs because the installed driver is not
    the loaded one yet: a plan cannot say what would change until the driver role activates
    it (a failed install left it so, or an upgrade is under way)."""
    return any(mark in str(error) for mark in _VERSION_MISMATCH)


PENDING_ACTIVATION = ("the GPUs cannot be read until the installed driver is activated "
                      "(NVML/RM version mismatch): planned again once it is")  # fmt: skip


def parted_config(configs: Mapping[str, Any]) -> str:
    """The mig-parted file, validated by the MIG manager's schema when it is installed."""
    from gpukit.contracts import mig_parted as schema

    doc = {"version": "v1", "mig-configs": json.loads(json.dumps(configs))}
    schema.parse(doc)  # raises MigConfigError naming the config and field
    return HEADER + yaml.safe_dump(doc, sort_keys=False, default_flow_style=None)


@dataclass(frozen=True)
class MigRun:
    command: str  # plan | apply
    changed: bool
    result: dict[str, Any]
    diff_before: str = ""
    diff_after: str = ""
    summary: list[str] = field(default_factory=list)


def argv(
    command: str,
    config_file: str,
    selected: str,
    force: bool = False,
    extra: Sequence[str] = (),
    python: str | None = None,
) -> list[str]:
    if command not in ("plan", "apply"):
        raise ValueError(f"MIG manager command {command!r} is not plan or apply")
    args = [python or sys.executable, "-m", "gpukit.plugin.mig", command,
            "--config-file", config_file, "--selected", selected, "--json"]  # fmt: skip
    if force and command == "apply":
        args.append("--force")
    return [*args, *extra]


def _summary(result: Mapping[str, Any]) -> tuple[str, str, list[str]]:
    before: list[str] = []
    after: list[str] = []
    lines: list[str] = []
    for g in result.get("gpus") or []:
        diff = g.get("diff") or {}
        before.append(f"GPU {g.get('index')}: {diff.get('before', '')}")
        after.append(f"GPU {g.get('index')}: {diff.get('after', '')}")
        if g.get("changed"):
            lines.append(f"GPU {g.get('index')}: {diff.get('before')} -> {diff.get('after')}")
    return "\n".join(before) + "\n", "\n".join(after) + "\n", lines


def run(
    command: str,
    config_file: str,
    selected: str,
    force: bool = False,
    extra: Sequence[str] = (),
    apply_timeout: float = 600,
) -> MigRun:
    """Run the MIG manager; `apply_timeout` bounds an apply (its --timeout, which stops it
    with state failed and the plugin's pause lifted); this process waits a minute longer for
    the manager's own answer before it gives up on the manager too."""
    args = argv(command, config_file, selected, force, extra)
    if command == "apply":
        args += ["--timeout", f"{apply_timeout:g}"]
    wait = apply_timeout + 60 if apply_timeout > 0 else None
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=wait)
    except subprocess.TimeoutExpired as e:
        raise MigRunError(f"MIG manager {command} ({selected}) did not answer within "
                          f"{e.timeout:g}s: stopped") from e
    try:
        result = json.loads(proc.stdout) if proc.stdout.strip() else {}
    except ValueError:
        result = {}
    if proc.returncode != 0 or result.get("failed"):
        msg = result.get("msg") or proc.stderr.strip() or f"exit status {proc.returncode}"
        raise MigRunError(f"MIG manager {command} ({selected}) failed: {msg}", result)
    if not isinstance(result, dict) or "changed" not in result:
        raise MigRunError(f"MIG manager {command}: no JSON result on stdout ({proc.stdout!r})")
    before, after, lines = _summary(result)
    return MigRun(command=command, changed=bool(result["changed"]), result=result,
                  diff_before=before, diff_after=after, summary=lines)  # fmt: skip
