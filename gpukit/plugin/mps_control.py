"""gpukit's MPS control container: runs the MPS daemons the node's plugins ask for.

`python -m gpukit.plugin.mps_control` in the privileged container of DaemonSet
gpukit-mps-control (gpukit.agent_manifests.mps_daemonset): it reads the requests the agent and
the DRA plugin write under the MPS root (gpukit.plugin.mps_requests), starts, checks, restarts
and stops the daemons with gpukit.plugin.mps_daemons (compute mode through NVML), and writes
each daemon's status beside it. A daemon nothing asks for is stopped, its GPUs' compute mode
restored. On SIGTERM it quits every daemon (the requests stay, so the next container starts
them again); the daemons would die with the container anyway, this lets their GPUs go back to
DEFAULT compute mode.

The control binary is the driver's (`nvidia-cuda-mps-control` under the driver root, run with
the driver's libraries), as NVIDIA's mps-control-daemon runs it.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence

from gpukit.contracts.plugin_config import DEFAULT_MPS_ROOT

from . import nvml
from .mps_daemons import CONTROL_BINARY, KEY_PREFIXES, MpsDaemons, MpsError
from .mps_requests import DaemonStatus, read_requests, write_status
from .nvml import compute_mode

log = logging.getLogger("gpukit.mps-control")

# Requests are read this often; the daemons are asked whether they answer every CHECK_SECONDS.
POLL_SECONDS = 0.5
CHECK_SECONDS = 10.0


def serve_once(daemons: MpsDaemons, root: str) -> None:
    """One pass: the daemons are exactly the requested ones; each request's status written."""
    specs, bad = read_requests(root)
    for why in bad.values():
        log.error("%s", why)
    problems = daemons.reconcile(root, specs, KEY_PREFIXES)
    for key, spec in specs.items():
        why = problems.get(key, "")
        try:
            write_status(root, key, DaemonStatus(spec, serving=not why, problem=why))
        except OSError as exc:
            log.error("MPS daemon %s: cannot write its status: %s", key, exc)


def stop_all(daemons: MpsDaemons, root: str) -> None:
    for key in sorted(daemons.running):
        try:
            daemons.stop(root, key)
        except MpsError as exc:
            log.error("%s", exc)


def requests_fingerprint(root: str) -> tuple[tuple[str, float], ...]:
    folder = os.path.join(root, "requests")
    try:
        with os.scandir(folder) as entries:
            return tuple(sorted((e.name, e.stat().st_mtime) for e in entries))
    except OSError:
        return ()


def run(daemons: MpsDaemons, root: str, stop: threading.Event,
        clock: Callable[[], float] = time.monotonic) -> None:
    """Serve until `stop` is set: a pass whenever the requests change, and every
    CHECK_SECONDS to restart a daemon that stopped answering."""
    seen: tuple[tuple[str, float], ...] | None = None
    next_check = 0.0
    while not stop.is_set():
        now = clock()
        current = requests_fingerprint(root)
        if current != seen or now >= next_check:
            serve_once(daemons, root)
            seen, next_check = current, now + CHECK_SECONDS
        stop.wait(POLL_SECONDS)
    stop_all(daemons, root)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    env = os.environ.get
    p = argparse.ArgumentParser(prog="gpukit-mps-control", description=__doc__.split("\n")[0])
    p.add_argument("--mps-root", default=env("GPUKIT_MPS_ROOT", DEFAULT_MPS_ROOT),
                   help="the MPS root the plugins share [GPUKIT_MPS_ROOT]")
    p.add_argument("--control-binary", default=env("GPUKIT_MPS_CONTROL_BINARY", CONTROL_BINARY),
                   help="the driver's nvidia-cuda-mps-control [GPUKIT_MPS_CONTROL_BINARY]")
    p.add_argument("--nvml-library", default=env("GPUKIT_NVML_LIB") or None,
                   help="libnvidia-ml.so.1 to load [GPUKIT_NVML_LIB]")
    p.add_argument("--log-level", default=env("GPUKIT_LOG_LEVEL", "INFO"))
    return p.parse_args(list(argv))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.nvml_library:
        nvml.load_library(args.nvml_library)
    nvml.init()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda _s, _f: stop.set())
    daemons = MpsDaemons(compute_mode.set_exclusive, control_binary=args.control_binary)
    log.info("serving MPS daemon requests under %s with %s", args.mps_root, args.control_binary)
    run(daemons, args.mps_root, stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
