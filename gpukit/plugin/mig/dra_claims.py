"""Which GPUs prepared DRA claims hold: the MIG manager must not change the layout of a GPU a
claim holds (a running pod's device would vanish under it), as it must not change one with GPU
processes, unless forced.

The DRA plugin's checkpoint (gpukit.plugin.dra.checkpoint, `gpukit-checkpoint.json`) lists
every prepared claim and its devices by NVIDIA's names: `gpu-<minor>` for a whole GPU,
`gpu-<minor>-mig-...` for a MIG device of that GPU. The minor is mapped to the GPU's NVML index
(gpukit.plugin.nvml.discovery.gpu_minors). `checkpoint.json` beside it counts too: an earlier
gpukit's (its plugin not restarted since an upgrade) or NVIDIA's DRA driver's completed claims
(gpukit.contracts.dra_checkpoint), which hold their GPUs as much until gpukit takes them over.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path

from gpukit.contracts import dra as names
from gpukit.contracts import dra_checkpoint as nvidia
from gpukit.contracts import dra_dynamic_mig

from ..dra.checkpoint import Checkpoint, CheckpointError, is_gpukit_format

DEFAULT_CHECKPOINT = Path(names.PLUGIN_DIR) / names.GPUKIT_CHECKPOINT_FILE


def _holders(path: Path) -> Iterator[tuple[str, str]]:
    """(claim, device name) of a checkpoint file, gpukit's format or NVIDIA's."""
    text = path.read_text()
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise CheckpointError(f"{path}: not a checkpoint of prepared claims: {exc}") from exc
    if nvidia.looks_like_nvidia(doc):
        try:
            completed = nvidia.parse(text, str(path)).completed()
        except nvidia.NvidiaCheckpointError as exc:
            raise CheckpointError(str(exc)) from exc
        for uid, c in completed.items():
            who = f"{c.namespace}/{c.name}" if c.name else f"uid {uid}"
            yield from ((f"{who} (NVIDIA's DRA driver)", d.device) for d in c.devices)
        return
    if not is_gpukit_format(doc):
        raise CheckpointError(f"{path}: neither gpukit's checkpoint nor NVIDIA's")
    for claim in Checkpoint(path).all().values():
        yield from ((f"{claim.namespace}/{claim.name}", d.device) for d in claim.devices)


def held_by_minor(checkpoint: Path) -> dict[int, tuple[str, ...]]:
    """GPU minor -> the claims (namespace/name) holding it or one of its MIG devices, from
    `checkpoint` and checkpoint.json beside it. No file: no claims. CheckpointError: a file
    exists but cannot be trusted (refuse, do not guess)."""
    out: dict[int, set[str]] = {}
    for path in dict.fromkeys([checkpoint, checkpoint.with_name(names.CHECKPOINT_FILE)]):
        if not path.is_file():
            continue
        for claim, device in _holders(path):
            if parsed := names.parse_device_name(device):
                out.setdefault(parsed.minor, set()).add(claim)
    return {minor: tuple(sorted(c)) for minor, c in sorted(out.items())}


def held_by_index(checkpoint: Path, minors: Mapping[int, int]) -> dict[int, tuple[str, ...]]:
    """As `held_by_minor`, keyed by NVML index (`minors`: minor -> index); a device on a minor
    no GPU has holds nothing the MIG manager could change."""
    return {minors[minor]: claims for minor, claims in held_by_minor(checkpoint).items()
            if minor in minors}



def dynamic_gpus(checkpoint: Path) -> dict[int, str]:
    """NVML index -> why the MIG manager leaves it alone, for each GPU the DRA plugin carves
    on demand (`gpukit-dynamic-mig.json` beside `checkpoint`, gpukit.contracts.dra_dynamic_mig).
    No file: none. CheckpointError: a file that cannot be trusted (refuse, do not guess)."""
    path = checkpoint.with_name(dra_dynamic_mig.OWNED_FILE)
    if not path.is_file():
        return {}
    try:
        owned = dra_dynamic_mig.parse_owned(path.read_text(), str(path))
    except dra_dynamic_mig.DynamicMigError as exc:
        raise CheckpointError(str(exc)) from exc
    return {i: f"GPU {i} ({uuid}) is carved on demand by the DRA plugin (dynamic MIG, "
               f"{dra_dynamic_mig.VARIABLE}; {path})" for i, uuid in owned.items()}
