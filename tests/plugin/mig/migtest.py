"""Helpers for the MIG manager tests (a plain module: conftest puts this directory on
sys.path)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynvml

from gpukit.contracts import mig_parted as schema
from gpukit.lab import nvml as mock
from gpukit.lab.nvml.control import MockControl
from gpukit.mig.state import GpuState
from gpukit.plugin import nvml
from gpukit.plugin.mig.hooks import State
from gpukit.plugin.nvml.mig import PynvmlBackend

CONFIGS = {
    "all-disabled": [{"devices": "all", "mig-enabled": False}],
    "all-enabled": [{"devices": "all", "mig-enabled": True, "mig-devices": {}}],
    "all-3g": [{"devices": "all", "mig-enabled": True, "mig-devices": {"3g.20gb": 2}}],
    "4g-3g": [{"devices": [0], "mig-enabled": True,
               "mig-devices": {"3g.20gb": 1, "4g.20gb": 1}}],
    "mixed-a100": [
        {"devices": [0, 1], "mig-enabled": True,
         "mig-devices": {"3g.20gb": 1, "2g.10gb": 1, "1g.5gb": 2}},
        {"devices": [2, 3, 4, 5, 6, 7], "mig-enabled": False},
    ],
    # every kind of change at once, for the crash tests (prepared by prepare_churn)
    "churn": [
        {"devices": [0], "mig-enabled": True, "mig-devices": {"4g.20gb": 1, "3g.20gb": 1}},
        {"devices": [1], "mig-enabled": True,
         "mig-devices": {"3g.20gb": 1, "2g.10gb": 1, "1g.5gb": 2}},
        {"devices": [2], "mig-enabled": False},
        {"devices": [3], "mig-enabled": True, "mig-devices": {"1g.5gb": 7}},
    ],
}


def configs(name: str | None = None) -> schema.MigConfigs:
    return schema.parse({name: CONFIGS[name]} if name else CONFIGS)


def shutdown_all() -> None:
    while True:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            return


@dataclass
class MockNode:
    profile: str
    state_dir: Path
    lib: Path
    env: dict[str, str]
    backend: PynvmlBackend = field(default_factory=PynvmlBackend)

    def init(self) -> None:
        mock.load_mock(self.lib)
        nvml.init()

    @property
    def ctl(self) -> MockControl:
        return MockControl(self.lib)

    def reset(self, index: int) -> None:
        self.ctl.reset(index)

    def gpus(self) -> tuple[GpuState, ...]:
        return self.backend.gpus()

    def layout(self) -> dict[int, tuple[bool | None, bool | None, tuple[str, ...]]]:
        """index -> (current, pending, ("3g.20gb@0", ...)) with full CIs checked."""
        out = {}
        for g in self.gpus():
            out[g.index] = (g.mig_current, g.mig_pending,
                            tuple(f"{gi.describe()}/{len(gi.compute_instances)}ci"
                                  for gi in g.gpu_instances))
        return out

    def make(self, index: int, instances: list[tuple[str, int]], cis: bool = True) -> None:
        """Enable MIG on a GPU (mode + reset) and create GPU instances at (profile, start),
        each with its full compute instance when ``cis``."""
        b = self.backend
        g = b.gpu(index)
        if not g.mig_current:
            b.set_mig_mode(index, True)
            self.reset(index)
            g = b.gpu(index)
        assert g.table is not None
        for name, start in instances:
            p = g.table.gpu_instance_profile(name)
            gi = b.create_gpu_instance(index, p.profile_id, start, p.memory_slices)
            if cis:
                full = p.compute_instance_profile(p.compute_slices).profile_id
                b.create_compute_instance(index, gi, full)


def prepare_churn(node: MockNode) -> None:
    """GPU 0 MIG off; GPU 1 a 7g (all must go); GPU 2 MIG on with instances (to disable);
    GPU 3 three 1g already placed (kept), one GI without its compute instance."""
    node.make(1, [("7g.40gb", 0)])
    node.make(2, [("3g.20gb", 4), ("1g.5gb", 0)])
    node.make(3, [("1g.5gb", 1), ("1g.5gb", 5)])
    node.make(3, [("1g.5gb", 6)], cis=False)


class RecordingReporter:
    def __init__(self) -> None:
        self.states: list[tuple[State, str]] = []

    def report(self, state: State, detail: str = "") -> None:
        self.states.append((state, detail))


class RecordingPause:
    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def pause(self, gpus: Any, config: str) -> None:
        self.events.append(("pause", [i for i, _ in gpus]))

    def resume(self) -> None:
        self.events.append(("resume", None))


def run_cli(args: list[str], env: dict[str, str], timeout: float = 60
            ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpukit.plugin.mig", *args], env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


def cli_json(args: list[str], env: dict[str, str]) -> tuple[int, dict[str, Any]]:
    proc = run_cli([*args, "--json"], env)
    try:
        doc = json.loads(proc.stdout)
    except json.JSONDecodeError as e:
        raise AssertionError(f"no JSON from {args}: {proc.stdout!r} {proc.stderr!r}") from e
    return proc.returncode, doc
