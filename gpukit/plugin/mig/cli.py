"""``python -m gpukit.plugin.mig {plan|apply|assert|export}`` (or ``gpukit mig ...``): the MIG
manager entry point.

    plan    validate the selected config against this node's GPUs, print what would change
    apply   plan, refuse if GPU processes run or prepared DRA claims hold a GPU that must
            change (unless --force), pause the device plugin,
            change, reset where the mode changes, verify
    assert  exit 3 when the node does not match the selected config
    export  print the current layout as a mig-parted config

Exit codes: 0 ok (changed or not: see ``changed`` in --json), 1 error (NVML, reset, processes
running, DRA claims held, apply failed part-way: rerun to converge), 2 invalid config (schema,
no such config, layout impossible on this node, a profile the driver does not offer, a GPU
whose MIG table the driver contradicts), 3 assert mismatch.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from gpukit import __version__
from gpukit.contracts.mig_parted import MigConfigError, MigConfigs, load_file, load_json_arg
from gpukit.mig.planner import LayoutError, plan
from gpukit.plugin import nvml

from ..dra.checkpoint import CheckpointError
from ..nvml import discovery
from ..nvml.mig import open_nvml
from . import deadline, dra_claims, hooks
from .applier import ApplyError, ClaimsHeld, ProcessesRunning, apply
from .export import export_config, export_warnings
from .hooks import ResetError
from .report import apply_text, plan_text, problems_text

EXIT_OK, EXIT_ERROR, EXIT_INVALID, EXIT_MISMATCH = 0, 1, 2, 3
log = logging.getLogger("gpukit.plugin.mig")


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(name) or default


def build_parser(prog: str = "python -m gpukit.plugin.mig") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog, description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    p.add_argument("command", choices=("plan", "apply", "assert", "export"))
    src = p.add_argument_group("config (plan, apply, assert)")
    one = src.add_mutually_exclusive_group()
    one.add_argument("--config-file", "-f", default=_env("MIG_PARTED_CONFIG_FILE"),
                     help="mig-parted v1 file (YAML or JSON) [MIG_PARTED_CONFIG_FILE]")
    one.add_argument("--configs-json", metavar="JSON",
                     help="the inventory's gpukit_mig_configs as JSON (inline, or a file path)")
    src.add_argument("--selected", "-c", default=_env("MIG_PARTED_SELECTED_CONFIG"),
                     help="config name [MIG_PARTED_SELECTED_CONFIG; else the node label "
                          "nvidia.com/mig.config with --node-name]; export: the exported name")
    p.add_argument("--force", action="store_true",
                   help="apply even when GPU processes run on GPUs that must change, or "
                        "prepared DRA claims hold them")
    p.add_argument("--json", action="store_true", help="print JSON (for the Ansible role)")
    rt = p.add_argument_group("node")
    rt.add_argument("--nvml-library", default=_env("GPUKIT_NVML_LIB"),
                    help="libnvidia-ml.so.1 to load (e.g. the lab mock) [GPUKIT_NVML_LIB]")
    rt.add_argument("--reset-command", metavar="CMD",
                    help="GPU reset command, {index} is the GPU (default: `nvidia-smi -r -i "
                         "{index}`; the lab's mock NVML is reset through the library itself)")
    rt.add_argument("--pause-file", default=_env(hooks.ENV_PAUSE_FILE, hooks.DEFAULT_PAUSE_FILE),
                    help="device plugin pause file ('' disables) [GPUKIT_PLUGIN_PAUSE_FILE]")
    rt.add_argument("--dra-checkpoint", type=Path,
                    default=Path(_env("GPUKIT_DRA_CHECKPOINT", str(dra_claims.DEFAULT_CHECKPOINT))
                                 or ""),
                    help="the DRA plugin's prepared claims: apply refuses to change a GPU they "
                         "hold [GPUKIT_DRA_CHECKPOINT]")
    rt.add_argument("--pause-ack-timeout", type=float, default=0.0, metavar="SECONDS",
                    help="wait this long for the plugin to acknowledge the pause")
    rt.add_argument("--timeout", type=float,
                    default=float(_env("GPUKIT_MIG_APPLY_TIMEOUT", "600") or 600),
                    metavar="SECONDS",
                    help="apply: give up after this long (0: no bound): state failed, the "
                         "plugin's pause lifted, exit 1 [GPUKIT_MIG_APPLY_TIMEOUT]")
    rt.add_argument("--plugin-pid", type=int, help="device plugin PID: SIGUSR1 after a change")
    rt.add_argument("--plugin-pid-file", type=Path, help="file holding the device plugin PID")
    rt.add_argument("--node-name", default=_env("NODE_NAME"),
                    help="report nvidia.com/mig.config.state on this node [NODE_NAME]")
    rt.add_argument("--kubeconfig", default=_env("KUBECONFIG"))
    rt.add_argument("--state-file", type=Path,
                    help="also write the mig.config.state (pending/success/failed) to this file")
    rt.add_argument("--output", "-o", type=Path, help="export: write to this file")
    rt.add_argument("--log-level", default=_env("GPUKIT_LOG_LEVEL", "WARNING"))
    return p


class _Fail(Exception):
    def __init__(self, code: int, title: str, problems: Sequence[str]) -> None:
        super().__init__(title)
        self.code, self.title, self.problems = code, title, list(problems)


def _configs(args: argparse.Namespace) -> MigConfigs:
    if args.configs_json:
        return load_json_arg(args.configs_json)
    if args.config_file:
        return load_file(args.config_file)
    raise _Fail(EXIT_INVALID, "no config", ["give --config-file or --configs-json"])


def _reporters(args: argparse.Namespace) -> tuple[hooks.StateReporter, str | None]:
    reporters: list[hooks.StateReporter] = []
    label_selected = None
    if args.node_name:
        node = hooks.NodeLabelReporter(args.node_name, kubeconfig=args.kubeconfig)
        reporters.append(node)
        if not args.selected:
            label_selected = node.selected_config()
    if args.state_file:
        reporters.append(hooks.FileReporter(args.state_file))
    return hooks.MultiReporter(*reporters), label_selected


def _reset_fn(args: argparse.Namespace) -> hooks.ResetFn:
    if args.reset_command:
        return hooks.command_reset(shlex.split(args.reset_command))
    from gpukit.plugin import nvml

    if nvml.is_lab_mock():
        return hooks.lab_mock_reset()
    return hooks.command_reset(hooks.NVIDIA_SMI_RESET)


def _emit(args: argparse.Namespace, doc: dict[str, Any], text: str) -> None:
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=False))
    elif text:
        print(text)


def _run(args: argparse.Namespace) -> int:
    if args.command == "export":
        with open_nvml(args.nvml_library) as backend:
            gpus = backend.gpus()
        doc = export_config(gpus, args.selected or "current")
        for w in export_warnings(gpus):
            print(f"warning: {w}", file=sys.stderr)
        text = (json.dumps(doc, indent=2) if args.json
                else yaml.safe_dump(doc, sort_keys=False, default_flow_style=None))
        if args.output:
            args.output.write_text(text if text.endswith("\n") else text + "\n")
        else:
            print(text.rstrip("\n"))
        return EXIT_OK

    configs = _configs(args)
    reporter, label_selected = _reporters(args) if args.command == "apply" else (None, None)
    if args.command != "apply" and args.node_name and not args.selected:
        label_selected = hooks.NodeLabelReporter(
            args.node_name, kubeconfig=args.kubeconfig).selected_config()
    selected = args.selected or label_selected
    if not selected:
        raise _Fail(EXIT_INVALID, "no config selected",
                    ["give --selected NAME (or label the node nvidia.com/mig.config)"])
    configs.select(selected)  # unknown name: exit 2 before touching NVML

    # Dynamic MIG GPUs are the DRA plugin's, even with --force: skipped, never changed.
    dynamic = (dra_claims.dynamic_gpus(args.dra_checkpoint)
               if str(args.dra_checkpoint) not in ("", ".") else {})
    with open_nvml(args.nvml_library) as backend:
        if args.command in ("plan", "assert"):
            p = plan(configs, selected, backend.gpus(), dynamic)
            doc = {"command": args.command, **p.to_json()}
            if args.command == "plan":
                _emit(args, doc, plan_text(p))
                return EXIT_OK
            doc["match"] = not p.changed
            if not p.changed:
                _emit(args, doc, f"MIG config {selected!r}: the node matches")
                return EXIT_OK
            _emit(args, doc, problems_text(
                f"MIG config {selected!r}: the node does not match",
                [f"GPU {g.gpu.index}: {g.to_json()['diff']['before']} -> "
                 f"{g.to_json()['diff']['after']}" for g in p.changed_gpus]))
            return EXIT_MISMATCH
        pauser: hooks.PluginPause = hooks.NoPause()
        if args.pause_file:
            pauser = hooks.PauseFile(args.pause_file, plugin_pid=args.plugin_pid,
                                     plugin_pid_file=args.plugin_pid_file,
                                     ack_timeout=args.pause_ack_timeout)
        claims = (dra_claims.held_by_index(args.dra_checkpoint, discovery.gpu_minors())
                  if str(args.dra_checkpoint) not in ("", ".") and not args.force else {})
        with deadline.Deadline(args.timeout, lambda: _timed_out(args, selected, reporter,
                                                                pauser)):
            result = apply(configs, selected, backend, _reset_fn(args), force=args.force,
                           reporter=reporter, pauser=pauser, claims=claims,
                           excluded=dynamic)
        doc = {"command": "apply", **result.plan.to_json(), "changed": result.changed,
               "executed": [a.to_json() for a in result.executed],
               "skipped": [a.to_json() for a in result.skipped]}
        _emit(args, doc, apply_text(result))
        return EXIT_OK


def _timed_out(args: argparse.Namespace, selected: str, reporter: hooks.StateReporter | None,
               pauser: hooks.PluginPause) -> None:
    """The apply outlived --timeout (Deadline's watchdog thread): what is left of the node is
    served again and the failure is said, before the process ends."""
    problem = (f"MIG config {selected!r} did not finish within {args.timeout:g}s (--timeout): "
               "stopped; the plugin serves what the GPUs now have")
    if reporter is not None:
        reporter.report("failed", problem)
    pauser.resume()
    _say_failed(args, _Fail(EXIT_ERROR, "apply failed (rerun apply to converge)", [problem]))


def _say_failed(args: argparse.Namespace, fail: _Fail) -> None:
    """The failure on stderr, and with --json its document on stdout. Flushed: after a
    timeout the process ends by os._exit, which flushes nothing."""
    print(problems_text(fail.title, fail.problems), file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps({"command": args.command, "failed": True, "changed": False,
                          "exit_code": fail.code, "msg": problems_text(fail.title, fail.problems),
                          "problems": fail.problems}, indent=2), flush=True)


def main(argv: Sequence[str] | None = None, prog: str = "python -m gpukit.plugin.mig") -> int:
    """`prog`: the name --help and --version show (`gpukit mig` runs this too)."""
    args = build_parser(prog).parse_args(argv)
    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.WARNING),
                        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        return _run(args)
    except _Fail as e:
        fail = e
    except MigConfigError as e:
        fail = _Fail(EXIT_INVALID, "invalid MIG config", e.problems)
    except LayoutError as e:
        fail = _Fail(EXIT_INVALID, "the MIG layout cannot be applied to this node", e.problems)
    except (ProcessesRunning, ClaimsHeld, CheckpointError) as e:
        fail = _Fail(EXIT_ERROR, "refused", [str(e)])
    except (ApplyError, ResetError, nvml.NvmlError, OSError) as e:
        fail = _Fail(EXIT_ERROR, f"{args.command} failed (rerun apply to converge)"
                     if args.command == "apply" else f"{args.command} failed", [str(e)])
    _say_failed(args, fail)
    return fail.code
