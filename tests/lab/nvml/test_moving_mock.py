"""The mock NVML's telemetry moves with the work on each GPU (gpukit/lab/nvml/src/telemetry.c):
utilisation, memory, power, temperature, clocks, energy and PCIe follow the processes set
through the lab control and the lab workload (gpu-work) that registers itself on the devices it
can open, for exactly as long as it lives; ECC counters and remapped rows follow injected ECC
errors; MIG-enabled GPUs and MIG device handles answer what the driver answers."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from nvmltest import enable_mig, nvml_error

from gpukit.lab.nvml import workload
from gpukit.lab.nvml.control import MockControl

pytestmark = pytest.mark.nvml

CACHE_S = 0.3  # the library looks at the workload's client files at most every 0.2 s


def sample(nvml: Any, index: int) -> dict[str, int]:
    h = nvml.nvmlDeviceGetHandleByIndex(index)
    u = nvml.nvmlDeviceGetUtilizationRates(h)
    return {
        "util": u.gpu, "mem_util": u.memory,
        "power_mw": nvml.nvmlDeviceGetPowerUsage(h),
        "temp": nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU),
        "sm": nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM),
        "mem_clock": nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_MEM),
        "used": nvml.nvmlDeviceGetMemoryInfo(h).used,
        "energy": nvml.nvmlDeviceGetTotalEnergyConsumption(h),
        "tx": nvml.nvmlDeviceGetPcieThroughput(h, nvml.NVML_PCIE_UTIL_TX_BYTES),
        "procs": len(nvml.nvmlDeviceGetComputeRunningProcesses(h)),
    }


def test_an_idle_gpu_looks_idle(nvml: Any, ctl: MockControl) -> None:
    """The a100 profile's idle figures, as an idle A100 shows them: 0 %, 62 W, 31 C, SM at its
    idle clock, HBM at its fixed clock, no process, a few KB/s on PCIe, no replays."""
    ctl.boot()
    s = sample(nvml, 0)
    assert (s["util"], s["mem_util"], s["power_mw"], s["temp"]) == (0, 0, 62000, 31)
    assert (s["sm"], s["mem_clock"], s["procs"]) == (210, 1215, 0)
    assert s["tx"] < 100
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetMaxClockInfo(h, nvml.NVML_CLOCK_SM) == 1410
    assert nvml.nvmlDeviceGetPcieReplayCounter(h) == 0
    # energy since the boot: idle power times the time since (62 W x a few ms)
    first = nvml.nvmlDeviceGetTotalEnergyConsumption(h)
    time.sleep(0.2)
    later = nvml.nvmlDeviceGetTotalEnergyConsumption(h)
    assert 62 * 150 <= later - first <= 62 * 1000, (first, later)


def test_busy_values_move_with_the_load(nvml: Any, ctl: MockControl) -> None:
    ctl.boot()
    idle = sample(nvml, 2)
    ctl.set_process(2, pid=100, mem_mb=2048, util=40)
    half = sample(nvml, 2)
    assert half["util"] == 40 and half["mem_util"] == 18
    assert idle["power_mw"] < half["power_mw"] and idle["temp"] < half["temp"]
    assert half["sm"] == 1410 and half["used"] - idle["used"] == 2048 << 20
    assert half["tx"] > idle["tx"] and half["procs"] == 1
    ctl.set_process(2, pid=101, mem_mb=1024, util=90)  # together more than the GPU: 100 %
    full = sample(nvml, 2)
    assert (full["util"], full["power_mw"], full["temp"]) == (100, 340000, 66)
    assert sample(nvml, 3)["util"] == 0  # the others stay idle
    ctl.clear_processes(gpu=2)
    after = sample(nvml, 2)
    assert {k: after[k] for k in ("util", "power_mw", "temp", "sm", "used", "procs")} == {
        k: idle[k] for k in ("util", "power_mw", "temp", "sm", "used", "procs")}


def test_energy_is_monotonic_and_grows_faster_under_load(nvml: Any, ctl: MockControl) -> None:
    ctl.boot()
    h = nvml.nvmlDeviceGetHandleByIndex(1)

    def rate(seconds: float) -> float:
        a = nvml.nvmlDeviceGetTotalEnergyConsumption(h)
        time.sleep(seconds)
        return (nvml.nvmlDeviceGetTotalEnergyConsumption(h) - a) / seconds

    idle_mw = rate(0.3)
    ctl.set_process(1, pid=7, mem_mb=10, util=100)
    busy_mw = rate(0.3)
    assert 50000 < idle_mw < 80000 and 300000 < busy_mw < 380000, (idle_mw, busy_mw)
    before = nvml.nvmlDeviceGetTotalEnergyConsumption(h)
    ctl.clear_processes(pid=7)  # its work stays in the counter
    after = nvml.nvmlDeviceGetTotalEnergyConsumption(h)
    assert after >= before


def test_per_process_memory_in_every_versioned_call(nvml: Any, ctl: MockControl) -> None:
    ctl.set_process(4, pid=4242, mem_mb=300, name="trainer", util=10)
    h = nvml.nvmlDeviceGetHandleByIndex(4)
    (p,) = nvml.nvmlDeviceGetComputeRunningProcesses(h)  # pynvml: the _v3 entry point
    assert (p.pid, p.usedGpuMemory) == (4242, 300 << 20)
    (p2,) = nvml.nvmlDeviceGetComputeRunningProcesses_v2(h)
    assert (p2.pid, p2.usedGpuMemory) == (4242, 300 << 20)
    m = nvml.nvmlDeviceGetMemoryInfo(h, version=nvml.nvmlMemory_v2)
    assert m.used == 300 << 20 and m.free == m.total - m.reserved - m.used


def test_mig_enabled_gpus_and_mig_devices_answer_as_the_driver(nvml: Any,
                                                              ctl: MockControl) -> None:
    """Utilisation is not supported with MIG enabled ("On MIG-enabled GPUs, querying device
    utilization rates is not currently supported"); MIG device handles answer memory and
    processes of their instance only; the GPU's power, temperature, clocks and energy are the
    parent's and still move with work in its instances."""
    h = enable_mig(nvml, ctl, 0)
    _gi, _ci, gid = mig_device(nvml, h, nvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE,
                               nvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE)
    mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
    nvml_error(nvml, nvml.NVML_ERROR_NOT_SUPPORTED, nvml.nvmlDeviceGetUtilizationRates, h)
    for fn, args in ((nvml.nvmlDeviceGetUtilizationRates, ()),
                     (nvml.nvmlDeviceGetTemperature, (nvml.NVML_TEMPERATURE_GPU,)),
                     (nvml.nvmlDeviceGetPowerUsage, ()),
                     (nvml.nvmlDeviceGetClockInfo, (nvml.NVML_CLOCK_SM,)),
                     (nvml.nvmlDeviceGetTotalEnergyConsumption, ())):
        nvml_error(nvml, nvml.NVML_ERROR_NOT_SUPPORTED, fn, mig, *args)
    idle_power = nvml.nvmlDeviceGetPowerUsage(h)
    ctl.set_process(0, pid=55, mem_mb=1000, gi=gid, ci=0, util=100)
    assert nvml.nvmlDeviceGetMemoryInfo(mig).used == 1000 << 20
    (p,) = nvml.nvmlDeviceGetComputeRunningProcesses(mig)
    assert (p.pid, p.gpuInstanceId, p.computeInstanceId) == (55, gid, 0)
    # a half-GPU instance (id 1 or 2) flat out: half the GPU's extra power
    assert nvml.nvmlDeviceGetPowerUsage(h) == idle_power + (340000 - 62000) // 2
    ctl.clear_processes(pid=55)


def test_ecc_errors_and_remapped_rows_follow_injected_errors(nvml: Any,
                                                            ctl: MockControl) -> None:
    h = nvml.nvmlDeviceGetHandleByIndex(5)
    unc, cor = nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
    vol, agg = nvml.NVML_VOLATILE_ECC, nvml.NVML_AGGREGATE_ECC
    assert nvml.nvmlDeviceGetTotalEccErrors(h, unc, vol) == 0
    assert tuple(nvml.nvmlDeviceGetRemappedRows(h)) == (0, 0, 0, 0)
    ctl.inject_xid(5, 48, event_type="double-bit-ecc")
    ctl.inject_xid(5, 0, event_type="single-bit-ecc")
    ctl.inject_xid(5, 0, event_type="single-bit-ecc")
    assert [nvml.nvmlDeviceGetTotalEccErrors(h, t, c) for t in (unc, cor) for c in (vol, agg)
            ] == [1, 1, 2, 2]
    assert tuple(nvml.nvmlDeviceGetRemappedRows(h)) == (0, 1, 1, 0)  # pending until a reset
    ctl.reset(5)
    assert [nvml.nvmlDeviceGetTotalEccErrors(h, t, c) for t in (unc, cor) for c in (vol, agg)
            ] == [0, 1, 0, 2]
    assert tuple(nvml.nvmlDeviceGetRemappedRows(h)) == (0, 1, 0, 0)


@pytest.mark.parametrize("profile_name", ["t4-x2"])
def test_turing_has_no_row_remapping(nvml: Any) -> None:
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    nvml_error(nvml, nvml.NVML_ERROR_NOT_SUPPORTED, nvml.nvmlDeviceGetRemappedRows, h)
    assert nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM) == 300


def mig_device(nvml: Any, h: Any, gi_const: int, ci_const: int) -> tuple[Any, Any, int]:
    """A GPU instance and one compute instance filling it: (gi, ci, GPU instance id)."""
    info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(h, gi_const)
    gi = nvml.nvmlDeviceCreateGpuInstance(h, info.id)
    ci_info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
        gi, ci_const, nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
    ci = nvml.nvmlGpuInstanceCreateComputeInstance(gi, ci_info.id)
    return gi, ci, nvml.nvmlGpuInstanceGetInfo(gi).id


# ---- the lab workload --------------------------------------------------------------------


@pytest.fixture(scope="module")
def gpu_work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return workload.build_binary(tmp_path_factory.mktemp("gpu-work") / "gpu-work")


def fake_dev(root: Path, gpus: list[int], caps: list[int] = ()) -> Path:  # type: ignore[assignment]
    """Device nodes as plain files (open() works: present and allowed)."""
    dev = root / "dev"
    (dev / "nvidia-caps").mkdir(parents=True)
    (dev / "nvidiactl").touch()
    for g in gpus:
        (dev / f"nvidia{g}").touch()
    for c in caps:
        (dev / "nvidia-caps" / f"nvidia-cap{c}").touch()
    return dev


def start_work(binary: Path, dev: Path, state_dir: Path, *args: str) -> subprocess.Popen[str]:
    clients = state_dir / workload.CLIENTS_DIR
    clients.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([str(binary), "--clients", str(clients), *args],
                            env={"GPUKIT_LAB_CUDA_DEV_ROOT": str(dev)}, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None
    first = proc.stdout.readline()
    assert first.startswith("GPU_WORK_DEVICES="), first
    return proc


def test_the_workload_counts_while_it_lives(nvml: Any, ctl: MockControl, gpu_work: Path,
                                            state_dir: Path, tmp_path: Path) -> None:
    """gpu-work on GPUs 3 and 6 shows as a process on each with its memory and moves their
    utilisation; killed (SIGKILL: no clean-up of its own), it is gone at once, and its energy
    stays counted."""
    ctl.boot()
    dev = fake_dev(tmp_path, [3, 6])
    proc = start_work(gpu_work, dev, state_dir, "--mem-mb", "512", "--util", "70")
    try:
        time.sleep(CACHE_S)
        for index in (3, 6):
            s = sample(nvml, index)
            assert (s["util"], s["procs"], s["sm"]) == (70, 1, 1410), s
            (p,) = nvml.nvmlDeviceGetComputeRunningProcesses(
                nvml.nvmlDeviceGetHandleByIndex(index))
            assert (p.pid, p.usedGpuMemory) == (proc.pid, 512 << 20)  # its pid, as we see it
        assert sample(nvml, 2)["procs"] == 0
        energy = sample(nvml, 3)["energy"]
        time.sleep(1.2)  # a heartbeat: its work so far is on file
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    time.sleep(CACHE_S)
    s = sample(nvml, 3)
    assert (s["util"], s["procs"], s["sm"]) == (0, 0, 210), s
    assert s["energy"] > energy
    ctl.set_process(0, pid=1, mem_mb=1)  # a writer folds the ended client into the state
    assert not list((state_dir / workload.CLIENTS_DIR).iterdir())
    assert sample(nvml, 3)["energy"] >= s["energy"]


def test_the_workload_on_a_mig_device(nvml: Any, ctl: MockControl, gpu_work: Path,
                                      state_dir: Path, tmp_path: Path) -> None:
    """Given a MIG device's caps nodes (and its parent's node), the workload is a process in
    that compute instance only, and the instance cannot be destroyed while it runs."""
    h = enable_mig(nvml, ctl, 1)
    gi, ci, gid = mig_device(nvml, h, nvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE,
                             nvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE)
    gi_cap = 3 + 135 * 1 + 9 * gid  # the driver's fixed table (mig-minors), GPU minor 1
    dev = fake_dev(tmp_path, [1], [gi_cap, gi_cap + 1])
    proc = start_work(gpu_work, dev, state_dir, "--mem-mb", "256")
    try:
        time.sleep(CACHE_S)
        mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
        (p,) = nvml.nvmlDeviceGetComputeRunningProcesses(mig)
        assert (p.gpuInstanceId, p.computeInstanceId, p.usedGpuMemory) == (gid, 0, 256 << 20)
        assert nvml.nvmlDeviceGetMemoryInfo(mig).used == 256 << 20
        with pytest.raises(nvml.NVMLError) as e:
            nvml.nvmlComputeInstanceDestroy(ci)
        assert e.value.value == nvml.NVML_ERROR_IN_USE
    finally:
        proc.terminate()
        assert proc.wait() == 0
    time.sleep(CACHE_S)
    assert nvml.nvmlDeviceGetComputeRunningProcesses(mig) == []
    nvml.nvmlComputeInstanceDestroy(ci)
    nvml.nvmlGpuInstanceDestroy(gi)


def test_the_workload_without_a_device_exits_2(gpu_work: Path, state_dir: Path,
                                               tmp_path: Path) -> None:
    dev = fake_dev(tmp_path, [])
    proc = subprocess.run([str(gpu_work), "--clients", str(state_dir)], capture_output=True,
                          text=True, env={"GPUKIT_LAB_CUDA_DEV_ROOT": str(dev)}, check=False)
    assert proc.returncode == 2 and "no GPU device node" in proc.stderr
