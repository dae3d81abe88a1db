"""Where the plugin's config comes from: a file, or a named config picked by node label, plus
command-line and environment overrides.

Named configs follow NVIDIA's config manager: a directory (a mounted ConfigMap) whose file names
are config names; the node label `nvidia.com/device-plugin.config` names the one to use, falling
back to `--default-config`, then to the only file if there is exactly one, then to built-in
defaults. A label naming a missing config is an error (the process keeps its current config).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpukit.contracts.label_names import DEVICE_PLUGIN_CONFIG
from gpukit.contracts.plugin_config import (
    Config,
    ConfigError,
    load_document,
    parse_config,
    set_path,
)

# NVIDIA k8s-device-plugin environment variables, then gpukit's own, mapped to config paths.
ENV_TO_PATH: dict[str, str] = {
    "MIG_STRATEGY": "flags.migStrategy",
    "FAIL_ON_INIT_ERROR": "flags.failOnInitError",
    "NVIDIA_DRIVER_ROOT": "flags.nvidiaDriverRoot",
    "PASS_DEVICE_SPECS": "flags.plugin.passDeviceSpecs",
    "DEVICE_LIST_STRATEGY": "flags.plugin.deviceListStrategy",
    "DEVICE_ID_STRATEGY": "flags.plugin.deviceIDStrategy",
    "CDI_ANNOTATION_PREFIX": "flags.plugin.cdiAnnotationPrefix",
    "GPUKIT_DEVICE_ROOT": "gpukit.deviceRoot",
    "GPUKIT_DEVICE_ROOT_IN_PLUGIN": "gpukit.deviceRootInPlugin",
    "GPUKIT_KUBELET_DIR": "gpukit.kubeletDir",
    "GPUKIT_CDI_SPEC_DIR": "gpukit.cdiSpecDir",
    "GPUKIT_METRICS_ADDRESS": "gpukit.metricsAddress",
    "GPUKIT_REPLICA_POLICY": "gpukit.replicaPolicy",
    "GPUKIT_RESCAN_INTERVAL_SECONDS": "gpukit.rescanIntervalSeconds",
    "GPUKIT_IGNORED_XIDS": "gpukit.health.ignoredXids",
    "GPUKIT_RECOVERY_SECONDS": "gpukit.health.recoverySeconds",
    "GPUKIT_HEALTH_PROBE_INTERVAL_SECONDS": "gpukit.health.probeIntervalSeconds",
}
# Paths whose string values (from env or flags) are numbers.
_NUMERIC_PATHS = {
    "gpukit.rescanIntervalSeconds",
    "gpukit.health.recoverySeconds",
    "gpukit.health.probeIntervalSeconds",
}
CONFIG_SUFFIXES = ("", ".yaml", ".yml", ".json")


@dataclass(frozen=True)
class Override:
    path: str
    value: Any
    origin: str  # e.g. "env MIG_STRATEGY" or "flag --mig-strategy"


def coerce(path: str, value: Any) -> Any:
    """Turn flag/env strings into numbers or null where the schema wants them."""
    if path in _NUMERIC_PATHS and isinstance(value, str):
        if value.strip().lower() in ("never", "null", "none"):
            return None
        try:
            return float(value)
        except ValueError:
            return value  # validation reports it with its origin
    return value


def env_overrides(environ: Mapping[str, str] | None = None) -> list[Override]:
    env = os.environ if environ is None else environ
    return [
        Override(path, coerce(path, env[name]), f"env {name}")
        for name, path in ENV_TO_PATH.items()
        if env.get(name, "") != ""
    ]


def apply_overrides(
    doc: Mapping[str, Any], overrides: list[Override]
) -> tuple[dict[str, Any], dict[str, str]]:
    """Later overrides win; returns the merged document and path -> origin for messages."""
    out: dict[str, Any] = dict(doc)
    origins: dict[str, str] = {}
    for ov in overrides:
        set_path(out, ov.path, ov.value)
        origins[ov.path] = ov.origin
    return out, origins


def find_named_config(config_dir: Path, name: str) -> Path | None:
    for suffix in CONFIG_SUFFIXES:
        candidate = config_dir / f"{name}{suffix}"
        if candidate.is_file():
            return candidate
    return None


def list_named_configs(config_dir: Path) -> list[str]:
    try:
        entries = sorted(config_dir.iterdir())
    except OSError:
        return []
    # ConfigMap mounts add hidden ..data links; skip dotfiles.
    return [p.name for p in entries if p.is_file() and not p.name.startswith(".")]


LabelReader = Callable[[str], Mapping[str, str]]


@dataclass(frozen=True)
class LoadedConfig:
    config: Config
    name: str  # the named config in use, or "" for a plain file / defaults
    path: Path | None
    # The file's document before overrides: what the last-good record keeps, so that a
    # restart re-applies the overrides of the pod it starts in.
    document: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class ConfigSource:
    config_file: Path | None = None
    config_dir: Path | None = None
    default_config: str | None = None
    node_name: str | None = None
    overrides: list[Override] = field(default_factory=list)
    label_reader: LabelReader | None = None

    def selected(self) -> tuple[str, Path | None]:
        """(config name, file) to use now; raises ConfigError when the choice is impossible."""
        if self.config_file is not None:
            return "", self.config_file
        if self.config_dir is None:
            return "", None
        wanted = ""
        if self.node_name and self.label_reader is not None:
            wanted = self.label_reader(self.node_name).get(DEVICE_PLUGIN_CONFIG, "")
        available = list_named_configs(self.config_dir)
        if wanted:
            path = find_named_config(self.config_dir, wanted)
            if path is None:
                raise ConfigError(
                    [f"node label {DEVICE_PLUGIN_CONFIG}={wanted!r} names no config in "
                     f"{self.config_dir} (available: {', '.join(available) or 'none'})"]
                )
            return wanted, path
        if self.default_config:
            path = find_named_config(self.config_dir, self.default_config)
            if path is None:
                raise ConfigError(
                    [f"default config {self.default_config!r} is not in {self.config_dir} "
                     f"(available: {', '.join(available) or 'none'})"]
                )
            return self.default_config, path
        if len(available) == 1:
            return available[0], self.config_dir / available[0]
        return "", None

    def load(self) -> LoadedConfig:
        """The selected config, read now. Whatever goes wrong is a ConfigError, so that the
        agent takes its last-good path (issue 30: a UnicodeDecodeError was no ConfigError and
        crash-looped the agent, the node at 0 GPUs)."""
        path: Path | None = None
        try:
            name, path = self.selected()
            doc = load_document(path) if path is not None else {}
            return self.resolve(doc, name, path)
        except ConfigError:
            raise
        except Exception as exc:  # a surprise in reading or parsing, not a reason for 0 GPUs
            detail = " ".join(str(exc).split())[:200]
            raise ConfigError([f"cannot be loaded: {type(exc).__name__}: {detail}"],
                              str(path) if path else "") from exc

    def resolve(self, doc: Mapping[str, Any], name: str, path: Path | None) -> LoadedConfig:
        """A document (read now, or the last good one kept on the node) with this process's
        overrides applied, validated."""
        merged, origins = apply_overrides(doc, self.overrides)
        config = parse_config(merged, str(path) if path else "", origins)
        return LoadedConfig(config=config, name=name, path=path, document=dict(doc))

    def fingerprint(self) -> tuple[Any, ...]:
        """Changes when a reload could give a different config (label or file content)."""
        try:
            name, path = self.selected()
        except ConfigError as exc:
            return ("error", str(exc))
        if path is None:
            return (name, None)
        try:
            st = path.stat()
        except OSError:
            return (name, str(path), None)
        return (name, str(path), st.st_mtime_ns, st.st_size, st.st_ino)

