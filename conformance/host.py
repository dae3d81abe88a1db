"""The nodes as hosts: pytest-testinfra's ansible backend over the same inventory.

The suite reaches a node exactly as `site.yml` does (ansible_host, user, key, SSH arguments from
the inventory) and asks NVML itself with `nvml_probe.py` (stdlib python3 on the node).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpukit.contracts import mig_profiles

PROBE_SOURCE = Path(__file__).with_name("nvml_probe.py")


def ensure_ansible_on_path() -> None:
    """testinfra runs `ansible-inventory` from PATH: use this interpreter's when missing."""
    if shutil.which("ansible-inventory"):
        return
    here = str(Path(sys.executable).parent)
    if (Path(here) / "ansible-inventory").exists():
        os.environ["PATH"] = here + os.pathsep + os.environ.get("PATH", "")


def connect(inventory: str, host: str) -> Any:
    import testinfra

    ensure_ansible_on_path()
    return testinfra.get_host(f"ansible://{host}", ansible_inventory=inventory)


@dataclass(frozen=True)
class MigSeen:
    uuid: str
    gi: int
    ci: int
    profile: str  # GPU instance profile name from the MIG table ("?<id>" when unknown)
    start: int
    memory_mib: int
    caps: tuple[int, ...] = ()  # /dev/nvidia-caps minors the driver lists for it


@dataclass(frozen=True)
class GpuSeen:
    index: int
    uuid: str
    name: str
    minor: int
    memory_mib: int
    mig_current: bool | None
    mig_pending: bool | None
    migs: tuple[MigSeen, ...] = ()
    error: str = ""  # NVML could not query this GPU (then only `index` is known)
    lost: bool = False  # ... because it is lost (NVML_ERROR_GPU_IS_LOST)

    @property
    def state(self) -> str:
        """`present`, or what NVML said instead, for expected/observed lines."""
        if not self.error:
            return "present"
        return f"{'lost' if self.lost else 'unreadable'} ({self.error})"


@dataclass(frozen=True)
class NvmlSeen:
    """What NVML reported on a node."""

    ok: bool
    error: str = ""
    library: str = ""
    mock: bool = False
    driver_version: str = ""
    cuda_driver_version: int = 0
    gpus: tuple[GpuSeen, ...] = ()
    by_uuid: dict[str, tuple[GpuSeen, MigSeen | None]] = field(default_factory=dict)

    @property
    def readable(self) -> tuple[GpuSeen, ...]:
        """The GPUs NVML could query (not lost)."""
        return tuple(g for g in self.gpus if not g.error)

    def parent(self, device_uuid: str) -> GpuSeen | None:
        hit = self.by_uuid.get(device_uuid)
        return hit[0] if hit else None

    def mig(self, device_uuid: str) -> MigSeen | None:
        hit = self.by_uuid.get(device_uuid)
        return hit[1] if hit else None

    def index_to_uuid(self, ref: str) -> str:
        """`0` or `0:1` (deviceIDStrategy index) -> UUID; other refs unchanged."""
        if ref.isdigit():
            return next((g.uuid for g in self.gpus if g.index == int(ref) and g.uuid), ref)
        gpu_idx, sep, pos = ref.partition(":")
        if sep and gpu_idx.isdigit() and pos.isdigit():
            gpu = next((g for g in self.gpus if g.index == int(gpu_idx) and not g.error), None)
            if gpu and int(pos) < len(gpu.migs):
                return gpu.migs[int(pos)].uuid
        return ref


def parse_probe(doc: dict[str, Any]) -> NvmlSeen:
    gpus: list[GpuSeen] = []
    by_uuid: dict[str, tuple[GpuSeen, MigSeen | None]] = {}
    for g in doc.get("gpus", []):
        if g.get("error"):
            gpus.append(GpuSeen(int(g["index"]), "", "", -1, 0, None, None,
                                error=str(g["error"]), lost=bool(g.get("lost"))))
            continue
        table = mig_profiles.for_product(g["name"])
        migs = []
        for m in g.get("migs", []):
            profile = f"?{m['gi_profile_id']}"
            if table is not None:
                try:  # nvmlGpuInstanceGetInfo's profileId is the driver's id, not the constant
                    profile = table.gpu_instance_profile_by_driver_id(
                        int(m["gi_profile_id"])).name
                except KeyError:
                    pass
            migs.append(MigSeen(m["uuid"], int(m["gi"]), int(m["ci"]), profile,
                                int(m["start"]), int(m["memory_mib"]),
                                tuple(int(c) for c in m.get("caps", ()))))
        gpu = GpuSeen(int(g["index"]), g["uuid"], g["name"], int(g["minor"]),
                      int(g["memory_mib"]), g.get("mig_current"), g.get("mig_pending"),
                      tuple(migs))
        gpus.append(gpu)
        by_uuid[gpu.uuid] = (gpu, None)
        for mig in migs:
            by_uuid[mig.uuid] = (gpu, mig)
    return NvmlSeen(ok=bool(doc.get("ok")), error=str(doc.get("error", "")),
                    library=str(doc.get("library", "")), mock=bool(doc.get("mock")),
                    driver_version=str(doc.get("driver_version", "")),
                    cuda_driver_version=int(doc.get("cuda_driver_version") or 0),
                    gpus=tuple(gpus), by_uuid=by_uuid)


def run_probe(host: Any) -> NvmlSeen:
    """Run nvml_probe.py on the host with its python3; raises RuntimeError with the output."""
    source = PROBE_SOURCE.read_text()
    cmd = host.run("python3 -c %s", source)
    lines = [ln for ln in cmd.stdout.splitlines() if ln.startswith("{")]
    if cmd.rc != 0 or not lines:
        raise RuntimeError(f"NVML probe failed (rc {cmd.rc}): {cmd.stderr.strip() or cmd.stdout}")
    doc: dict[str, Any] = json.loads(lines[-1])
    return parse_probe(doc)
