"""MPS control daemons: started, checked, restarted, stopped, for both of gpukit's plugins.

What NVIDIA's mps-control-daemon does, with one daemon per key: the device plugin keys its
daemons by GPU UUID (one per MPS-shared GPU, gpukit.plugin.mps), the DRA plugin by claim
(`claim-<uid>`, one per prepared claim asking for MPS, as NVIDIA's DRA driver). Each daemon is
`nvidia-cuda-mps-control -d` with its own pipe and log directories under the MPS root and
CUDA_VISIBLE_DEVICES set to the devices it serves; the whole GPUs among them are in
EXCLUSIVE_PROCESS compute mode (only the MPS server holds a context) while it runs; its limits
are sent as daemon defaults (`set_default_device_pinned_mem_limit`,
`set_default_active_thread_percentage`); health is an answer to
`get_default_active_thread_percentage`. Stopping sends `quit` (the daemon lets its clients
finish), restores DEFAULT compute mode and removes the directory, so no daemon is left behind.

Each daemon's directory holds `spec.json`, what it was started for: a restarted plugin adopts a
daemon that still answers (limits set again, no restart under its clients) and stops the ones
nothing asks for any more with the GPUs to restore.

Who runs the daemons: a plugin running as a host service runs them itself (this module); the
hardened containers of the DaemonSets cannot open the GPUs, so there the plugins ask gpukit's
MPS control container for them (gpukit.plugin.mps_requests, served by
gpukit.plugin.mps_control). Both answer as `MpsControl`.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

log = logging.getLogger(__name__)

CONTROL_BINARY = "nvidia-cuda-mps-control"
COMMAND_TIMEOUT = 10.0
SPEC_FILE = "spec.json"

# (GPU UUID, exclusive) -> None; raises on failure. EXCLUSIVE_PROCESS when exclusive, else
# DEFAULT (pynvml nvmlDeviceSetComputeMode behind the plugins' NVML access).
ComputeModeSetter = Callable[[str, bool], None]
Runner = Callable[..., "subprocess.CompletedProcess[str]"]


# The keys daemons may have: the device plugin's (GPU or MIG device UUIDs) and the DRA
# plugin's (claim-<uid>); nothing else under the MPS root is a daemon (shm, requests).
KEY_PREFIXES = ("GPU-", "MIG-", "claim-")


class MpsError(RuntimeError):
    """A daemon could not be started, configured or reached; the message says which."""


class MpsControl(Protocol):
    """What the plugins ask of whoever runs their MPS daemons."""

    problems: dict[str, str]

    def start(self, root: str, spec: DaemonSpec) -> None: ...

    def stop(self, root: str, key: str) -> None: ...

    def reconcile(self, root: str, specs: Mapping[str, DaemonSpec],
                  prefix: str | tuple[str, ...]) -> Mapping[str, str]: ...


@dataclass(frozen=True)
class DaemonSpec:
    key: str  # its directory under the root: a GPU UUID, or claim-<uid>
    devices: tuple[str, ...]  # UUIDs it serves (GPUs or MIG devices), CUDA_VISIBLE_DEVICES
    exclusive: tuple[str, ...]  # whole GPUs among them: EXCLUSIVE_PROCESS while it runs
    # (device index as the daemon sees it, limit such as "3840M")
    memory_limits: tuple[tuple[str, str], ...] = ()
    thread_percentage: int | None = None

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> DaemonSpec:
        pct = doc.get("thread_percentage")
        return cls(str(doc["key"]), tuple(str(d) for d in doc.get("devices") or ()),
                   tuple(str(d) for d in doc.get("exclusive") or ()),
                   tuple((str(i), str(v)) for i, v in doc.get("memory_limits") or ()),
                   pct if isinstance(pct, int) else None)


@dataclass(frozen=True)
class DaemonDirs:
    root: str
    key: str

    @property
    def base(self) -> str:
        return os.path.join(self.root, self.key)

    @property
    def pipe(self) -> str:
        return os.path.join(self.base, "pipe")

    @property
    def log(self) -> str:
        return os.path.join(self.base, "log")


@dataclass
class MpsDaemons:
    set_compute_mode: ComputeModeSetter
    control_binary: str = CONTROL_BINARY
    run: Runner = subprocess.run
    running: dict[str, DaemonSpec] = field(default_factory=dict)  # key -> spec
    problems: dict[str, str] = field(default_factory=dict)  # key -> why it is not serving

    def _env(self, dirs: DaemonDirs, spec: DaemonSpec | None) -> dict[str, str]:
        env = dict(os.environ)
        env.update({"CUDA_MPS_PIPE_DIRECTORY": dirs.pipe, "CUDA_MPS_LOG_DIRECTORY": dirs.log})
        if spec is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(spec.devices)
        return env

    def command(self, dirs: DaemonDirs, line: str) -> str:
        """Send one control command to a daemon; its answer, or MpsError."""
        what = f"MPS daemon {dirs.key}: control command {line.split()[0]!r}"
        try:
            done = self.run([self.control_binary], input=line + "\n", capture_output=True,
                            text=True, env=self._env(dirs, None), timeout=COMMAND_TIMEOUT,
                            check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise MpsError(f"{what}: {exc}") from exc
        if done.returncode != 0:
            raise MpsError(f"{what}: {_why(done)}")
        return done.stdout.strip()

    def healthy(self, dirs: DaemonDirs) -> bool:
        try:
            self.command(dirs, "get_default_active_thread_percentage")
        except MpsError:
            return False
        return True

    def start(self, root: str, spec: DaemonSpec) -> None:
        """Start (or adopt) the daemon of `spec` and set its limits; MpsError says why not.
        A daemon that did start but could not be configured is stopped again."""
        dirs = DaemonDirs(root, spec.key)
        for d in (dirs.pipe, dirs.log, os.path.join(root, "shm")):
            os.makedirs(d, mode=0o755, exist_ok=True)
        started = False
        if not self.healthy(dirs):
            for uuid in spec.exclusive:
                try:
                    self.set_compute_mode(uuid, True)
                except Exception as exc:  # NVML's errors, whatever the backend
                    self._restore(spec)
                    raise MpsError(f"MPS daemon {spec.key}: cannot set GPU {uuid} to "
                                   f"EXCLUSIVE_PROCESS compute mode: {exc}") from exc
            try:
                done = self.run([self.control_binary, "-d"], capture_output=True, text=True,
                                env=self._env(dirs, spec), timeout=COMMAND_TIMEOUT, check=False)
            except (OSError, subprocess.TimeoutExpired) as exc:
                self._restore(spec)
                raise MpsError(f"MPS daemon {spec.key}: cannot start "
                               f"{self.control_binary}: {exc}") from exc
            if done.returncode != 0:
                self._restore(spec)
                raise MpsError(f"MPS daemon {spec.key}: did not start: {_why(done)}")
            started = True
            log.info("MPS control daemon %s started for %s", spec.key, ",".join(spec.devices))
        with open(os.path.join(dirs.base, SPEC_FILE), "w", encoding="utf-8") as fh:
            json.dump(asdict(spec), fh)
        try:
            for index, limit in spec.memory_limits:
                self.command(dirs, f"set_default_device_pinned_mem_limit {index} {limit}")
            if spec.thread_percentage is not None:
                self.command(dirs,
                             f"set_default_active_thread_percentage {spec.thread_percentage}")
        except MpsError:
            if started:
                self.stop(root, spec.key)
            raise
        self.running[spec.key] = spec

    def stop(self, root: str, key: str) -> None:
        """Quit a daemon, restore its GPUs' compute mode, remove its directory."""
        dirs = DaemonDirs(root, key)
        spec = self.running.pop(key, None) or _read_spec(dirs)
        if self.healthy(dirs):
            self.command(dirs, "quit")
            log.info("MPS control daemon %s quit", key)
        if spec is not None:
            self._restore(spec)
        shutil.rmtree(dirs.base, ignore_errors=True)

    def _restore(self, spec: DaemonSpec) -> None:
        for uuid in spec.exclusive:
            try:
                self.set_compute_mode(uuid, False)
            except Exception as exc:  # a GPU gone from the bus has no mode to restore
                log.warning("GPU %s: cannot restore DEFAULT compute mode: %s", uuid, exc)

    def ensure(self, root: str, spec: DaemonSpec) -> None:
        """Running and answering with `spec`'s settings: nothing; else started (again)."""
        if self.running.get(spec.key) == spec and self.healthy(DaemonDirs(root, spec.key)):
            return
        if spec.key in self.running:
            log.warning("MPS control daemon %s is not answering or its settings changed: "
                        "starting or configuring it again", spec.key)
        self.start(root, spec)

    def reconcile(self, root: str, specs: Mapping[str, DaemonSpec],
                  prefix: str | tuple[str, ...]) -> Mapping[str, str]:
        """Make the daemons whose key starts with `prefix` exactly `specs`: those nothing asks
        for (also a previous plugin's, found by their directories) stopped, the others
        running; key -> problem for each that is not serving."""
        found = {k for k in _listdir(root) if k.startswith(prefix)}
        for key in sorted((found | {k for k in self.running if k.startswith(prefix)})
                          - set(specs)):
            try:
                self.stop(root, key)
            except MpsError as exc:
                log.error("%s", exc)
        self.problems = {}
        for key, spec in specs.items():
            try:
                self.ensure(root, spec)
            except MpsError as exc:
                log.error("%s", exc)
                self.problems[key] = str(exc)
                self.running.pop(key, None)
        return self.problems


def _why(done: subprocess.CompletedProcess[str]) -> str:
    return (done.stderr or done.stdout).strip() or f"exit {done.returncode}"


def read_spec(root: str, key: str) -> DaemonSpec | None:
    """What the daemon of `key` was started for, or None (never started, or gone)."""
    return _read_spec(DaemonDirs(root, key))


def _read_spec(dirs: DaemonDirs) -> DaemonSpec | None:
    try:
        with open(os.path.join(dirs.base, SPEC_FILE), encoding="utf-8") as fh:
            return DaemonSpec.from_json(json.load(fh))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _listdir(root: str) -> list[str]:
    try:
        return os.listdir(root)
    except OSError:
        return []
