"""The stand-in driver's surface: the /proc/driver files the mock library writes (static ones at
boot, MIG capability files after every change, whoever makes it) agree with the MIG state and
with gpukit.lab.driver_surface's rendering; the PCI sysfs, DMI and /dev/nvidia-caps trees read
as NVIDIA's consumers read them."""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from nvmltest import enable_mig, run_py

from gpukit.lab import driver_surface as ds
from gpukit.lab.nvml.control import MockControl


def _profiles() -> Path:
    from gpukit.lab.config import PROFILES_DIR

    return Path(PROFILES_DIR)


def caps_dir(state_dir: Path) -> Path:
    return state_dir / "proc-driver/nvidia/capabilities"


def mig_minors(state_dir: Path) -> dict[str, int]:
    text = (state_dir / "proc-driver/nvidia-caps/mig-minors").read_text()
    return {k: int(v) for k, v in (line.split(" ") for line in text.splitlines())}


def assert_caps_follow(state_dir: Path, ctl: MockControl, profile: str) -> dict[str, Any]:
    """The capability tree is exactly the MIG state's, and every access file's minor is the
    one mig-minors lists for it (as the container toolkit's nvcaps resolves it)."""
    status = ctl.status()
    want = ds.capabilities(ds.load_profile(_profiles() / f"{profile}.yaml"), status)
    got = ds.read_tree(caps_dir(state_dir))
    assert got == want
    table = mig_minors(state_dir)
    for rel, text in got.items():
        if rel.endswith("/"):
            continue
        fields = dict(line.split(": ") for line in text.splitlines())
        key = rel.removeprefix("mig/") if rel.startswith("mig/") else rel.replace("/mig/", "/", 1)
        assert table[key] == int(fields["DeviceFileMinor"]), rel
    return status


def gi_profile_id(nvml: Any, h: Any, const: int) -> int:
    return int(nvml.nvmlDeviceGetGpuInstanceProfileInfo(h, const).id)


def create_ci(nvml: Any, gi: Any, const: int) -> Any:
    info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
        gi, const, nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
    )
    return nvml.nvmlGpuInstanceCreateComputeInstance(gi, info.id)


def test_boot_writes_the_drivers_proc_files(
    nvml: Any, ctl: MockControl, state_dir: Path, profile_name: str
) -> None:
    ctl.boot()
    profile = ds.load_profile(_profiles() / f"{profile_name}.yaml")
    got = ds.read_tree(state_dir / "proc-driver")
    assert got == ds.proc_driver(profile, ctl.status())  # C and Python render the same
    version = got["nvidia/version"]
    assert version.startswith("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.90.07  ")
    info = got["nvidia/gpus/0000:07:00.0/information"]
    # parsed as the container toolkit parses it (split at the first ':', trimmed)
    fields = {k: v.strip() for k, v in (line.split(":", 1) for line in info.splitlines())}
    assert fields["Model"] == "NVIDIA A100-SXM4-40GB"
    assert fields["GPU UUID"] == nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(0))
    assert fields["Bus Location"] == "0000:07:00.0" and fields["Device Minor"] == "0"
    assert fields["GPU Excluded"] == "No" and fields["Video BIOS"] == "92.00.45.00.03"
    table = mig_minors(state_dir)
    assert table["config"] == 1 and table["monitor"] == 2
    assert table["gpu0/gi0/access"] == 3 and table["gpu0/gi0/ci0/access"] == 4
    assert table["gpu0/gi1/access"] == 12 and table["gpu1/gi0/access"] == 138
    assert table["gpu31/gi14/ci7/access"] == 4322 and len(table) == 2 + 32 * 135
    # the driver's MIG-capable GPUs each have a mig directory; no instances yet
    assert_caps_follow(state_dir, ctl, profile_name)
    assert sorted(os.listdir(caps_dir(state_dir))) == sorted(
        ["mig", *(f"gpu{i}" for i in range(8))]
    )


@pytest.mark.parametrize("profile_name", ["t4-x2"])
def test_no_mig_gpus_no_gpu_caps(ctl: MockControl, state_dir: Path, profile_name: str) -> None:
    ctl.boot()
    assert os.listdir(caps_dir(state_dir)) == ["mig"]
    profile = ds.load_profile(_profiles() / "t4-x2.yaml")
    assert ds.read_tree(state_dir / "proc-driver") == ds.proc_driver(profile, ctl.status())


def test_capability_files_follow_every_change(
    nvml: Any, ctl: MockControl, state_dir: Path, profile_name: str, nvml_env: dict[str, str]
) -> None:
    ctl.boot()
    h0 = enable_mig(nvml, ctl, 0)
    h1 = enable_mig(nvml, ctl, 1)
    assert_caps_follow(state_dir, ctl, profile_name)
    gi_a = nvml.nvmlDeviceCreateGpuInstance(
        h0, gi_profile_id(nvml, h0, nvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE)
    )
    assert_caps_follow(state_dir, ctl, profile_name)
    ci_a = create_ci(nvml, gi_a, nvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE)
    ci_b = create_ci(nvml, gi_a, nvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE)
    status = assert_caps_follow(state_dir, ctl, profile_name)
    gi_id = status["gpus"][0]["mig"]["gpu_instances"][0]["id"]
    access = caps_dir(state_dir) / f"gpu0/mig/gi{gi_id}/ci0/access"
    assert access.read_text().splitlines()[:2] == [
        f"DeviceFileMinor: {3 + gi_id * 9 + 1}",
        "DeviceFileMode: 292",
    ]
    # another NVML client (another process) changes GPU 1
    run_py(
        """
        import pynvml as n
        n.nvmlInit()
        h = n.nvmlDeviceGetHandleByIndex(1)
        for _ in range(7):
            p = n.nvmlDeviceGetGpuInstanceProfileInfo(h, n.NVML_GPU_INSTANCE_PROFILE_1_SLICE)
            gi = n.nvmlDeviceCreateGpuInstance(h, p.id)
            c = n.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi, 0, n.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
            n.nvmlGpuInstanceCreateComputeInstance(gi, c.id)
        """,
        nvml_env,
    )
    status = assert_caps_follow(state_dir, ctl, profile_name)
    assert len(status["gpus"][1]["mig"]["gpu_instances"]) == 7
    assert len(list(caps_dir(state_dir).glob("gpu1/mig/gi*/ci*/access"))) == 7
    nvml.nvmlComputeInstanceDestroy(ci_a)
    assert_caps_follow(state_dir, ctl, profile_name)
    assert not (caps_dir(state_dir) / f"gpu0/mig/gi{gi_id}/ci0").exists()
    nvml.nvmlComputeInstanceDestroy(ci_b)
    nvml.nvmlGpuInstanceDestroy(gi_a)
    assert_caps_follow(state_dir, ctl, profile_name)
    assert list(caps_dir(state_dir).glob("gpu0/mig/*")) == []
    ctl.reset(1)  # nvidia-smi -r: instances gone
    assert_caps_follow(state_dir, ctl, profile_name)
    assert list(caps_dir(state_dir).glob("gpu1/mig/*")) == []
    assert nvml.nvmlDeviceGetMigMode(h1) == [1, 1]


def test_killed_writer_and_boot(
    nvml: Any, ctl: MockControl, state_dir: Path, profile_name: str, nvml_env: dict[str, str]
) -> None:
    ctl.boot()
    h = enable_mig(nvml, ctl, 0)
    gi = nvml.nvmlDeviceCreateGpuInstance(
        h, gi_profile_id(nvml, h, nvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE)
    )
    create_ci(nvml, gi, nvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE)
    before = assert_caps_follow(state_dir, ctl, profile_name)
    # a MIG apply killed half-way through writing the next state: nothing changed, anywhere
    env = {**nvml_env, "GPUKIT_NVML_TEST_COMMIT_DELAY_MS": "20000"}
    code = """
        import pynvml as n
        n.nvmlInit()
        h = n.nvmlDeviceGetHandleByIndex(0)
        p = n.nvmlDeviceGetGpuInstanceProfileInfo(h, n.NVML_GPU_INSTANCE_PROFILE_3_SLICE)
        n.nvmlDeviceCreateGpuInstance(h, p.id)
        print("finished")
    """
    p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    tmp = state_dir / "state.tmp"
    deadline = time.monotonic() + 15
    while not (tmp.exists() and tmp.stat().st_size > 0) and time.monotonic() < deadline:
        time.sleep(0.005)
    os.kill(p.pid, signal.SIGKILL)
    p.communicate(timeout=10)
    assert assert_caps_follow(state_dir, ctl, profile_name)["gpus"] == before["gpus"]
    # a writer killed after the state landed but before the capability files did: the tree is
    # behind (simulated: the tree of an older state); the next writer repairs it
    (caps_dir(state_dir) / "gpu0/mig").rename(state_dir / "stale")
    (state_dir / "caps-serial").write_text("1\n")
    ctl.set_process(1, 4242, 100)  # any change to any GPU
    assert_caps_follow(state_dir, ctl, profile_name)
    # and a boot (the node reboots; the supervisor powers the GPUs on) renders it from the state:
    # MIG mode persists, instances do not
    (caps_dir(state_dir) / "gpu0/mig").rename(state_dir / "stale2")
    ctl.boot()
    status = assert_caps_follow(state_dir, ctl, profile_name)
    assert status["gpus"][0]["mig"]["current"] is True
    assert status["gpus"][0]["mig"]["gpu_instances"] == []
    assert (caps_dir(state_dir) / "gpu0/mig").is_dir()


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")
def test_sysfs_dmi_and_caps_nodes(tmp_path: Path) -> None:
    path = _profiles() / "a100-sxm4-40gb-x8.yaml"
    ds.render_node(path, tmp_path)
    pci = tmp_path / "sys/bus/pci"
    devices = sorted(os.listdir(pci / "devices"))
    assert devices == ["0000:07:00.0", "0000:0f:00.0", "0000:47:00.0", "0000:4e:00.0",
                       "0000:87:00.0", "0000:90:00.0", "0000:b7:00.0", "0000:bd:00.0"]  # fmt: skip
    d = pci / "devices/0000:87:00.0"
    read = {f: (d / f).read_text().strip() for f in ("vendor", "device", "class", "numa_node")}
    assert read == {"vendor": "0x10de", "device": "0x20b0", "class": "0x030200", "numa_node": "1"}
    assert int((d / "subsystem_device").read_text(), 0) == 0x134F
    assert os.path.basename(os.path.realpath(d / "driver")) == "nvidia"
    assert os.path.realpath(d / "driver") == str(pci / "drivers/nvidia")
    assert os.path.realpath(pci / "drivers/nvidia/0000:87:00.0") == os.path.realpath(d)
    config = (d / "config").read_bytes()
    assert len(config) == 256
    assert int.from_bytes(config[0:2], "little") == 0x10DE
    assert int.from_bytes(config[2:4], "little") == 0x20B0
    assert int.from_bytes(config[9:12], "little") == 0x030200
    # the capability list, walked as go-nvlib's nvpci does: no vendor-specific (0x09) capability
    assert config[6] & 0x10
    caps, off = [], config[0x34]
    while off:
        caps.append(config[off])
        off = config[off + 1]
    assert caps == [0x01, 0x05, 0x10]
    for line in (d / "resource").read_text().splitlines():
        assert len(line.split(" ")) == 3
    bar1 = (d / "resource").read_text().splitlines()[1].split(" ")
    assert int(bar1[1], 16) - int(bar1[0], 16) + 1 == 64 << 30  # 40 GB -> 64 GiB aperture
    assert (
        tmp_path / "sys/class/dmi/id/product_name"
    ).read_text() == "DGXA100 920-23687-2530-000\n"
    nodes = os.listdir(tmp_path / "dev/nvidia-caps")
    assert len(nodes) == 2 + 8 * 135
    st = os.stat(tmp_path / "dev/nvidia-caps/nvidia-cap184")
    assert stat.S_ISCHR(st.st_mode) and os.major(st.st_rdev) == ds.CAPS_MAJOR
    assert os.minor(st.st_rdev) == 184 and stat.S_IMODE(st.st_mode) == 0o444
    st = os.stat(tmp_path / "dev/nvidia-caps/nvidia-cap1")
    assert stat.S_IMODE(st.st_mode) == 0o400
    # every minor mig-minors names for the node's GPUs has its node
    for key, minor in (line.split(" ") for line in ds.mig_minors(range(8)).splitlines()):
        if key in ("config", "monitor") or int(key.split("/")[0][3:]) < 8:
            assert f"nvidia-cap{minor}" in nodes
    # idempotent and converging: a second render changes nothing; a profile without `machine`
    # gets the default
    mtime = (d / "config").stat().st_mtime_ns
    ds.render_node(path, tmp_path)
    assert (d / "config").stat().st_mtime_ns == mtime
    t4 = _profiles() / "t4-x2.yaml"
    ds.render_node(t4, tmp_path)
    assert sorted(os.listdir(pci / "devices")) == ["0000:3b:00.0", "0000:d8:00.0"]
    assert (tmp_path / "sys/class/dmi/id/product_name").read_text() == "PowerEdge R740\n"
    assert len(os.listdir(tmp_path / "dev/nvidia-caps")) == 2 + 2 * 135
    assert sorted(os.listdir(tmp_path / "sys/devices")) == ["pci0000:3a", "pci0000:d7"]
    x16 = ds.load_profile(_profiles() / "a100-sxm4-40gb-x16.yaml")
    assert x16.machine == ds.DEFAULT_MACHINE
    assert any(g.bus_id.startswith("0001:") for g in x16.gpus)  # PCI domain 1, sysfs form


@pytest.mark.parametrize("name", sorted(p.stem for p in _profiles().glob("*.yaml")))
def test_pci_sysfs_is_laid_out_as_a_kernel_lays_it_out(tmp_path: Path, name: str) -> None:
    """/sys/bus/pci/devices/<bus id> are relative links into
    /sys/devices/pci<domain>:<bus>/<root port>/.../<bus id> (what Kubernetes' pcieRoot helper
    and go-nvlib read), and the tree follows the mock's topology
    (nvmlDeviceGetTopologyCommonAncestor): GPUs of one PCIe switch (SINGLE) share a root
    port, an upstream port and nothing below; any two others (NODE, SYSTEM) share no host
    bridge. Bus numbers increase down the tree and each bridge is a PCI bridge."""
    path = _profiles() / f"{name}.yaml"
    profile = ds.load_profile(path)
    ds.render_node(path, tmp_path)
    sysfs = tmp_path / "sys"
    where: dict[str, list[str]] = {}
    for gpu in profile.gpus:
        link = sysfs / "bus/pci/devices" / gpu.bus_id
        target = os.readlink(link)
        assert not target.startswith("/")
        rel = os.path.relpath(os.path.normpath(link.parent / target), sysfs / "devices")
        parts = rel.split("/")
        assert re.fullmatch(r"pci[0-9a-f]{4}:[0-9a-f]{2}", parts[0]) and parts[-1] == gpu.bus_id
        domain, root_bus = parts[0][3:].split(":")
        assert gpu.bus_id.startswith(domain + ":")
        buses = [int(root_bus, 16), *(int(p.split(":")[1], 16) for p in parts[1:])]
        assert buses == sorted(buses) and len(set(buses[1:])) == len(buses) - 1, rel
        for i in range(1, len(parts) - 1):  # the bridges between root and GPU
            bridge = sysfs / "devices" / "/".join(parts[:i + 1])
            assert (bridge / "class").read_text() == "0x060400\n", bridge
        assert (sysfs / "devices" / rel / "vendor").read_text() == "0x10de\n"
        assert os.path.realpath(sysfs / "bus/pci/drivers/nvidia" / gpu.bus_id) == str(
            sysfs / "devices" / rel)
        where[gpu.bus_id] = parts
    for a in profile.gpus:
        for b in profile.gpus:
            if a.index >= b.index:
                continue
            pa, pb = where[a.bus_id], where[b.bus_id]
            shared = next((i for i, (x, y) in enumerate(zip(pa, pb, strict=False)) if x != y),
                          min(len(pa), len(pb)))
            if a.pcie_switch >= 0 and a.pcie_switch == b.pcie_switch:  # SINGLE
                assert shared == len(pa) - 2 == len(pb) - 2, (pa, pb)
            else:  # NODE or SYSTEM: different host bridges
                assert shared == 0, (pa, pb)
