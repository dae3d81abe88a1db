"""Claims NVIDIA's DRA driver prepared on this node, found at start in its checkpoint
(`checkpoint.json` beside gpukit's own file; format: gpukit.contracts.dra_checkpoint).

A node moved from NVIDIA's DRA driver to gpukit's may still run pods whose claims NVIDIA's
plugin prepared. Before serving the kubelet, gpukit takes over each completed claim it can
prove safe: its devices are this node's, each the same GPU or MIG device (UUID) gpukit
publishes under that name, with the CDI devices gpukit would give it; the claim's allocation
names the same devices; its opaque configs are ones gpukit serves; nothing of it runs through a
process of NVIDIA's (an MPS control daemon) or is a kind gpukit does not serve (VFIO). Such a
claim goes into gpukit's checkpoint as prepared, its spec file NVIDIA's
(`k8s.gpu.nvidia.com-claim_<uid>.yaml`, the same CDI device names): running containers keep what
they have, a restarted one gets the same, and gpukit's unprepare removes it.

Any other claim (one NVIDIA's plugin did not finish preparing, an MPS claim, a device that
changed...) is refused by name: one log line and a Warning Event on the node list each with
why, gpukit leaves its entry, its CDI spec and NVIDIA's file as they are, and answers the
kubelet's prepare and unprepare for it with that reason (Preparer.not_taken). A file gpukit
cannot read or trust is refused the same way as a whole; its claims are then known by their
NVIDIA CDI spec files (Preparer refuses a claim whose spec is NVIDIA's and not taken over).

Once every claim of the file is taken over, the file is renamed `checkpoint.json.taken-over-by-
gpukit` (NVIDIA's plugin, started again later, begins with a checkpoint of its own: it never
reads gpukit's state). A file whose claims are from an earlier boot (its nodeBootID) holds
nothing prepared now and is left alone, as NVIDIA's plugin would invalidate it.
gpukit never writes NVIDIA's file.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpukit.contracts import dra_checkpoint as nv
from gpukit.contracts import dra_claim_config as opaque
from gpukit.contracts.dra import DRIVER

from . import claim_cdi
from .checkpoint import Checkpoint, PreparedClaim, PreparedDevice, sync_dir
from .slice_devices import SliceDevice

log = logging.getLogger(__name__)
TAKEN_SUFFIX = ".taken-over-by-gpukit"
LOCK_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Takeover:
    """What start found of NVIDIA's: the claims taken over, those refused (UID -> why, one
    line naming the claim), a problem with the file as a whole ('' none)."""

    taken: tuple[PreparedClaim, ...] = ()
    refused: Mapping[str, str] = field(default_factory=dict)
    file_problem: str = ""
    moved_to: str = ""  # where NVIDIA's file went once all of it was taken over

    def summary(self) -> tuple[str, str]:
        """(taken line, refused line) for the log and the node's Events; '' for none."""
        taken = ""
        if self.taken:
            taken = (f"took over {len(self.taken)} claim(s) NVIDIA's DRA driver prepared: "
                     + "; ".join(f"{c.namespace}/{c.name} (uid {c.uid}: "
                                 f"{', '.join(d.device for d in c.devices)})"
                                 for c in self.taken))
            if self.moved_to:
                taken += f"; its checkpoint moved to {self.moved_to}"
        refused = ""
        if self.file_problem:
            refused = (f"NVIDIA's DRA checkpoint not taken over, left as it is: "
                       f"{self.file_problem}; gpukit refuses to prepare or unprepare the claims "
                       "NVIDIA's CDI specs name")
        elif self.refused:
            refused = (f"{len(self.refused)} claim(s) NVIDIA's DRA driver prepared are not "
                       "taken over, left as they are (its checkpoint and their CDI specs "
                       "untouched; gpukit refuses to prepare or unprepare them): "
                       + "; ".join(self.refused[u] for u in sorted(self.refused)))
        return taken, refused


def current_boot_id(path: str = nv.BOOT_ID_FILE) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


@contextmanager
def nvidia_lock(plugin_dir: Path, timeout: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """NVIDIA's plugin's lock around its checkpoint (flock on cp.lock), held while reading
    and moving the file: a plugin of NVIDIA's running here too cannot write it meanwhile."""
    path = plugin_dir / nv.LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"{path} held by another process for {timeout:.0f} s "
                                       "(NVIDIA's plugin running on this node?)") from None
                time.sleep(0.1)
        yield
    finally:
        os.close(fd)  # releases the lock


def claim_problem(claim: nv.NvidiaClaim, node: str, devices: Mapping[str, SliceDevice]
                  ) -> str:
    """Why gpukit cannot take this completed claim over ('' when it can)."""
    if claim.unknown:
        return f"holds what gpukit does not know: {', '.join(claim.unknown)}"
    if not claim.name or not claim.namespace:
        return "its entry records no name and namespace (NVIDIA's v1 checkpoint)"
    if claim.mps_daemons:
        return (f"shares its GPUs through NVIDIA's MPS control daemon(s) "
                f"{', '.join(claim.mps_daemons)}, which gpukit does not run")
    if not claim.devices:
        return "no prepared device recorded"
    for d in claim.devices:
        if d.kind == nv.VFIO:
            return f"device {d.device} is a VFIO passthrough device, which gpukit does not serve"
        if d.pool != node:
            return f"device {d.device} is of pool {d.pool!r}, this node's pool is {node!r}"
        ours = devices.get(d.device)
        if ours is None:
            return (f"device {d.device} is not among this node's devices now: "
                    f"{', '.join(sorted(devices)) or 'none'}")
        if ours.unit.uuid != d.uuid:
            return (f"device {d.device} is {d.uuid or 'no UUID'} in NVIDIA's checkpoint, "
                    f"{ours.unit.uuid} on this node now")
        want = (claim_cdi.device_id(claim.uid, d.device),)
        if d.cdi_device_ids != want:
            return (f"device {d.device} has CDI devices {list(d.cdi_device_ids)}, gpukit's "
                    f"would be {list(want)}")
    allocation = claim.status.get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    allocated = sorted({str(r.get("device")) for r in results
                        if r.get("driver") == DRIVER and r.get("pool") == node})
    prepared = sorted({d.device for d in claim.devices})
    if allocated != prepared:
        return f"its allocation names {allocated or 'no device of this node'}, NVIDIA " \
               f"prepared {prepared}"
    try:
        configs = opaque.configs_by_request((allocation.get("devices") or {}).get("config")
                                            or [], {r for d in claim.devices for r in d.requests})
        for d in claim.devices:
            for request in d.requests:
                cfg = configs.get(request)
                if cfg is None:
                    continue
                opaque.check_kind(f"request {request}, device {d.device}", cfg,
                                  devices[d.device].unit.mig is not None)
                if cfg.sharing is not None and cfg.sharing.strategy == opaque.MPS:
                    return f"request {request} shares through MPS, whose daemon NVIDIA's " \
                           "driver runs"
    except opaque.ConfigError as exc:
        return f"its config: {exc}"
    return ""


def adopted(claim: nv.NvidiaClaim) -> PreparedClaim:
    """The claim as gpukit's checkpoint records it: NVIDIA's spec file and CDI devices."""
    requests: dict[str, list[str]] = {}
    cdi_ids: dict[str, tuple[str, ...]] = {}
    shares: dict[str, list[str]] = {}
    pools: dict[str, str] = {}
    for d in claim.devices:
        requests.setdefault(d.device, []).extend(d.requests)
        cdi_ids.setdefault(d.device, d.cdi_device_ids)
        pools.setdefault(d.device, d.pool)
        if d.share_id:
            shares.setdefault(d.device, []).append(d.share_id)
    devices = tuple(PreparedDevice(tuple(dict.fromkeys(r)), pools[name], name, cdi_ids[name],
                                   tuple(shares.get(name, ())))
                    for name, r in requests.items())  # fmt: skip
    return PreparedClaim(claim.uid, claim.namespace, claim.name, devices,
                         nv.spec_file(claim.uid))


def take_over(plugin_dir: Path, checkpoint: Checkpoint, node: str,
              devices: Mapping[str, SliceDevice],
              boot_id: Callable[[], str] = current_boot_id,
              lock_timeout: float = LOCK_TIMEOUT_S) -> Takeover:
    """Take over what NVIDIA's checkpoint in `plugin_dir` holds that is safe (module doc).
    Never raises for NVIDIA's file: what cannot be taken is in the answer."""
    path = plugin_dir / nv.FILE
    if not path.exists():
        return Takeover()
    try:
        with nvidia_lock(plugin_dir, lock_timeout):
            try:
                text = path.read_text()
            except FileNotFoundError:
                return Takeover()
            try:
                doc: Any = json.loads(text)
            except ValueError:
                doc = None
            if not nv.looks_like_nvidia(doc):
                return Takeover(file_problem=f"{path}: neither NVIDIA's checkpoint nor gpukit's")
            found = nv.parse(text, str(path))
            return _take(path, found, checkpoint, node, devices, boot_id())
    except (nv.NvidiaCheckpointError, OSError, TimeoutError) as exc:
        return Takeover(file_problem=str(exc))


def _take(path: Path, found: nv.NvidiaCheckpoint, checkpoint: Checkpoint, node: str,
          devices: Mapping[str, SliceDevice], boot: str) -> Takeover:
    if found.boot_id and boot and found.boot_id != boot:
        log.info("%s: NVIDIA's checkpoint of an earlier boot (%s, now %s): its %d claim(s) are "
                 "not prepared any more; left as it is", path, found.boot_id, boot,
                 len(found.claims))
        return Takeover()
    ours = checkpoint.all()
    # Taken over by an earlier start (listed, or recorded just before a crash kept the file
    # from being moved): not again, even when gpukit has unprepared them since.
    before = {uid for uid in found.claims if uid in ours or uid in checkpoint.taken_over()}
    taken: list[PreparedClaim] = []
    refused: dict[str, str] = {}
    for uid, claim in sorted(found.claims.items()):
        if uid in before:
            continue
        if claim.state != nv.PREPARE_COMPLETED:
            refused[uid] = f"{claim}: NVIDIA's plugin did not finish preparing it " \
                           f"({claim.state})"
            continue
        problem = claim_problem(claim, node, devices)
        if problem:
            refused[uid] = f"{claim}: {problem}"
        else:
            taken.append(adopted(claim))
    moved = ""
    if not refused and (taken or before):
        # All of it is gpukit's now: NVIDIA's plugin, run here again, starts afresh.
        target = path.with_name(path.name + TAKEN_SUFFIX)
        checkpoint.take_over(taken, ())
        os.replace(path, target)
        sync_dir(path.parent)
        moved = str(target)
    elif taken:
        checkpoint.take_over(taken, before | {c.uid for c in taken})
    return Takeover(tuple(taken), refused, moved_to=moved)
