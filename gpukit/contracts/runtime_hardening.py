"""NVIDIA's runtime hardening and the device plugin strategies that still reach an unprivileged
container under it (`accept-nvidia-visible-devices-envvar-when-unprivileged = false`: the runtime
ignores NVIDIA_VISIBLE_DEVICES there). Shared by the declaration model (the preflight refuses a
config that would give unprivileged pods no GPU) and provisioning (`gpukit.provision.toolkit_config`
writes the runtime's config)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

OPT_OUT_VARIABLE = "gpukit_runtime_accept_envvar_unprivileged"
CONFIGS_VARIABLE = "gpukit_device_plugin_configs"
# Strategies that reach an unprivileged container under the hardening.
HARDENED_STRATEGIES = ("volume-mounts", "cdi-annotations", "cdi-cri")
NVIDIA_DEFAULT_STRATEGY = "envvar"  # a config that names none (NVIDIA's plugin, and gpukit's)


def _strategies(cfg: Mapping[str, Any]) -> tuple[tuple[str, ...], bool]:
    """(the config's strategies, whether it names them itself: else NVIDIA's default)."""
    flags = cfg.get("flags")
    plugin = flags.get("plugin") if isinstance(flags, Mapping) else None
    raw = plugin.get("deviceListStrategy") if isinstance(plugin, Mapping) else None
    if raw is None:
        return (NVIDIA_DEFAULT_STRATEGY,), False
    return ((raw,) if isinstance(raw, str) else tuple(str(r) for r in raw)), True


def unhardened_configs(configs: Mapping[str, Any] | None
                       ) -> list[tuple[str, tuple[str, ...], str]]:
    """The device plugin configs that would give unprivileged pods no GPU under the hardened
    runtime: (name, strategies, why) for each config using none of HARDENED_STRATEGIES."""
    if not isinstance(configs, Mapping):
        return []  # not a mapping: the device plugin role refuses it with its own message
    out = []
    for name, cfg in configs.items():
        if not isinstance(cfg, Mapping):
            continue
        strategies, explicit = _strategies(cfg)
        if not set(strategies) & set(HARDENED_STRATEGIES):
            where = "" if explicit else " (not set: NVIDIA's default)"
            out.append((str(name), strategies, (
                f"uses deviceListStrategy {','.join(strategies)}{where}, but {OPT_OUT_VARIABLE}"
                " is false (NVIDIA's hardening: the runtime ignores NVIDIA_VISIBLE_DEVICES in"
                " unprivileged containers), so unprivileged pods would get no GPU; set its"
                " flags.plugin.deviceListStrategy to volume-mounts, cdi-annotations or cdi-cri,"
                f" or set {OPT_OUT_VARIABLE}: true")))
    return out
