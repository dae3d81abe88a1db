"""Device state lives in the state directory, as it would on the GPU: it persists across
processes, two processes changing it at once lose nothing and over-allocate nothing (flock), and
a process killed in the middle of a change leaves the previous state intact (temp file, fsync,
rename)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from nvmltest import enable_mig, run_json, run_py

from gpukit.lab import nvml as mock
from gpukit.lab.nvml.control import MockControl

pytestmark = pytest.mark.nvml
# The driver's profile ids (what create/list/capacity take) of an A100's 1g.5gb and 3g.20gb.
P1, P3 = 19, 9


def gi_count(nvml: Any, h: Any, profile: int = P1) -> int:
    count = nvml.c_uint(0)
    arr = (nvml.c_nvmlGpuInstance_t * 8)()
    nvml.nvmlDeviceGetGpuInstances(h, profile, arr, nvml.byref(count))
    return int(count.value)


def test_layout_persists_across_processes(nvml_env: dict[str, str], state_dir: Path) -> None:
    made = run_json(
        """
        import json, pynvml
        from gpukit.lab.nvml.control import MockControl
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(4)
        pynvml.nvmlDeviceSetMigMode(h, 1)
        MockControl().reset(4)
        gi = pynvml.nvmlDeviceCreateGpuInstance(h, 9)  # 3g.20gb
        pynvml.nvmlGpuInstanceCreateComputeInstance(gi, 2)
        pynvml.nvmlDeviceSetMigMode(pynvml.nvmlDeviceGetHandleByIndex(5), 1)  # left pending
        m = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
        print(json.dumps(pynvml.nvmlDeviceGetUUID(m)))
        """,
        nvml_env,
    )
    seen = run_json(
        """
        import json, pynvml
        pynvml.nvmlInit()
        h4, h5 = (pynvml.nvmlDeviceGetHandleByIndex(i) for i in (4, 5))
        m = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h4, 0)
        print(json.dumps([pynvml.nvmlDeviceGetUUID(m), pynvml.nvmlDeviceGetMigMode(h5),
                          pynvml.nvmlDeviceGetName(m)]))
        """,
        nvml_env,
    )
    assert seen == [made, [0, 1], "NVIDIA A100-SXM4-40GB MIG 3g.20gb"]
    text = (state_dir / "state").read_text()
    assert text.startswith("gpukit-nvml-state 1\n")
    assert f"uuid {made}" in text
    assert not (state_dir / "state.tmp").exists()


WORKER = """
    import json, os, sys, time, pynvml
    go, own = sys.argv[1], int(sys.argv[2])
    pynvml.nvmlInit()
    shared = pynvml.nvmlDeviceGetHandleByIndex(0)
    mine = pynvml.nvmlDeviceGetHandleByIndex(own)
    while not os.path.exists(go):
        time.sleep(0.001)
    won = lost = created = 0
    for _ in range(7):
        try:
            pynvml.nvmlDeviceCreateGpuInstance(shared, 19)  # 1g.5gb
            won += 1
        except pynvml.NVMLError_InsufficientResources:
            lost += 1
        pynvml.nvmlDeviceCreateGpuInstance(mine, 19)
        created += 1
    print(json.dumps({"won": won, "lost": lost, "created": created}))
"""


def test_concurrent_changes_lose_nothing_and_never_overallocate(
    nvml: Any, ctl: MockControl, nvml_env: dict[str, str], tmp_path: Path
) -> None:
    for i in (0, 1, 2):
        enable_mig(nvml, ctl, i)
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(WORKER), str(go), str(own)],
            env=nvml_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for own in (1, 2)
    ]
    time.sleep(0.3)  # both started and waiting
    go.touch()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    # 14 attempts on GPU 0, which holds 7 1g instances: exactly 7 succeed, between the two.
    assert sum(r["won"] for r in results) == 7
    assert sum(r["lost"] for r in results) == 7
    assert [r["created"] for r in results] == [7, 7]
    for i in (0, 1, 2):  # and every success is in the state (no lost update)
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        assert gi_count(nvml, h) == 7
        assert nvml.nvmlDeviceGetGpuInstanceRemainingCapacity(h, P1) == 0


def test_process_killed_mid_change_leaves_state_valid(
    nvml: Any, ctl: MockControl, nvml_env: dict[str, str], state_dir: Path
) -> None:
    h = enable_mig(nvml, ctl, 0)
    nvml.nvmlDeviceCreateGpuInstance(h, P3)
    before = (state_dir / "state").read_text()
    env = {**nvml_env, "GPUKIT_NVML_TEST_COMMIT_DELAY_MS": "20000"}  # stalls half-way through
    code = """
        import pynvml
        pynvml.nvmlInit()
        pynvml.nvmlDeviceCreateGpuInstance(pynvml.nvmlDeviceGetHandleByIndex(0), 9)
        print("finished")
    """
    p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    tmp = state_dir / "state.tmp"
    deadline = time.monotonic() + 15
    while not (tmp.exists() and tmp.stat().st_size > 0) and time.monotonic() < deadline:
        time.sleep(0.005)
    assert tmp.exists(), "the writer never got to its temp file"
    os.kill(p.pid, signal.SIGKILL)
    out, _ = p.communicate(timeout=10)
    assert p.returncode == -signal.SIGKILL and "finished" not in out
    half = tmp.read_text()
    assert len(half) < len(before) + 40 and "gpukit-nvml-state 1" in half  # it died mid-write
    # the state is the one before the change, readable, and not locked
    assert (state_dir / "state").read_text() == before
    assert gi_count(nvml, h, P3) == 1
    t0 = time.monotonic()
    nvml.nvmlDeviceCreateGpuInstance(h, P3)
    assert time.monotonic() - t0 < 1.0
    assert run_json(
        """
        import json, pynvml
        pynvml.nvmlInit()
        print(json.dumps(pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity(
            pynvml.nvmlDeviceGetHandleByIndex(0), 9)))
        """,
        nvml_env,
    ) == 0


def test_state_belongs_to_the_physical_gpus(
    nvml: Any, ctl: MockControl, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same state dir seen with another node seed (other GPU UUIDs): fresh GPUs; back with
    the original seed: the layout is there again."""
    h = enable_mig(nvml, ctl, 0)
    nvml.nvmlDeviceCreateGpuInstance(h, P3)
    nvml.nvmlShutdown()
    monkeypatch.setenv(mock.ENV_SEED, "another-node")
    nvml.nvmlInit()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetMigMode(h) == [0, 0]
    nvml.nvmlShutdown()
    monkeypatch.delenv(mock.ENV_SEED)
    nvml.nvmlInit()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetMigMode(h) == [1, 1] and gi_count(nvml, h, P3) == 1


def test_readers_need_no_state_dir(nvml_env: dict[str, str], tmp_path: Path) -> None:
    """A node whose state dir does not exist yet reads fresh GPUs without creating anything."""
    env = {**nvml_env, mock.ENV_STATE_DIR: str(tmp_path / "absent")}
    out = run_py(
        "import pynvml\npynvml.nvmlInit()\n"
        "print(pynvml.nvmlDeviceGetMigMode(pynvml.nvmlDeviceGetHandleByIndex(0)))",
        env,
    ).stdout
    assert out.strip() == "[0, 0]"
    assert not (tmp_path / "absent").exists()
