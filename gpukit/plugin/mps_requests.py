"""MPS daemons asked of gpukit's MPS control container, through files under the MPS root.

The agent's and the DRA plugin's DaemonSet containers are hardened (no devices, no
capabilities), so they cannot run an MPS daemon: it needs the GPUs and sets their compute
mode. In a DaemonSet the daemons run in a privileged container of their own
(gpukit.plugin.mps_control, DaemonSet gpukit-mps-control), as NVIDIA's device plugin has its
mps-control-daemon. The plugins ask it through the MPS root both mount:

- `<root>/requests/<key>.json`: a daemon a plugin wants, its DaemonSpec (written whole, by
  rename; removed when nothing wants the daemon any more);
- `<root>/<key>/status.json`: what the control container made of it: the spec it serves,
  whether the daemon serves, and why not.

`MpsRequests` answers as `MpsDaemons` does (gpukit.plugin.mps_daemons.MpsControl): the DRA
plugin's start waits until the daemon serves (a claim's containers need it at once), the
agent's reconcile does not wait (its replicas stay unhealthy until their daemon serves).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from .mps_daemons import ComputeModeSetter, DaemonDirs, DaemonSpec, MpsControl, MpsDaemons, MpsError

REQUESTS_DIR = "requests"
STATUS_FILE = "status.json"
START_TIMEOUT = 30.0
NO_CONTROLLER = ("no answer from gpukit's MPS control container on this node (DaemonSet "
                 "gpukit-mps-control) within {:.0f} s")


@dataclass(frozen=True)
class DaemonStatus:
    spec: DaemonSpec
    serving: bool
    problem: str = ""

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> DaemonStatus:
        return cls(DaemonSpec.from_json(doc["spec"]), doc.get("serving") is True,
                   str(doc.get("problem") or ""))


def request_path(root: str, key: str) -> str:
    return os.path.join(root, REQUESTS_DIR, f"{key}.json")


def write_json(path: str, doc: Any) -> None:
    """Whole or not at all: the reader never sees half a file."""
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(doc, fh)
    os.replace(tmp, path)


def read_requests(root: str) -> tuple[dict[str, DaemonSpec], dict[str, str]]:
    """The requested daemons (key -> spec) and, per unreadable request, why."""
    specs: dict[str, DaemonSpec] = {}
    bad: dict[str, str] = {}
    folder = os.path.join(root, REQUESTS_DIR)
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return specs, bad
    for name in names:
        if not name.endswith(".json"):
            continue
        key = name[:-len(".json")]
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as fh:
                spec = DaemonSpec.from_json(json.load(fh))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            bad[key] = f"MPS daemon request {name}: unreadable: {exc}"
            continue
        if spec.key != key:
            bad[key] = f"MPS daemon request {name}: names key {spec.key!r}"
            continue
        specs[key] = spec
    return specs, bad


def read_status(root: str, key: str) -> DaemonStatus | None:
    try:
        with open(os.path.join(DaemonDirs(root, key).base, STATUS_FILE), encoding="utf-8") as fh:
            return DaemonStatus.from_json(json.load(fh))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_status(root: str, key: str, status: DaemonStatus) -> None:
    write_json(os.path.join(DaemonDirs(root, key).base, STATUS_FILE),
               {"spec": asdict(status.spec), "serving": status.serving,
                "problem": status.problem})


@dataclass
class MpsRequests:
    """The plugins' side: ask for daemons, read how they are."""

    start_timeout: float = START_TIMEOUT
    poll_seconds: float = 0.2
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    problems: dict[str, str] = field(default_factory=dict)  # key -> why it is not serving

    def _ask(self, root: str, spec: DaemonSpec) -> None:
        path = request_path(root, spec.key)
        try:
            with open(path, encoding="utf-8") as fh:
                if DaemonSpec.from_json(json.load(fh)) == spec:
                    return
        except (OSError, ValueError, KeyError, TypeError):
            pass
        write_json(path, asdict(spec))

    def _withdraw(self, root: str, key: str) -> None:
        try:
            os.unlink(request_path(root, key))
        except FileNotFoundError:
            pass

    def state(self, root: str, spec: DaemonSpec) -> str | None:
        """None while the daemon serves `spec`; else why not."""
        status = read_status(root, spec.key)
        if status is None or status.spec != spec:
            return f"MPS daemon {spec.key}: waiting for gpukit's MPS control container"
        if not status.serving:
            return status.problem or f"MPS daemon {spec.key}: not serving"
        return None

    def start(self, root: str, spec: DaemonSpec) -> None:
        """Ask for the daemon and wait until it serves; MpsError (request withdrawn) if it
        does not within the timeout or the control container says why not."""
        self._ask(root, spec)
        deadline = self.clock() + self.start_timeout
        while True:
            status = read_status(root, spec.key)
            if status is not None and status.spec == spec:
                if status.serving:
                    self.problems.pop(spec.key, None)
                    return
                if status.problem:
                    self._withdraw(root, spec.key)
                    raise MpsError(status.problem)
            if self.clock() >= deadline:
                self._withdraw(root, spec.key)
                raise MpsError(f"MPS daemon {spec.key}: "
                               + NO_CONTROLLER.format(self.start_timeout))
            self.sleep(self.poll_seconds)

    def stop(self, root: str, key: str) -> None:
        """Withdraw the request and wait until the control container stopped the daemon (its
        directory gone)."""
        self._withdraw(root, key)
        self.problems.pop(key, None)
        base = DaemonDirs(root, key).base
        deadline = self.clock() + self.start_timeout
        while os.path.isdir(base):
            if self.clock() >= deadline:
                raise MpsError(f"MPS daemon {key}: still there after its request was "
                               f"withdrawn; " + NO_CONTROLLER.format(self.start_timeout))
            self.sleep(self.poll_seconds)

    def reconcile(self, root: str, specs: Mapping[str, DaemonSpec],
                  prefix: str | tuple[str, ...]) -> Mapping[str, str]:
        """Ask for exactly `specs` among the keys of `prefix`; key -> problem for each that
        does not serve yet (no waiting: the next call sees further)."""
        asked, _ = read_requests(root)
        for key in sorted(k for k in asked if k.startswith(prefix) and k not in specs):
            self._withdraw(root, key)
        self.problems = {}
        for key, spec in specs.items():
            self._ask(root, spec)
            why = self.state(root, spec)
            if why is not None:
                self.problems[key] = why
        return self.problems


# Who runs a plugin's MPS daemons (--mps-daemons, GPUKIT_MPS_DAEMONS): the plugin itself (a
# host service), gpukit's MPS control container (the DaemonSets), or nobody (MPS refused).
MPS_DAEMON_MODES = ("own", "delegate", "none")


def mps_control(mode: str, set_compute_mode: ComputeModeSetter) -> MpsControl | None:
    """The plugins' MPS daemons for `mode`; ValueError naming the value when unknown."""
    if mode == "own":
        return MpsDaemons(set_compute_mode)
    if mode == "delegate":
        return MpsRequests()
    if mode == "none":
        return None
    raise ValueError(f"--mps-daemons (GPUKIT_MPS_DAEMONS): {mode!r} is not one of "
                     f"{', '.join(MPS_DAEMON_MODES)}")
