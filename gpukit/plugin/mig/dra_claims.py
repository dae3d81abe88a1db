"""Which GPUs prepared DRA claims hold: the MIG manager must not change the layout of a GPU a
claim holds (a running pod's device would vanish under it), as it must not change one with GPU
processes, unless forced.

The DRA plugin's checkpoint (gpukit.plugin.dra.checkpoint, one file on the node) lists every
prepared claim and its devices by NVIDIA's names: `gpu-<minor>` for a whole GPU,
`gpu-<minor>-mig-...` for a MIG device of that GPU. The minor is mapped to the GPU's NVML index
(gpukit.plugin.nvml.discovery.gpu_minors).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from gpukit.contracts import dra as names

from ..dra.checkpoint import Checkpoint

DEFAULT_CHECKPOINT = Path(names.PLUGIN_DIR) / names.CHECKPOINT_FILE


def held_by_minor(checkpoint: Path) -> dict[int, tuple[str, ...]]:
    """GPU minor -> the claims (namespace/name) holding it or one of its MIG devices. No file:
    no claims. CheckpointError: the file exists but cannot be trusted (refuse, do not guess)."""
    out: dict[int, set[str]] = {}
    for claim in Checkpoint(checkpoint).all().values():
        for device in claim.devices:
            if parsed := names.parse_device_name(device.device):
                out.setdefault(parsed.minor, set()).add(f"{claim.namespace}/{claim.name}")
    return {minor: tuple(sorted(c)) for minor, c in sorted(out.items())}


def held_by_index(checkpoint: Path, minors: Mapping[int, int]) -> dict[int, tuple[str, ...]]:
    """As `held_by_minor`, keyed by NVML index (`minors`: minor -> index); a device on a minor
    no GPU has holds nothing the MIG manager could change."""
    return {minors[minor]: claims for minor, claims in held_by_minor(checkpoint).items()
            if minor in minors}

