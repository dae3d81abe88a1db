"""Events: event sets, registration, nvmlEventSetWait_v2 with the caller's timeout, XIDs and ECC
errors injected at run time (also from another process and through the CLI) reaching a waiting
process in well under 100 ms, MIG attribution, and lost GPUs."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from nvmltest import nvml_error

from gpukit.lab.nvml.control import MockControl, MockNvmlError

pytestmark = pytest.mark.nvml
XID = 0x8  # nvmlEventTypeXidCriticalError
DBE, SBE = 0x2, 0x1
NO_ID = 0xFFFFFFFF
LATENCY_LIMIT_S = 0.100


def event_set(nvml: Any, gpus: list[int], types: int = XID) -> Any:
    es = nvml.nvmlEventSetCreate()
    for i in gpus:
        nvml.nvmlDeviceRegisterEvents(nvml.nvmlDeviceGetHandleByIndex(i), types, es)
    return es


def test_supported_types_and_registration(nvml: Any, ctl: MockControl) -> None:
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    supported = nvml.nvmlDeviceGetSupportedEventTypes(h)
    # what an H100 answers on driver 580.159.04: every type nvml.h defines (nvmlEventTypeAll)
    assert supported == nvml.nvmlEventTypeAll == 0xFF9F
    es = nvml.nvmlEventSetCreate()
    nvml.nvmlDeviceRegisterEvents(h, supported, es)
    nvml.nvmlDeviceRegisterEvents(h, 0x20 | 0x40, es)  # undefined bits below 0x10000: accepted
    for bit in (0x10000, 0x80000, 1 << 40):  # that driver refuses every bit from 0x10000 on
        nvml_error(nvml, nvml.NVML_ERROR_NOT_SUPPORTED, nvml.nvmlDeviceRegisterEvents, h, bit, es)
    h2 = nvml.nvmlDeviceGetHandleByIndex(2)
    ctl.lose(2)
    nvml_error(nvml, nvml.NVML_ERROR_GPU_IS_LOST, nvml.nvmlDeviceRegisterEvents, h2, XID, es)
    nvml.nvmlDeviceRegisterEvents(nvml.nvmlDeviceGetHandleByIndex(3), XID, es)
    nvml.nvmlEventSetFree(es)


def test_wait_times_out_with_the_callers_timeout(nvml: Any) -> None:
    es = event_set(nvml, [0])
    t0 = time.monotonic()
    nvml_error(nvml, nvml.NVML_ERROR_TIMEOUT, nvml.nvmlEventSetWait, es, 150)
    took = time.monotonic() - t0
    assert 0.14 <= took < 0.6, took
    t0 = time.monotonic()
    nvml_error(nvml, nvml.NVML_ERROR_TIMEOUT, nvml.nvmlEventSetWait, es, 0)
    assert time.monotonic() - t0 < 0.05
    nvml.nvmlEventSetFree(es)


def test_xid_reaches_a_waiting_thread(nvml: Any, ctl: MockControl) -> None:
    es = event_set(nvml, [3])
    sent: list[float] = []

    def inject() -> None:
        time.sleep(0.05)
        sent.append(time.monotonic())
        ctl.inject_xid(gpu=3, xid=79)

    t = threading.Thread(target=inject)
    t.start()
    data = nvml.nvmlEventSetWait(es, 5000)
    got = time.monotonic()
    t.join()
    assert (data.eventType, data.eventData) == (XID, 79)
    assert nvml.nvmlDeviceGetIndex(data.device) == 3
    assert (data.gpuInstanceId, data.computeInstanceId) == (NO_ID, NO_ID)
    assert got - sent[0] < LATENCY_LIMIT_S
    nvml.nvmlEventSetFree(es)


def test_filtering_by_device_type_and_time(nvml: Any, ctl: MockControl) -> None:
    ctl.inject_xid(gpu=1, xid=31)  # before the set exists: not delivered
    es = event_set(nvml, [1])
    ctl.inject_xid(gpu=2, xid=48)  # another GPU
    ctl.inject_event(gpu=1, event_type="double-bit-ecc")  # a type not registered
    nvml_error(nvml, nvml.NVML_ERROR_TIMEOUT, nvml.nvmlEventSetWait, es, 100)
    ctl.inject_xid(gpu=1, xid=94)
    assert nvml.nvmlEventSetWait(es, 1000).eventData == 94
    nvml.nvmlEventSetFree(es)


def test_ecc_and_mig_attributed_events(nvml: Any, ctl: MockControl) -> None:
    es = event_set(nvml, [0, 5], XID | DBE)
    ctl.inject_xid(gpu=5, xid=48, event_type="double-bit-ecc")
    ctl.inject_xid(gpu=0, xid=43, gi=1, ci=0)
    a = nvml.nvmlEventSetWait(es, 1000)
    b = nvml.nvmlEventSetWait(es, 1000)
    assert (nvml.nvmlDeviceGetIndex(a.device), a.eventType, a.eventData) == (5, DBE, 48)
    assert (b.eventType, b.eventData, b.gpuInstanceId, b.computeInstanceId) == (XID, 43, 1, 0)
    with pytest.raises(MockNvmlError, match="Invalid Argument"):
        ctl.inject_xid(gpu=8, xid=79)  # no GPU 8 on this node
    nvml.nvmlEventSetFree(es)


def test_every_event_set_gets_the_event(nvml: Any, ctl: MockControl) -> None:
    a, b = event_set(nvml, [6]), event_set(nvml, [6])
    ctl.inject_xid(gpu=6, xid=63)
    assert nvml.nvmlEventSetWait(a, 1000).eventData == 63
    assert nvml.nvmlEventSetWait(b, 1000).eventData == 63
    nvml_error(nvml, nvml.NVML_ERROR_TIMEOUT, nvml.nvmlEventSetWait, a, 50)


def test_lost_gpu_ends_the_wait(nvml: Any, ctl: MockControl) -> None:
    es = event_set(nvml, [1])
    threading.Timer(0.05, ctl.lose, args=(1,)).start()
    nvml_error(nvml, nvml.NVML_ERROR_GPU_IS_LOST, nvml.nvmlEventSetWait, es, 5000)


WAITER = """
    import json, sys, time, pynvml
    pynvml.nvmlInit()
    es = pynvml.nvmlEventSetCreate()
    pynvml.nvmlDeviceRegisterEvents(pynvml.nvmlDeviceGetHandleByIndex(int(sys.argv[1])),
                                    pynvml.nvmlEventTypeXidCriticalError, es)
    print("ready", flush=True)
    for _ in range(int(sys.argv[2])):
        d = pynvml.nvmlEventSetWait(es, 10000)
        print(json.dumps({"xid": d.eventData, "t": time.time_ns()}), flush=True)
"""


def _waiter(env: dict[str, str], gpu: int, n: int) -> subprocess.Popen[str]:
    p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(WAITER), str(gpu), str(n)],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None
    assert p.stdout.readline().strip() == "ready", p.stderr.read() if p.stderr else ""
    return p


def test_xid_latency_to_another_process(
    nvml_env: dict[str, str], ctl: MockControl, record_property: Any
) -> None:
    """Inject 10 XIDs from this process while another one waits: each must arrive < 100 ms."""
    n = 10
    p = _waiter(nvml_env, 3, n)
    assert p.stdout is not None
    latencies = []
    for k in range(n):
        sent = time.time_ns()
        ctl.inject_xid(gpu=3, xid=100 + k)
        got = json.loads(p.stdout.readline())
        assert got["xid"] == 100 + k
        latencies.append((got["t"] - sent) / 1e9)
        time.sleep(0.02)
    p.wait(timeout=10)
    record_property("xid_latency_max_ms", round(max(latencies) * 1000, 2))
    record_property("xid_latency_median_ms", round(sorted(latencies)[n // 2] * 1000, 2))
    print(f"XID latency across processes: max {max(latencies) * 1000:.2f} ms, "
          f"median {sorted(latencies)[n // 2] * 1000:.2f} ms")
    assert max(latencies) < LATENCY_LIMIT_S, latencies


def test_xid_through_the_cli(
    nvml_env: dict[str, str], state_dir: Path, record_property: Any
) -> None:
    """`python -m gpukit.lab.nvml inject-xid` reaches a waiting process; latency measured from the
    event's timestamp (written by the library as it injects) to the waiter's receipt."""
    p = _waiter(nvml_env, 3, 1)
    assert p.stdout is not None
    cli = subprocess.run(
        [sys.executable, "-m", "gpukit.lab.nvml", "inject-xid", "--gpu", "3", "--xid", "79"],
        env=nvml_env, capture_output=True, text=True, timeout=30,
    )
    assert cli.returncode == 0, cli.stderr
    got = json.loads(p.stdout.readline())
    p.wait(timeout=10)
    assert got["xid"] == 79
    line = (state_dir / "events").read_text().splitlines()[-1].split()
    assert line[:6] == ["E", "3", str(XID), "79", str(NO_ID), str(NO_ID)]
    latency = (got["t"] - int(line[6])) / 1e9
    record_property("cli_xid_latency_ms", round(latency * 1000, 2))
    assert 0 <= latency < LATENCY_LIMIT_S


def test_boot_clears_the_event_log_and_sets_keep_working(
    nvml: Any, ctl: MockControl, state_dir: Path
) -> None:
    es = event_set(nvml, [0])
    for xid in (31, 43, 45):
        ctl.inject_xid(gpu=0, xid=xid)
    assert nvml.nvmlEventSetWait(es, 1000).eventData == 31  # two still unread
    ctl.boot()
    assert (state_dir / "events").stat().st_size == 0
    ctl.inject_xid(gpu=0, xid=79)
    assert nvml.nvmlEventSetWait(es, 1000).eventData == 79  # the new one, not stale ones
    nvml_error(nvml, nvml.NVML_ERROR_TIMEOUT, nvml.nvmlEventSetWait, es, 50)
