"""The lab's GPU workload (`gpu-work`, workload/gpu_work.c) and its image.

A pod running it shows up in the mock NVML as a compute process on each GPU or MIG device the
container may open, with the memory and utilisation it was given, for exactly as long as the
process lives (src/telemetry.c reads the client files it holds locked). The pod must mount the
node's mock state clients directory at `CLIENTS_IN_POD`: `pod_volume()` and `pod_mount()`.
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path
from typing import Any

from gpukit.lab.images import FileEntry, _layer, write_archive

IMAGE = "localhost/gpukit-lab/gpu-work:1"
SOURCE = Path(__file__).resolve().parent / "workload" / "gpu_work.c"
CLIENTS_DIR = "clients"  # under the mock's state directory (src/telemetry.c)
CLIENTS_IN_POD = "/run/gpukit-nvml/clients"


def build_binary(out: Path) -> Path:
    """The static gpu-work binary (rebuilt when the source changed)."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    stamp = out.with_suffix(".digest")
    if out.exists() and stamp.exists() and stamp.read_text() == digest:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["gcc", "-static", "-O2", "-s", "-Wall", "-Wextra", "-Werror", "-o", str(out),
                    str(SOURCE)], check=True)  # fmt: skip
    stamp.write_text(digest)
    return out


def build_image(out_dir: Path) -> Path:
    """A docker-archive of the image: the binary alone (static), entrypoint /gpu-work."""
    binary = build_binary(out_dir / "gpu-work.bin")
    archive = out_dir / "gpu-work.tar"
    stamp = out_dir / "gpu-work.tar.digest"
    digest = hashlib.sha256(binary.read_bytes()).hexdigest()[:16]
    if archive.exists() and stamp.exists() and stamp.read_text() == digest:
        return archive
    write_archive(archive, IMAGE, _layer([FileEntry("gpu-work", binary)]),
                  {"Entrypoint": ["/gpu-work"]})
    stamp.write_text(digest)
    return archive


def pod_volume(state_dir: str, name: str = "gpukit-nvml-clients") -> dict[str, Any]:
    """The node's clients directory of the mock at `state_dir` (the lab's: /var/lib/gpukit-lab/
    nvml), as a pod volume."""
    return {"name": name,
            "hostPath": {"path": f"{state_dir}/{CLIENTS_DIR}", "type": "DirectoryOrCreate"}}


def pod_mount(name: str = "gpukit-nvml-clients") -> dict[str, Any]:
    return {"name": name, "mountPath": CLIENTS_IN_POD}


def args(mem_mb: int, util: int, seconds: int = 0) -> list[str]:
    """The container's arguments: `mem_mb` MiB and `util` % on each device, for `seconds`
    (0: until the pod is deleted)."""
    if mem_mb < 0 or not 0 <= util <= 100 or seconds < 0:
        raise ValueError(f"gpu-work: mem_mb {mem_mb} >= 0, util {util} in 0..100, "
                         f"seconds {seconds} >= 0")
    return ["--mem-mb", str(mem_mb), "--util", str(util), "--seconds", str(seconds)]
