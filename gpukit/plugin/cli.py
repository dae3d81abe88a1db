"""`python -m gpukit.plugin` / `gpukit-device-plugin`: run the device plugin as a host process or
in a DaemonSet.

Flags use NVIDIA's names where NVIDIA has one (--mig-strategy, --fail-on-init-error, ...), and
NVIDIA's environment variables work too (MIG_STRATEGY, FAIL_ON_INIT_ERROR, ...). Precedence:
flag > environment > config file > default. Signals: SIGHUP reloads the config, SIGUSR1
re-enumerates devices (e.g. after a MIG change), SIGTERM/SIGINT stop cleanly (sockets removed),
also while starting and whichever thread the kernel hands them to (signals.py).
Exit codes: 0 stopped cleanly, 1 startup failed (failOnInitError), 2 invalid config.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from dataclasses import asdict
from pathlib import Path

from gpukit import __version__
from gpukit.contracts.plugin_config import ConfigError

from . import metrics_auth
from .config_source import ConfigSource, Override, coerce, env_overrides
from .signals import INBOX, run_main

log = logging.getLogger("gpukit.plugin")

# flag dest -> config path (flags override env and file)
FLAG_TO_PATH = {
    "mig_strategy": "flags.migStrategy",
    "fail_on_init_error": "flags.failOnInitError",
    "nvidia_driver_root": "flags.nvidiaDriverRoot",
    "pass_device_specs": "flags.plugin.passDeviceSpecs",
    "device_list_strategy": "flags.plugin.deviceListStrategy",
    "device_id_strategy": "flags.plugin.deviceIDStrategy",
    "device_root": "gpukit.deviceRoot",
    "device_root_in_plugin": "gpukit.deviceRootInPlugin",
    "kubelet_dir": "gpukit.kubeletDir",
    "cdi_spec_dir": "gpukit.cdiSpecDir",
    "metrics_address": "gpukit.metricsAddress",
    "replica_policy": "gpukit.replicaPolicy",
}


def build_parser(prog: str = "gpukit-device-plugin") -> argparse.ArgumentParser:
    env = os.environ.get
    p = argparse.ArgumentParser(
        prog=prog, description="Kubernetes device plugin for NVIDIA GPUs",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__,
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    src = p.add_argument_group("config source")
    src.add_argument("--config-file", type=Path, default=env("CONFIG_FILE") or None,
                     help="one config file (NVIDIA v1 schema) [CONFIG_FILE]")
    src.add_argument("--config-dir", type=Path, default=env("GPUKIT_CONFIG_DIR") or None,
                     help="directory of named configs (a mounted ConfigMap); the node label "
                     "nvidia.com/device-plugin.config picks one [GPUKIT_CONFIG_DIR]")
    src.add_argument("--default-config", default=env("DEFAULT_CONFIG") or None,
                     help="named config when the node has no label [DEFAULT_CONFIG]")
    src.add_argument("--node-name", default=env("NODE_NAME") or None,
                     help="this node, for label-selected configs and labels [NODE_NAME]")
    src.add_argument("--kubeconfig", default=env("KUBECONFIG") or None,
                     help="kubeconfig (default: in-cluster ServiceAccount) [KUBECONFIG]")
    ov = p.add_argument_group("settings (override the config file)")
    ov.add_argument("--mig-strategy", choices=("none", "single", "mixed"))
    ov.add_argument("--fail-on-init-error", metavar="BOOL")
    ov.add_argument("--nvidia-driver-root", metavar="DIR")
    ov.add_argument("--pass-device-specs", metavar="BOOL")
    ov.add_argument("--device-list-strategy", metavar="LIST",
                    help="envvar,volume-mounts,cdi-annotations,cdi-cri (comma-separated)")
    ov.add_argument("--device-id-strategy", choices=("uuid", "index"))
    ov.add_argument("--device-root", metavar="DIR",
                    help="host directory holding dev/nvidia* (DeviceSpec and CDI host paths)")
    ov.add_argument("--device-root-in-plugin", metavar="DIR",
                    help="where this process sees --device-root (default: the same)")
    ov.add_argument("--kubelet-dir", metavar="DIR",
                    help="kubelet device plugin dir (default /var/lib/kubelet/device-plugins)")
    ov.add_argument("--cdi-spec-dir", metavar="DIR")
    ov.add_argument("--metrics-address", metavar="HOST:PORT",
                    help="Prometheus endpoint (default 127.0.0.1:9402; '' disables)")
    ov.add_argument("--replica-policy", choices=("distributed", "packed"))
    rt = p.add_argument_group("runtime")
    rt.add_argument("--nvml-library", default=env("GPUKIT_NVML_LIB") or None,
                    help="path of libnvidia-ml.so.1 to load (e.g. the lab mock) [GPUKIT_NVML_LIB]")
    rt.add_argument("--labels-file", default=env("GPUKIT_LABELS_FILE") or None,
                    help="also write GFD labels to this feature file [GPUKIT_LABELS_FILE]")
    rt.add_argument("--node-labels", action="store_true",
                    default=env("GPUKIT_NODE_LABELS", "") in ("1", "true"),
                    help="patch GFD labels onto --node-name [GPUKIT_NODE_LABELS]")
    rt.add_argument("--pause-file", default=env("GPUKIT_PLUGIN_PAUSE_FILE",
                                                "/run/gpukit/plugin.pause"),
                    help="MIG manager pause file ('' disables) [GPUKIT_PLUGIN_PAUSE_FILE]")
    rt.add_argument("--last-good-config",
                    default=env("GPUKIT_LAST_GOOD_CONFIG",
                                "/var/lib/gpukit/agent/last-good-config.json"),
                    help="record of the last config served, used when a restart meets an "
                         "invalid one ('' disables) [GPUKIT_LAST_GOOD_CONFIG]")
    rt.add_argument("--declaration-dir", default=env("GPUKIT_DECLARATION_DIR") or None,
                    help="directory of the nodes' declarations (a mounted ConfigMap, one "
                         "entry per node name): the agent compares what it serves with its "
                         "own node's and reports a mismatch [GPUKIT_DECLARATION_DIR]")
    rt.add_argument("--proc-root", default=env("GPUKIT_PROC_ROOT", "/"),
                    help="where the driver's /proc/driver/nvidia is found, as <root>/proc/..."
                         " (MIG capability files; default: the container's own /proc) "
                         "[GPUKIT_PROC_ROOT]")
    rt.add_argument("--mps-daemons", default=env("GPUKIT_MPS_DAEMONS", "own"),
                    help="who runs the MPS daemons of a config sharing with MPS: this process "
                         "(own: a host service) or gpukit's MPS control container (delegate: "
                         "the DaemonSet) [GPUKIT_MPS_DAEMONS]")
    metrics_auth.add_flag(rt, env)
    rt.add_argument("--check-config", action="store_true",
                    help="print the resolved config as JSON and exit (2 if invalid)")
    rt.add_argument("--log-level", default=env("GPUKIT_LOG_LEVEL", "INFO"))
    return p


def overrides_from(args: argparse.Namespace) -> list[Override]:
    flags = [
        Override(path, coerce(path, getattr(args, dest)), f"flag --{dest.replace('_', '-')}")
        for dest, path in FLAG_TO_PATH.items()
        if getattr(args, dest) is not None
    ]
    return env_overrides() + flags


def main(argv: list[str] | None = None, prog: str = "gpukit-device-plugin") -> int:
    """`prog`: the name --help and --version show (`gpukit plugin` runs this too)."""
    return run_main(_main, argv, prog)


def _main(argv: list[str] | None, prog: str) -> int:
    args = build_parser(prog).parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.mps_daemons not in ("own", "delegate"):
        print(f"error: --mps-daemons (GPUKIT_MPS_DAEMONS): {args.mps_daemons!r} is not one of "
              "own, delegate", file=sys.stderr)
        return 2
    if (refused := metrics_auth.flag_error(args.metrics_auth)) is not None:
        print(refused, file=sys.stderr)
        return 2
    source = ConfigSource(
        config_file=args.config_file, config_dir=args.config_dir,
        default_config=args.default_config, node_name=args.node_name,
        overrides=overrides_from(args),
    )
    if args.check_config:
        try:
            loaded = source.load()
        except ConfigError as exc:
            print(exc, file=sys.stderr)
            return 2
        print(json.dumps(asdict(loaded.config), indent=2, default=str))
        return 0
    # NVML starts initialising now, while the rest of the agent is imported (nvml_backend.py).
    from .nvml_backend import PynvmlBackend

    backend = PynvmlBackend(args.nvml_library)
    backend.init_early()
    from .manager import InitError, ManagerOptions, PluginManager
    from .metrics import PluginMetrics

    node_client = None
    if args.node_name and (args.config_dir or args.node_labels or args.declaration_dir):
        from .node_api import NodeClient

        try:
            node_client = NodeClient(args.kubeconfig)
        except Exception as exc:
            print(f"error: cannot reach the Kubernetes API for node {args.node_name}: {exc}",
                  file=sys.stderr)
            return 1
        source.label_reader = node_client.labels
    metrics = PluginMetrics()
    manager = PluginManager(
        source, backend, metrics,
        ManagerOptions(proc_root=args.proc_root, labels_file=args.labels_file,
                       node_labels=args.node_labels, pause_file=args.pause_file or None,
                       last_good_file=args.last_good_config or None,
                       declaration_dir=args.declaration_dir,
                       mps_daemons=args.mps_daemons),
        node_client=node_client,
    )
    try:
        try:
            manager.start()
        except ConfigError as exc:
            print(exc, file=sys.stderr)
            return 2
        except InitError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        if manager.config.gpukit.metrics_address:
            metrics.authorizer = metrics_auth.for_mode(args.metrics_auth, args.node_name,
                                                       args.kubeconfig)
        try:
            metrics.serve(manager.config.gpukit.metrics_address)
        except (OSError, ValueError) as exc:
            log.error("metrics endpoint %s unavailable: %s",
                      manager.config.gpukit.metrics_address, exc)
        INBOX.serve(manager)
        log.info("stopping")
    finally:
        INBOX.starting = False  # a second SIGTERM must not cut the cleanup short
        manager.stop()
    return 0
