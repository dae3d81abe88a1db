"""What apply needs from the node besides NVML: resetting a GPU, pausing the device plugin, and
reporting progress. Small protocols with the implementations used in production and in the lab;
tests pass fakes.

Pause protocol (file-based, so it works for a host process and a DaemonSet alike; the plugin
side is :class:`gpukit.plugin.mig.pause.PauseWatcher`):

* the MIG manager writes the pause file atomically (JSON: ``token``, ``gpus`` (UUIDs),
  ``indices``, ``config``, ``pid``, ``created``, ``expires``) before the first change;
* the plugin (which polls the file), at its next loop tick, stops re-enumerating, reports the
  devices of those GPUs Unhealthy (so the kubelet assigns none of them) and writes
  ``<pause file>.ack`` containing the token; the manager waits for the ack when asked to
  (``ack_timeout``);
* after the change (or when a failed apply gives up) the manager removes the pause file and,
  when it knows the plugin's PID, sends it SIGUSR1; the plugin re-enumerates at once.
* The file names its owner (``pid``, ``pid_start``, ``pid_ns``) and the manager holds an flock
  on it until it resumes: a plugin that finds the owner gone (a manager killed mid-apply) voids
  and removes the pause at its next tick (:mod:`gpukit.plugin.mig.pause`). A pause file past
  ``expires`` is ignored as a last resort; rerunning apply refreshes it and removes it at the end.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import signal
import subprocess
import tempfile
import time
import uuid as uuidlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Literal, Protocol

from gpukit.contracts import label_names
from gpukit.plugin.mig.pause import owner_record, write_pause

log = logging.getLogger(__name__)

State = Literal["pending", "success", "failed"]
ResetFn = Callable[[int], None]

NVIDIA_SMI_RESET = ("nvidia-smi", "-r", "-i", "{index}")
DEFAULT_PAUSE_FILE = "/run/gpukit/plugin.pause"
ENV_PAUSE_FILE = "GPUKIT_PLUGIN_PAUSE_FILE"
DEFAULT_PAUSE_SECONDS = 900.0


class ResetError(RuntimeError):
    pass


def command_reset(argv: Sequence[str], timeout: float = 120.0) -> ResetFn:
    """A reset callback running a command; ``{index}`` in an argument is the GPU index
    (``nvidia-smi -r -i N`` on real hosts; the lab's mock is reset by `lab_mock_reset`)."""
    template = tuple(argv)

    def reset(index: int) -> None:
        cmd = [a.replace("{index}", str(index)) for a in template]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                                  check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise ResetError(f"reset GPU {index}: {shlex.join(cmd)}: {e}") from e
        if proc.returncode != 0:
            out = (proc.stderr or proc.stdout).strip()
            raise ResetError(f"reset GPU {index}: {shlex.join(cmd)} exited {proc.returncode}"
                             + (f": {out}" if out else ""))

    return reset


def lab_mock_reset() -> ResetFn:
    """The reset for the lab's mock NVML, in this process (see gpukit.plugin.nvml)."""
    from gpukit.plugin import nvml

    def reset(index: int) -> None:
        try:
            nvml.lab_mock_reset(index)
        except nvml.NvmlError as e:
            raise ResetError(f"reset GPU {index}: {e}") from e

    return reset


# -- state reporting ------------------------------------------------------------------------------


class StateReporter(Protocol):
    """Where ``nvidia.com/mig.config.state`` goes: pending (changing), success, failed."""

    def report(self, state: State, detail: str = "") -> None: ...


class NullReporter:
    def report(self, state: State, detail: str = "") -> None:
        log.debug("mig.config.state=%s %s", state, detail)


class NodeLabels(Protocol):
    """What the reporter needs of :class:`gpukit.plugin.node_api.NodeClient` (tests pass fakes)."""

    def labels(self, node_name: str) -> dict[str, str]: ...

    def patch_labels(self, node_name: str, changes: Mapping[str, str | None]) -> None: ...


class NodeLabelReporter:
    """Sets the node label ``nvidia.com/mig.config.state`` (like NVIDIA's mig-manager)."""

    def __init__(self, node_name: str, client: NodeLabels | None = None,
                 kubeconfig: str | None = None) -> None:
        self.node_name = node_name
        if client is None:
            from gpukit.plugin.node_api import NodeClient

            client = NodeClient(kubeconfig)
        self.client = client

    def report(self, state: State, detail: str = "") -> None:
        try:
            self.client.patch_labels(self.node_name, {label_names.MIG_CONFIG_STATE: state})
        except Exception as e:  # reporting must not turn a good apply into a failure
            log.error("cannot set %s=%s on node %s: %s", label_names.MIG_CONFIG_STATE, state,
                      self.node_name, e)

    def selected_config(self) -> str | None:
        """The node's ``nvidia.com/mig.config`` label, if set."""
        value = self.client.labels(self.node_name).get(label_names.MIG_CONFIG)
        return str(value) if value else None


class FileReporter:
    """Writes ``{"state": ..., "detail": ..., "time": ...}`` to a file (hosts without Kubernetes,
    the lab, tests)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def report(self, state: State, detail: str = "") -> None:
        _write_json(self.path, {"label": label_names.MIG_CONFIG_STATE, "state": state,
                                "detail": detail, "time": time.time()})


class MultiReporter:
    def __init__(self, *reporters: StateReporter) -> None:
        self.reporters = reporters

    def report(self, state: State, detail: str = "") -> None:
        for r in self.reporters:
            r.report(state, detail)


# -- pausing the device plugin --------------------------------------------------------------------


class PluginPause(Protocol):
    def pause(self, gpus: Sequence[tuple[int, str]], config: str) -> None:
        """Before the first change: ``gpus`` are (index, UUID) of the GPUs that change."""
        ...

    def resume(self) -> None:
        """After the change, or when giving up. Idempotent."""
        ...


class NoPause:
    def pause(self, gpus: Sequence[tuple[int, str]], config: str) -> None:
        pass

    def resume(self) -> None:
        pass


def _write_json(path: Path, doc: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class PauseFile:
    """The file-based pause protocol (module docstring)."""

    def __init__(
        self,
        path: str | Path,
        *,
        plugin_pid: int | None = None,
        plugin_pid_file: str | Path | None = None,
        ack_timeout: float = 0.0,
        max_seconds: float = DEFAULT_PAUSE_SECONDS,
    ) -> None:
        self.path = Path(path)
        self.ack_path = Path(str(self.path) + ".ack")
        self.plugin_pid = plugin_pid
        self.plugin_pid_file = Path(plugin_pid_file) if plugin_pid_file else None
        self.ack_timeout = ack_timeout
        self.max_seconds = max_seconds
        self._lock_fd: int | None = None  # holds the pause file's flock while paused

    def _pid(self) -> int | None:
        if self.plugin_pid:
            return self.plugin_pid
        if self.plugin_pid_file is not None:
            try:
                return int(self.plugin_pid_file.read_text().strip())
            except (OSError, ValueError) as e:
                log.warning("cannot read the plugin PID from %s: %s", self.plugin_pid_file, e)
        return None

    def _signal(self) -> None:
        pid = self._pid()
        if pid is None:
            return
        try:
            os.kill(pid, signal.SIGUSR1)
        except OSError as e:
            log.warning("cannot signal the device plugin (pid %d): %s", pid, e)

    def pause(self, gpus: Sequence[tuple[int, str]], config: str) -> None:
        token = uuidlib.uuid4().hex
        now = time.time()
        fd = write_pause(self.path, {
            "version": 1, "owner": "gpukit-mig-manager", "token": token, **owner_record(),
            "config": config, "indices": [i for i, _ in gpus], "gpus": [u for _, u in gpus],
            "created": now, "expires": now + self.max_seconds,
        })
        self._unlock()
        self._lock_fd = fd
        if self.ack_timeout <= 0:
            return
        deadline = time.monotonic() + self.ack_timeout
        while time.monotonic() < deadline:
            try:
                if self.ack_path.read_text().strip() == token:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        log.warning("the device plugin did not acknowledge the pause within %.1fs (%s): "
                    "continuing", self.ack_timeout, self.ack_path)

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def resume(self) -> None:
        try:
            self.path.unlink()
        except FileNotFoundError:
            return
        finally:
            self._unlock()  # after the unlink: a reader never sees our file unlocked
        self._signal()
