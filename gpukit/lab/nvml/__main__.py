"""Control the lab's mock GPUs: ``python -m gpukit.lab.nvml COMMAND``.

Works on the state directory of the node (``--state-dir``, else $GPUKIT_NVML_STATE_DIR, else
/var/lib/gpukit-lab/nvml) through the mock library itself (``--lib``, else $GPUKIT_NVML_LIB,
else the repository build, else the system's libnvidia-ml.so.1, which on lab nodes is the mock;
the real NVIDIA library is refused).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

from gpukit.lab import nvml
from gpukit.lab.nvml.control import EVENT_TYPES, MockControl, MockNvmlError, NotTheMockError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m gpukit.lab.nvml",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--lib", help="the mock libnvidia-ml.so.1 to use")
    p.add_argument("--profile", help="node GPU profile (name in gpukit/lab/profiles or path)")
    p.add_argument("--state-dir", help="device state directory")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sub.add_parser("status", help="print the profile and device state as JSON")
    x = sub.add_parser("inject-xid", help="raise an XID (or ECC) event on a GPU")
    x.add_argument("--gpu", type=int, required=True)
    x.add_argument("--xid", type=int, required=True, help="the XID (event data)")
    x.add_argument("--gi", type=int, help="GPU instance the error belongs to (MIG)")
    x.add_argument("--ci", type=int, help="compute instance the error belongs to (MIG)")
    x.add_argument("--type", choices=sorted(EVENT_TYPES), default="xid", help="event type")
    for name, text in (
        ("lose", "the GPU falls off the bus (GPU_IS_LOST)"),
        ("restore", "a lost GPU comes back"),
        ("reset", "nvidia-smi -r: apply pending MIG mode (refused while busy)"),
    ):
        sp = sub.add_parser(name, help=text)
        sp.add_argument("--gpu", type=int, required=True)
    sp = sub.add_parser("set-processes", help="add or update a compute process on a GPU")
    sp.add_argument("--gpu", type=int, required=True)
    sp.add_argument("--pid", type=int, required=True)
    sp.add_argument("--mem-mb", type=int, default=0, help="GPU memory it uses, MiB")
    sp.add_argument("--gi", type=int, help="GPU instance it runs in (MIG)")
    sp.add_argument("--ci", type=int, help="compute instance it runs in (MIG)")
    sp.add_argument("--name", help="process name")
    sp.add_argument("--util", type=int, default=100,
                    help="%% of its GPU (or MIG instance) it keeps busy (default 100)")
    cp = sub.add_parser("clear-processes", help="remove processes (all, one GPU's, or one pid)")
    cp.add_argument("--gpu", type=int)
    cp.add_argument("--pid", type=int)
    sub.add_parser("boot", help="host boot: reset every GPU, drop processes, restore lost GPUs")
    sub.add_parser("profiles", help="list the node profiles in gpukit/lab/profiles")
    ep = sub.add_parser("env", help="print shell exports selecting a profile and state dir")
    ep.add_argument("name", help="profile name or path")
    ep.add_argument("state_dir")
    bp = sub.add_parser("build", help="build the library (make), print its path")
    bp.add_argument("--out", help="output directory (default: build/nvml)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "profiles":
        print("\n".join(nvml.profiles()))
        return 0
    if args.command == "build":
        from pathlib import Path

        print(nvml.build(Path(args.out) if args.out else None))
        return 0
    if args.command == "env":
        import shlex

        for key in (nvml.ENV_PROFILE, nvml.ENV_STATE_DIR):
            value = str(nvml.profile_path(args.name)) if key == nvml.ENV_PROFILE else args.state_dir
            print(f"export {key}={shlex.quote(value)}")
        return 0

    try:
        ctl = MockControl(
            args.lib,
            profile=nvml.profile_path(args.profile) if args.profile else None,
            state_dir=args.state_dir,
        )
        ops: dict[str, Callable[[], object]] = {
            "status": lambda: print(json.dumps(ctl.status(), indent=2)),
            "inject-xid": lambda: ctl.inject_xid(args.gpu, args.xid, args.gi, args.ci, args.type),
            "lose": lambda: ctl.lose(args.gpu),
            "restore": lambda: ctl.restore(args.gpu),
            "reset": lambda: ctl.reset(args.gpu),
            "set-processes": lambda: ctl.set_process(
                args.gpu, args.pid, args.mem_mb, args.gi, args.ci, args.name, args.util
            ),
            "clear-processes": lambda: ctl.clear_processes(args.gpu, args.pid),
            "boot": ctl.boot,
        }
        ops[args.command]()
    except (MockNvmlError, NotTheMockError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
