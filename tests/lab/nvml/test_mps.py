"""MPS on the lab's stand-in driver: the control daemon (gpukit.lab.mps.mps_control, as the driver
package ships it behind nvidia-cuda-mps-control / -server), the workload as an MPS client, and
what the mock NVML makes of both (compute mode, server and clients listed with their memory)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpukit.lab.mps import mps_control
from gpukit.lab.nvml import workload
from gpukit.lab.nvml.control import MockControl

pytestmark = pytest.mark.nvml

TOOL = Path(mps_control.__file__)
CACHE_S = 0.3  # the library looks at the client files at most every 0.2 s
NVML_COMPUTEMODE_EXCLUSIVE_PROCESS = 3


class Mps:
    """One control daemon's directories, and the tool run against them."""

    def __init__(self, root: Path) -> None:
        self.pipe, self.log = root / "pipe", root / "log"

    def env(self, **extra: str) -> dict[str, str]:
        """This process's environment (the test's mock NVML included) and the directories."""
        return dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=str(self.pipe),
                    CUDA_MPS_LOG_DIRECTORY=str(self.log), **extra)

    def start(self, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-I", str(TOOL), "control", "-d"],
                              env=self.env(**extra), capture_output=True, text=True, timeout=10)

    def control(self, *commands: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-I", str(TOOL), "control"], env=self.env(),
                              input="".join(c + "\n" for c in commands), capture_output=True,
                              text=True, timeout=10)

    def daemon_pids(self) -> set[int]:
        log = self.log / "control.log"
        text = log.read_text() if log.exists() else ""
        return {int(p) for p in re.findall(r"Control (\d+)\] Starting control daemon", text)}


def alive(pid: int) -> bool:
    """Running: a daemon's parent is init, which may reap it late (a zombie has ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.fixture
def mps(tmp_path: Path) -> Iterator[Mps]:
    m = Mps(tmp_path / "mps")
    yield m
    m.control("quit")  # stops the daemon this test started, and its server
    for pid in m.daemon_pids():
        deadline = time.monotonic() + 5
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_daemon_starts_once_answers_commands_and_quits(mps: Mps) -> None:
    assert mps.control("get_server_list").returncode == 1  # no daemon yet
    r = mps.start()
    assert r.returncode == 0, r.stderr
    assert (mps.pipe / "control").exists()
    assert int((mps.pipe / "nvidia-cuda-mps-control.pid").read_text()) in mps.daemon_pids()
    second = mps.start()
    assert second.returncode == 1
    assert "An instance of this daemon is already running" in second.stderr
    r = mps.control("get_server_list", "get_default_active_thread_percentage",
                    "set_default_active_thread_percentage 25",
                    "get_default_active_thread_percentage",
                    "set_default_device_pinned_mem_limit 0 2G",
                    "set_default_device_pinned_mem_limit 1 1024M",
                    "get_default_device_pinned_mem_limit 0",
                    "get_default_device_pinned_mem_limit 1")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["100.0", "25.0", "25.0", "2048M", "1024M"]
    r = mps.control("start_server -uid 0", "get_server_list")
    (server,) = map(int, r.stdout.split())
    assert alive(server)
    assert mps.control("quit").returncode == 0
    (daemon,) = mps.daemon_pids()
    deadline = time.monotonic() + 5
    while (alive(daemon) or alive(server)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(daemon) and not alive(server)
    assert not (mps.pipe / "control").exists()
    assert not (mps.pipe / "nvidia-cuda-mps-control.pid").exists()
    log = (mps.log / "control.log").read_text()
    for line in (f"set env CUDA_MPS_PIPE_DIRECTORY={mps.pipe}",
                 "Cmd:set_default_active_thread_percentage 25", "Cmd:quit",
                 f"Starting new server {server} for user 0", "Exit"):
        assert line in log
    assert mps.control("get_server_list").returncode == 1


# ---- the workload as an MPS client, and NVML ------------------------------------------------


@pytest.fixture(scope="module")
def gpu_work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return workload.build_binary(tmp_path_factory.mktemp("gpu-work") / "gpu-work")


def run_work(binary: Path, dev: Path, state_dir: Path, env: dict[str, str],
             *args: str) -> subprocess.Popen[str]:
    clients = state_dir / workload.CLIENTS_DIR
    clients.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([str(binary), "--clients", str(clients), *args],
                            env={"GPUKIT_LAB_CUDA_DEV_ROOT": str(dev), **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def started(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    first = proc.stdout.readline()
    assert first.startswith("GPU_WORK_DEVICES=") and first.strip() != "GPU_WORK_DEVICES=", first


def fake_dev(root: Path, gpu: int) -> Path:
    dev = root / f"dev{gpu}"
    (dev / "nvidia-caps").mkdir(parents=True)
    (dev / f"nvidia{gpu}").touch()
    return dev


def stop(*procs: subprocess.Popen[str]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
        p.wait()


def test_mps_clients_server_and_limits_in_nvml(nvml: Any, gpu_work: Path, state_dir: Path,
                                               tmp_path: Path, mps: Mps) -> None:
    """A daemon for GPU 2 (CUDA_VISIBLE_DEVICES=its UUID, as the agent starts one per GPU), two
    clients there: one MPS server is the process NVML lists, the clients are its MPS processes
    with their memory; a client above the daemon's limit, or above its own, is refused as
    cudaMalloc is; one on another GPU finds no device through this daemon."""
    uuid = nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(2))
    assert mps.start(CUDA_VISIBLE_DEVICES=uuid).returncode == 0
    # By UUID, as gpukit and NVIDIA's DRA driver set it (the daemon's device 0 here).
    r = mps.control(f"set_default_device_pinned_mem_limit {uuid} 1G",
                    "get_default_device_pinned_mem_limit 0",
                    "set_default_device_pinned_mem_limit GPU-not-served 1G")
    assert r.returncode == 0 and r.stdout.splitlines() == ["1024M", "Invalid device"], r
    h = nvml.nvmlDeviceGetHandleByIndex(2)
    nvml.nvmlDeviceSetComputeMode(h, NVML_COMPUTEMODE_EXCLUSIVE_PROCESS)  # as the agent does
    dev = fake_dev(tmp_path, 2)
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(mps.pipe)}
    a = run_work(gpu_work, dev, state_dir, env, "--mem-mb", "512")
    b = run_work(gpu_work, dev, state_dir, env, "--mem-mb", "256", "--util", "30")
    try:
        started(a)
        started(b)
        (server,) = map(int, mps.control("get_server_list").stdout.split())
        clients = set(map(int, mps.control(f"get_client_list {server}").stdout.split()))
        assert clients == {a.pid, b.pid}
        time.sleep(CACHE_S)
        procs = nvml.nvmlDeviceGetComputeRunningProcesses(h)
        assert [(p.pid, p.usedGpuMemory) for p in procs] == [(server, 32 << 20)]
        got = {(p.pid, p.usedGpuMemory >> 20)
               for p in nvml.nvmlDeviceGetMPSComputeRunningProcesses(h)}
        assert got == {(a.pid, 512), (b.pid, 256)}
        assert nvml.nvmlDeviceGetMPSComputeRunningProcesses(
            nvml.nvmlDeviceGetHandleByIndex(1)) == []

        over = run_work(gpu_work, dev, state_dir, env, "--mem-mb", "2048")
        _, err = over.communicate(timeout=10)
        assert over.returncode == 4 and "out of memory" in err, err
        own = run_work(gpu_work, dev, state_dir,
                       {**env, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=256M"}, "--mem-mb", "512")
        _, err = own.communicate(timeout=10)
        assert own.returncode == 4 and "out of memory" in err, err
        elsewhere = run_work(gpu_work, fake_dev(tmp_path, 1), state_dir, env)
        _, err = elsewhere.communicate(timeout=10)
        assert elsewhere.returncode == 2 and "no CUDA-capable device" in err, err
        # not through MPS: the server holds the EXCLUSIVE_PROCESS GPU's one context
        alone = run_work(gpu_work, dev, state_dir, {}, "--mem-mb", "64")
        _, err = alone.communicate(timeout=10)
        assert alone.returncode == 5 and "busy or unavailable" in err, err
    finally:
        stop(a, b)
    mps.control("quit")
    time.sleep(CACHE_S + 0.3)
    h = nvml.nvmlDeviceGetHandleByIndex(2)
    assert nvml.nvmlDeviceGetComputeRunningProcesses(h) == []
    assert nvml.nvmlDeviceGetMPSComputeRunningProcesses(h) == []


def test_exclusive_process_refuses_a_second_context(nvml: Any, gpu_work: Path, state_dir: Path,
                                                    tmp_path: Path) -> None:
    """Compute mode is the node's: set here, the workload (another process) sees it; a second
    process on an EXCLUSIVE_PROCESS GPU gets 'all CUDA-capable devices are busy or unavailable';
    in DEFAULT both run."""
    h = nvml.nvmlDeviceGetHandleByIndex(2)
    nvml.nvmlDeviceSetComputeMode(h, NVML_COMPUTEMODE_EXCLUSIVE_PROCESS)
    assert nvml.nvmlDeviceGetComputeMode(h) == NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
    assert nvml.nvmlDeviceGetComputeMode(nvml.nvmlDeviceGetHandleByIndex(1)) == 0
    dev = fake_dev(tmp_path, 2)
    first = run_work(gpu_work, dev, state_dir, {}, "--mem-mb", "64")
    try:
        started(first)
        second = run_work(gpu_work, dev, state_dir, {}, "--mem-mb", "64")
        _, err = second.communicate(timeout=10)
        assert second.returncode == 5, err
        assert "all CUDA-capable devices are busy or unavailable" in err
        nvml.nvmlDeviceSetComputeMode(h, 0)
        again = run_work(gpu_work, dev, state_dir, {}, "--mem-mb", "64")
        try:
            started(again)
        finally:
            stop(again)
    finally:
        stop(first)


def test_compute_mode_is_default_again_after_a_boot(nvml: Any, ctl: MockControl) -> None:
    """As on a real node, where the driver loads with every GPU in DEFAULT: the agent sets
    EXCLUSIVE_PROCESS again after a reboot."""
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    nvml.nvmlDeviceSetComputeMode(h, NVML_COMPUTEMODE_EXCLUSIVE_PROCESS)
    with pytest.raises(nvml.NVMLError):
        nvml.nvmlDeviceSetComputeMode(h, 1)  # EXCLUSIVE_THREAD: gone from the driver
    assert nvml.nvmlDeviceGetComputeMode(h) == NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
    ctl.boot()
    assert nvml.nvmlDeviceGetComputeMode(h) == 0
