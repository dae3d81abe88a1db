"""A booted lab node shows the stand-in driver's surface as a GPU host does: PCI sysfs, DMI,
/proc/driver, /dev/nvidia-caps; the MIG capability files follow a MIG change made by an NVML
client inside the node or outside it, and match the persisted state after a reboot."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import pytest
from labtools import boots, wait_for

from gpukit.lab import driver_surface as ds
from gpukit.lab import nodes
from gpukit.lab import nvml as mock
from gpukit.lab.config import LabSpec, NodeSpec, load_spec

pytestmark = pytest.mark.lab

CAPS = "/proc/driver/nvidia/capabilities"


def ssh(spec: LabSpec, n: NodeSpec, command: str) -> str:
    r = subprocess.run(
        ["ssh", "-i", str(nodes.ssh_key()), "-o", "StrictHostKeyChecking=no",
         "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5",
         f"root@{n.address(spec)}", command],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 0, f"{n.name}: {command}: {r.stderr}"
    return r.stdout


def node_profile(n: NodeSpec) -> ds.Profile:
    return ds.load_profile(nodes.root(n) / "etc/gpukit-lab/nvml/profile.yaml")


def mig_node(spec: LabSpec) -> NodeSpec:
    for n in spec.nodes:
        if node_profile(n).gpus and node_profile(n).gpus[0].mig_capable:
            return n
    pytest.skip("no MIG-capable node in this lab")


def host_nvml(n: NodeSpec, code: str) -> None:
    """Run pynvml code on the host against the node's GPUs (its profile and state dir)."""
    r = nodes.root(n)
    env = mock.env(r / "etc/gpukit-lab/nvml/profile.yaml", r / "var/lib/gpukit-lab/nvml")
    env.pop(mock.ENV_SEED, None)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr


# Inside the node: no pynvml, only the driver's library; ctypes as any NVML client would.
IN_NODE_CREATE = r"""
python3 - <<'EOF'
import ctypes
nv = ctypes.CDLL("libnvidia-ml.so.1")
assert nv.nvmlInit_v2() == 0
h = ctypes.c_void_p()
assert nv.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h)) == 0
info = (ctypes.c_uint * 32)()
assert nv.nvmlDeviceGetGpuInstanceProfileInfo(h, 2, info) == 0   # 3-slice
gi = ctypes.c_void_p()
assert nv.nvmlDeviceCreateGpuInstance(h, info[0], ctypes.byref(gi)) == 0
cinfo = (ctypes.c_uint * 32)()
assert nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, 0, 0, cinfo) == 0  # 1-slice
ci = ctypes.c_void_p()
assert nv.nvmlGpuInstanceCreateComputeInstance(gi, cinfo[0], ctypes.byref(ci)) == 0
print("created")
EOF
"""


def node_caps(spec: LabSpec, n: NodeSpec) -> dict[str, str]:
    """The node's /proc/driver/nvidia/capabilities as driver_surface.read_tree gives it."""
    out = ssh(
        spec,
        n,
        f"""python3 - <<'EOF'
import json, os
root = "{CAPS}"
tree = {{}}
for d, dirs, files in os.walk(root):
    rel = os.path.relpath(d, root)
    if not files and not dirs and rel != ".":
        tree[rel + "/"] = ""
    for f in files:
        tree[os.path.normpath(os.path.join(rel, f))] = open(os.path.join(d, f)).read()
print(json.dumps(tree))
EOF
""",
    )
    tree: dict[str, str] = json.loads(out)
    return tree


def status(n: NodeSpec) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(nodes.nvml_cli(n, "status"))
    return result


def assert_caps_follow(spec: LabSpec, n: NodeSpec) -> dict[str, Any]:
    st = status(n)
    assert node_caps(spec, n) == ds.capabilities(node_profile(n), st)
    return st


def reboot(spec: LabSpec, n: NodeSpec) -> None:
    before = boots(n)
    subprocess.run(
        ["ssh", "-i", str(nodes.ssh_key()), "-o", "StrictHostKeyChecking=no",
         "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes",
         f"root@{n.address(spec)}", "systemctl reboot"],
        capture_output=True, timeout=30,
    )  # fmt: skip

    def back() -> bool:
        return boots(n) > before and ssh(spec, n, "systemctl is-active kubelet").strip() == "active"

    wait_for(f"{n.name} back from a reboot", back, timeout=90,
             retry_on=(AssertionError, subprocess.TimeoutExpired))


def assert_static_surface(spec: LabSpec, n: NodeSpec) -> None:
    profile = node_profile(n)
    bus_ids = [g.bus_id for g in profile.gpus]
    assert ssh(spec, n, "ls /sys/bus/pci/devices").split() == sorted(bus_ids)
    # as a kernel lays it out: links into /sys/devices/pci<domain>:<bus>/<ports>/<bus id>, the
    # machine's own devices still beside the node's under /sys/devices
    paths, _ = ds.pci_paths(profile)
    links = ssh(spec, n, "for d in /sys/bus/pci/devices/*; do readlink $d; readlink -e $d; done")
    assert links.split() == [x for b in sorted(bus_ids) for x in (
        f"../../../devices/{paths[b]}", f"/sys/devices/{paths[b]}")]
    assert ssh(spec, n, "ls /sys/devices/system/cpu/online /sys/devices/virtual/net/lo").split()
    uuids = nodes.gpu_uuids(n)
    for gpu in profile.gpus:
        d = f"/sys/bus/pci/devices/{gpu.bus_id}"
        out = ssh(spec, n, f"cat {d}/vendor {d}/class {d}/device {d}/numa_node; "
                           f"readlink -f {d}/driver; wc -c < {d}/config")  # fmt: skip
        vendor, klass, device, numa, driver, config = out.split()
        assert (vendor, klass) == ("0x10de", "0x030200")
        assert int(device, 16) == gpu.device_id >> 16 and int(numa) == gpu.numa_node
        assert driver == "/sys/bus/pci/drivers/nvidia" and config == "256"
        info = ssh(spec, n, f"cat /proc/driver/nvidia/gpus/{gpu.bus_id}/information")
        fields = {k: v.strip() for k, v in (line.split(":", 1) for line in info.splitlines())}
        assert fields["GPU UUID"] == uuids[gpu.index]
        assert fields["Bus Location"] == gpu.bus_id and fields["Device Minor"] == str(gpu.minor)
    assert ssh(spec, n, "cat /sys/class/dmi/id/product_name").strip() == profile.machine
    version = ssh(spec, n, "cat /proc/driver/nvidia/version")
    assert f"Kernel Module  {profile.driver_version}  " in version
    minors = ssh(spec, n, "cat /proc/driver/nvidia-caps/mig-minors")
    assert minors == ds.mig_minors(g.minor for g in profile.gpus)
    devs = ssh(spec, n, "stat -c '%n %t %T %a' /dev/nvidia-caps/* /dev/nvidia-modeset")
    by_name = {line.split()[0]: line.split()[1:] for line in devs.splitlines()}
    assert by_name["/dev/nvidia-modeset"] == ["c3", "fe", "666"]
    caps = {k: v for k, v in by_name.items() if k.startswith("/dev/nvidia-caps/")}
    assert len(caps) == 2 + 135 * len(profile.gpus)
    assert caps["/dev/nvidia-caps/nvidia-cap1"] == [f"{ds.CAPS_MAJOR:x}", "1", "400"]
    for gpu in profile.gpus:
        m = ds.caps_minor(gpu.minor, 14, 7)
        assert caps[f"/dev/nvidia-caps/nvidia-cap{m}"] == [f"{ds.CAPS_MAJOR:x}", f"{m:x}", "444"]
    # read-only, as a kernel's files are
    r = subprocess.run(
        ["ssh", "-i", str(nodes.ssh_key()), "-o", "StrictHostKeyChecking=no",
         "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes", f"root@{n.address(spec)}",
         "touch /proc/driver/nvidia/x || touch /sys/bus/pci/devices/x"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert r.returncode != 0


def test_nodes_show_the_driver_surface(lab_cluster: object) -> None:
    spec = load_spec()
    for n in spec.nodes:
        assert_static_surface(spec, n)
        assert_caps_follow(spec, n)


def test_capability_files_follow_mig_changes_and_a_reboot(lab_cluster: object) -> None:
    spec = load_spec()
    n = mig_node(spec)
    host_nvml(n, """
        import pynvml as n
        n.nvmlInit()
        n.nvmlDeviceSetMigMode(n.nvmlDeviceGetHandleByIndex(0), n.NVML_DEVICE_MIG_ENABLE)
    """)  # fmt: skip
    nodes.nvml_cli(n, "reset", "--gpu", "0")
    try:
        st = assert_caps_follow(spec, n)
        assert st["gpus"][0]["mig"]["current"] is True
        assert ssh(spec, n, f"ls {CAPS}/gpu0/mig").split() == []
        # an NVML client inside the node creates a GPU and a compute instance
        assert "created" in ssh(spec, n, IN_NODE_CREATE)
        st = assert_caps_follow(spec, n)
        gi = st["gpus"][0]["mig"]["gpu_instances"][0]["id"]
        access = ssh(spec, n, f"cat {CAPS}/gpu0/mig/gi{gi}/ci0/access")
        minor = int(access.splitlines()[0].split(": ")[1])
        assert minor == ds.caps_minor(0, gi, 0)
        assert f"gpu0/gi{gi}/ci0/access {minor}\n" in ssh(
            spec, n, "cat /proc/driver/nvidia-caps/mig-minors"
        )
        assert (
            ssh(spec, n, f"stat -c %T /dev/nvidia-caps/nvidia-cap{minor}").strip() == f"{minor:x}"
        )
        # a client on the host (the state dir, as the agent's container has it) destroys them
        ci_ids = [c["id"] for c in st["gpus"][0]["mig"]["gpu_instances"][0]["compute_instances"]]
        host_nvml(n, f"""
            import pynvml as n
            n.nvmlInit()
            gi = n.nvmlDeviceGetGpuInstanceById(n.nvmlDeviceGetHandleByIndex(0), {gi})
            for c in {ci_ids}:
                n.nvmlComputeInstanceDestroy(n.nvmlGpuInstanceGetComputeInstanceById(gi, c))
            n.nvmlGpuInstanceDestroy(gi)
        """)  # fmt: skip
        assert assert_caps_follow(spec, n)["gpus"][0]["mig"]["gpu_instances"] == []
        assert ssh(spec, n, f"ls {CAPS}/gpu0/mig").split() == []
        # instances again, then a reboot: MIG mode persists, instances do not, and the files
        # the node shows after it match the persisted state
        assert "created" in ssh(spec, n, IN_NODE_CREATE)
        assert len(assert_caps_follow(spec, n)["gpus"][0]["mig"]["gpu_instances"]) == 1
        reboot(spec, n)
        st = assert_caps_follow(spec, n)
        assert st["gpus"][0]["mig"]["current"] is True
        assert st["gpus"][0]["mig"]["gpu_instances"] == []
        assert_static_surface(spec, n)
        # and they follow changes after the reboot too
        assert "created" in ssh(spec, n, IN_NODE_CREATE)
        assert len(assert_caps_follow(spec, n)["gpus"][0]["mig"]["gpu_instances"]) == 1
    finally:
        nodes.nvml_cli(n, "reset", "--gpu", "0")
        host_nvml(n, """
            import pynvml as n
            n.nvmlInit()
            n.nvmlDeviceSetMigMode(n.nvmlDeviceGetHandleByIndex(0), n.NVML_DEVICE_MIG_DISABLE)
        """)  # fmt: skip
        nodes.nvml_cli(n, "reset", "--gpu", "0")
