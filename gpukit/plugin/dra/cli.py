"""`python -m gpukit.plugin.dra` / `gpukit dra`: the DRA kubelet plugin for driver
gpu.nvidia.com, as a DaemonSet container or a host process.

It needs the node's name (NODE_NAME), a Kubernetes API (in-cluster ServiceAccount, or
--kubeconfig) to read ResourceClaims and write the node's ResourceSlices, the kubelet's
plugins_registry/ and plugins/gpu.nvidia.com/ directories, and the CDI spec directory
containerd reads. On a DRA node it also serves the node agent's GPU metrics and /readyz
(--metrics-address; the kubelet's pod-resources socket for their pod labels) and reports, as
the agent does, whether the node serves its declaration (--declaration-dir). Signals:
SIGUSR1 rescans the GPUs (e.g. after a MIG change), SIGTERM/SIGINT stop cleanly (sockets
removed; prepared claims and their CDI specs stay for the next start).
Exit codes: 0 stopped, 1 startup failed.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading

from gpukit import __version__
from gpukit.contracts import dra_dynamic_mig as dynamic_mig
from gpukit.contracts.dra import CDI_DIR, MAX_SHARES, MIN_SHARES, PLUGIN_DIR, REGISTRY_DIR
from gpukit.contracts.label_names import DRA_SHARES
from gpukit.contracts.plugin_config import (
    DEFAULT_METRICS_ADDRESS,
    HealthSettings,
    parse_host_port,
)

from .. import metrics_auth
from ..mps_requests import MPS_DAEMON_MODES
from ..signals import INBOX, StopRequested, run_main

log = logging.getLogger("gpukit.plugin.dra")


def build_parser(prog: str = "gpukit-dra-plugin") -> argparse.ArgumentParser:
    env = os.environ.get
    p = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__)
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    p.add_argument("--node-name", default=env("NODE_NAME") or None,
                   help="this node: the pool's name and the slices' nodeName [NODE_NAME]")
    p.add_argument("--kubeconfig", default=env("KUBECONFIG") or None,
                   help="kubeconfig (default: in-cluster ServiceAccount) [KUBECONFIG]")
    p.add_argument("--nvml-library", default=env("GPUKIT_NVML_LIB") or None,
                   help="libnvidia-ml.so.1 to load [GPUKIT_NVML_LIB]")
    p.add_argument("--device-root", default=env("GPUKIT_DEVICE_ROOT", "/"),
                   help="host directory holding dev/nvidia* and the driver's files (CDI host "
                        "paths) [GPUKIT_DEVICE_ROOT]")
    p.add_argument("--device-root-in-plugin", default=env("GPUKIT_DEVICE_ROOT_IN_PLUGIN") or None,
                   help="where this process sees --device-root (default: the same) "
                        "[GPUKIT_DEVICE_ROOT_IN_PLUGIN]")
    p.add_argument("--proc-root", default=env("GPUKIT_PROC_ROOT", "/"),
                   help="where /proc/driver/nvidia is found, as <root>/proc/... "
                        "[GPUKIT_PROC_ROOT]")
    p.add_argument("--plugin-dir", default=env("GPUKIT_DRA_PLUGIN_DIR", PLUGIN_DIR),
                   help="the plugin's socket and checkpoint [GPUKIT_DRA_PLUGIN_DIR]")
    p.add_argument("--registry-dir", default=env("GPUKIT_DRA_REGISTRY_DIR", REGISTRY_DIR),
                   help="the kubelet's plugin registration directory [GPUKIT_DRA_REGISTRY_DIR]")
    p.add_argument("--cdi-spec-dir", default=env("GPUKIT_CDI_SPEC_DIR", CDI_DIR),
                   help="where claims' CDI specs go [GPUKIT_CDI_SPEC_DIR]")
    p.add_argument("--rescan-interval", type=float,
                   default=float(env("GPUKIT_DRA_RESCAN_SECONDS", "10")),
                   help="seconds between GPU rescans [GPUKIT_DRA_RESCAN_SECONDS]")
    p.add_argument("--health-recovery-seconds", type=float,
                   default=float(env("GPUKIT_RECOVERY_SECONDS", "60")),
                   help="seconds without a critical XID before a tainted device's taint is removed "
                        "[GPUKIT_RECOVERY_SECONDS]")
    p.add_argument("--health-probe-interval", type=float,
                   default=float(env("GPUKIT_HEALTH_PROBE_INTERVAL_SECONDS", "5")),
                   help="seconds between GPU probes [GPUKIT_HEALTH_PROBE_INTERVAL_SECONDS]")
    p.add_argument("--metrics-address", metavar="HOST:PORT",
                   default=env("GPUKIT_METRICS_ADDRESS", DEFAULT_METRICS_ADDRESS),
                   help="the GPU metrics and /readyz, as the node agent serves them; '' "
                        "disables [GPUKIT_METRICS_ADDRESS]")
    metrics_auth.add_flag(p, env)
    p.add_argument("--pod-resources-socket",
                   default=env("GPUKIT_POD_RESOURCES_SOCKET") or None,
                   help="the kubelet's PodResources socket (the metrics' pod labels; default "
                        "/var/lib/kubelet/pod-resources/kubelet.sock) "
                        "[GPUKIT_POD_RESOURCES_SOCKET]")
    p.add_argument("--mps-daemons", default=env("GPUKIT_MPS_DAEMONS", "own"),
                   help="who runs the MPS daemons of claims sharing with MPS: this process "
                        "(own), gpukit's MPS control container (delegate: the DaemonSet) or "
                        "nobody (none: such claims are refused) [GPUKIT_MPS_DAEMONS]")
    p.add_argument("--shares", type=int, default=env("GPUKIT_DRA_SHARES") or None,
                   help="claims sharing each device (consumable capacity), 0 for none; default: "
                        f"the node's label {DRA_SHARES} (gpukit_dra_shares) [GPUKIT_DRA_SHARES]")
    p.add_argument("--declaration-dir", default=env("GPUKIT_DECLARATION_DIR") or None,
                   help="directory of the nodes' declarations (a mounted ConfigMap, one entry "
                        "per node name): the plugin compares the healthy devices it publishes "
                        "with its own node's and reports a mismatch [GPUKIT_DECLARATION_DIR]")
    p.add_argument("--dynamic-mig", default=env("GPUKIT_DRA_DYNAMIC_MIG", ""),
                   help="GPUs carved into MIG devices on demand (partitionable devices): JSON, "
                        "GPU index -> profiles or \"all\", e.g. '{\"0\": [\"1g.10gb\"]}' "
                        "; default: the node's declaration entry (draDynamicMig, from "
                        "gpukit_dra_dynamic_mig) [GPUKIT_DRA_DYNAMIC_MIG]")
    p.add_argument("--log-level", default=env("GPUKIT_LOG_LEVEL", "INFO"))
    return p


def main(argv: list[str] | None = None, prog: str = "gpukit-dra-plugin") -> int:
    return run_main(_main, argv, prog)


def _main(argv: list[str] | None, prog: str) -> int:
    args = build_parser(prog).parse_args(argv)
    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.node_name:
        print("error: the node's name is needed (--node-name or NODE_NAME)", file=sys.stderr)
        return 1
    for flag in ("rescan_interval", "health_recovery_seconds", "health_probe_interval"):
        value = getattr(args, flag)
        if value <= 0:
            print(f"error: --{flag.replace('_', '-')}: {value} is not a positive number of "
                  "seconds", file=sys.stderr)
            return 1
    if args.mps_daemons not in MPS_DAEMON_MODES:
        print(f"error: --mps-daemons (GPUKIT_MPS_DAEMONS): {args.mps_daemons!r} is not one of "
              f"{', '.join(MPS_DAEMON_MODES)}", file=sys.stderr)
        return 1
    if args.shares not in (None, 0) and not MIN_SHARES <= args.shares <= MAX_SHARES:
        print(f"error: --shares: {args.shares} is not 0 or an integer from {MIN_SHARES} to "
              f"{MAX_SHARES}", file=sys.stderr)
        return 1
    if args.metrics_address:
        try:
            parse_host_port(args.metrics_address)
        except ValueError as exc:
            print(f"error: --metrics-address: {exc} (use host:port, or '' to disable)",
                  file=sys.stderr)
            return 1
    if (refused := metrics_auth.flag_error(args.metrics_auth)) is not None:
        print(refused, file=sys.stderr)
        return 1
    try:  # profiles are checked against each GPU's table when it is found
        dynamic = (dynamic_mig.parse(args.dynamic_mig, field="--dynamic-mig")
                   if args.dynamic_mig else None)
    except dynamic_mig.DynamicMigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    from gpukit.k8s import connect

    from .kubelet_plugin import DraKubeletPlugin, KubeletPluginOptions

    options = KubeletPluginOptions(
        node=args.node_name, nvml_library=args.nvml_library, device_root=args.device_root,
        device_root_in_plugin=args.device_root_in_plugin or args.device_root,
        proc_root=args.proc_root, plugin_dir=args.plugin_dir, registry_dir=args.registry_dir,
        cdi_dir=args.cdi_spec_dir, rescan_interval=args.rescan_interval,
        health=HealthSettings(recovery_seconds=args.health_recovery_seconds,
                              probe_interval_seconds=args.health_probe_interval),
        mps_daemons=args.mps_daemons, shares=args.shares,
        declaration_dir=args.declaration_dir,
        dynamic_mig=None if dynamic is None else {g.index: g.profiles for g in dynamic})
    if args.pod_resources_socket:
        options.pod_resources_socket = args.pod_resources_socket
    try:
        plugin = DraKubeletPlugin(options,
                                  connect.api_client(args.kubeconfig, in_cluster_first=True))
        plugin.start()
    except StopRequested:
        raise
    except Exception as exc:
        print(f"error: the DRA plugin for node {args.node_name} cannot start: {exc}",
              file=sys.stderr)
        return 1
    loop = threading.Thread(target=plugin.run, name="gpukit-dra", daemon=True)
    loop.start()
    if args.metrics_address:
        plugin.metrics.authorizer = metrics_auth.for_mode(args.metrics_auth, args.node_name,
                                                          args.kubeconfig)
    try:
        plugin.metrics.serve(args.metrics_address)
    except OSError as exc:  # claims are served all the same; only the metrics are missing
        log.error("metrics endpoint %s unavailable: %s", args.metrics_address, exc)
    try:
        INBOX.serve(plugin)
        log.info("stopping")
    finally:
        INBOX.starting = False
        plugin.stop()
        loop.join(timeout=5)
    return 0
