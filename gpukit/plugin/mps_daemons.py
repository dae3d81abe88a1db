"""The MPS control daemons of a node's MPS-shared GPUs: started, checked, restarted, stopped.

What NVIDIA's mps-control-daemon does per resource, done per GPU (see gpukit.plugin.mps):
`nvidia-cuda-mps-control -d` with the GPU's pipe and log directories and CUDA_VISIBLE_DEVICES
set to its UUID, the GPU in EXCLUSIVE_PROCESS compute mode (only the MPS server may hold a
context on it), the share's limits sent as daemon defaults (`set_default_device_pinned_mem_limit`,
`set_default_active_thread_percentage`), health as an answer to
`get_default_active_thread_percentage`. A GPU that stops being MPS-shared gets `quit` (the
daemon finishes its clients' work first; the sharing rollout drains the node before a change),
its compute mode back to DEFAULT and its directories removed, so no daemon is left behind.

A daemon found already answering on a GPU's pipe directory (the agent restarted) is adopted: its
limits are set again, it is not restarted under its clients.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from .mps import GpuShare, MpsLayout

log = logging.getLogger(__name__)

CONTROL_BINARY = "nvidia-cuda-mps-control"
COMMAND_TIMEOUT = 10.0

# (GPU UUID, exclusive) -> None; raises on failure. EXCLUSIVE_PROCESS when exclusive, else
# DEFAULT (pynvml nvmlDeviceSetComputeMode behind the agent's NVML backend).
ComputeModeSetter = Callable[[str, bool], None]
Runner = Callable[..., "subprocess.CompletedProcess[str]"]


class MpsError(RuntimeError):
    """A daemon could not be started, configured or reached; the message says which GPU."""


@dataclass
class MpsDaemons:
    set_compute_mode: ComputeModeSetter
    control_binary: str = CONTROL_BINARY
    run: Runner = subprocess.run
    # GPU UUID -> the share its daemon was configured for
    running: dict[str, GpuShare] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)
    layout: MpsLayout | None = None  # what the last reconcile made

    def _env(self, layout: MpsLayout, uuid: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update({
            "CUDA_VISIBLE_DEVICES": uuid,
            "CUDA_MPS_PIPE_DIRECTORY": layout.pipe_dir(uuid),
            "CUDA_MPS_LOG_DIRECTORY": layout.log_dir(uuid),
        })
        return env

    def command(self, layout: MpsLayout, uuid: str, line: str) -> str:
        """Send one control command to a GPU's daemon; its answer, or MpsError."""
        try:
            done = self.run([self.control_binary], input=line + "\n", capture_output=True,
                            text=True, env=self._env(layout, uuid), timeout=COMMAND_TIMEOUT,
                            check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise MpsError(f"GPU {uuid}: MPS control command {line.split()[0]!r}: {exc}") from exc
        if done.returncode != 0:
            why = (done.stderr or done.stdout).strip() or f"exit {done.returncode}"
            raise MpsError(f"GPU {uuid}: MPS control command {line.split()[0]!r}: {why}")
        return done.stdout.strip()

    def healthy(self, layout: MpsLayout, uuid: str) -> bool:
        try:
            self.command(layout, uuid, "get_default_active_thread_percentage")
        except MpsError:
            return False
        return True

    def _start(self, layout: MpsLayout, share: GpuShare) -> None:
        uuid = share.gpu.uuid
        for d in (layout.pipe_dir(uuid), layout.log_dir(uuid), layout.shm_dir):
            os.makedirs(d, mode=0o755, exist_ok=True)
        if not self.healthy(layout, uuid):
            try:
                self.set_compute_mode(uuid, True)
            except Exception as exc:  # NVML's errors, whatever the backend
                raise MpsError(f"GPU {uuid}: cannot set EXCLUSIVE_PROCESS compute mode: "
                               f"{exc}") from exc
            try:
                done = self.run([self.control_binary, "-d"], capture_output=True, text=True,
                                env=self._env(layout, uuid), timeout=COMMAND_TIMEOUT,
                                check=False)
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise MpsError(f"GPU {uuid}: cannot start the MPS control daemon: {exc}"
                               ) from exc
            if done.returncode != 0:
                why = (done.stderr or done.stdout).strip() or f"exit {done.returncode}"
                raise MpsError(f"GPU {uuid}: the MPS control daemon did not start: {why}")
            log.info("MPS control daemon started for GPU %s (%d replicas)", uuid, share.replicas)
        # Device 0: the daemon sees only its GPU (CUDA_VISIBLE_DEVICES).
        self.command(layout, uuid,
                     f"set_default_device_pinned_mem_limit 0 {share.memory_limit_mb}M")
        self.command(layout, uuid,
                     f"set_default_active_thread_percentage {share.thread_percentage}")

    def _stop(self, layout: MpsLayout, uuid: str) -> None:
        if self.healthy(layout, uuid):
            self.command(layout, uuid, "quit")
            log.info("MPS control daemon of GPU %s quit", uuid)
        try:
            self.set_compute_mode(uuid, False)
        except Exception as exc:  # a GPU gone from the bus has no mode to restore
            log.warning("GPU %s: cannot restore DEFAULT compute mode: %s", uuid, exc)
        shutil.rmtree(layout.gpu_dir(uuid), ignore_errors=True)

    def reconcile(self, layout: MpsLayout) -> Mapping[str, str]:
        """Make the running daemons those of `layout` (no shares: MPS off); GPU UUID ->
        problem for each GPU whose daemon is not serving. Daemons of GPUs no longer shared are
        stopped, also those a previous agent left (a GPU directory under the root)."""
        previous = self.layout or layout
        leftovers = set(self.running) | {u for u in _gpu_dirs(layout.root)
                                         if u not in layout.shares}
        for uuid in sorted(leftovers - set(layout.shares)):
            try:
                self._stop(previous if uuid in self.running else layout, uuid)
            except MpsError as exc:
                log.error("%s", exc)
            self.running.pop(uuid, None)
        self.layout = layout
        self.problems = {}
        for uuid, share in layout.shares.items():
            if self.running.get(uuid) == share and self.healthy(layout, uuid):
                continue
            if uuid in self.running:
                log.warning("MPS control daemon of GPU %s is not answering or its share "
                            "changed: starting or configuring it again", uuid)
            try:
                self._start(layout, share)
            except MpsError as exc:
                log.error("%s", exc)
                self.problems[uuid] = str(exc)
                self.running.pop(uuid, None)
                continue
            self.running[uuid] = share
        return self.problems

    def check(self) -> Mapping[str, str]:
        """Restart what stopped answering (the readiness probe's view stays current)."""
        return self.reconcile(self.layout) if self.layout is not None else {}


def _gpu_dirs(root: str) -> list[str]:
    try:
        return [n for n in os.listdir(root) if n.startswith("GPU-")]
    except OSError:
        return []
