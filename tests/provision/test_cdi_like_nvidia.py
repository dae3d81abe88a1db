"""gpukit's CDI specs carry what nvidia-ctk's do: the control nodes, NVIDIA_VISIBLE_DEVICES=void
and NVIDIA_CTK_LIBCUDA_DIR, the driver's `*.so.<version>` libraries, binaries, IPC sockets and
firmware found under the driver root as read-only binds, nvidia-cdi-hook's hooks where the hook
is installed (the soname links bound instead where it is not), MIG caps nodes, devices named
`<gpu>`, `<gpu>:<mig>`, UUID and `all`. The lab's runtime injects the spec, the lab's hook turns
the bound library into one the loader finds by soname, and the stand-in libcuda loaded from the
container's root counts the devices the container was given."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from moduletest import run_module

from gpukit.contracts.plugin_config import parse_config
from gpukit.lab import driver_surface as ds
from gpukit.lab import nvml as mock_nvml
from gpukit.lab.packages import catalog, cuda_lib, deb
from gpukit.lab.packages import sources as package_sources
from gpukit.lab.runtime import nvidia_cdi_hook as hook
from gpukit.lab.runtime import nvidia_container_runtime as ncr
from gpukit.plugin import cdi as plugin_cdi
from gpukit.plugin.devices import Gpu, MigDevice, NodeDevices
from gpukit.plugin.resources import gpu_unit
from gpukit.provision import cdi

VERSION = "550.90.07"
LIBS = "/usr/lib/x86_64-linux-gnu"
LIBCUDA = f"{LIBS}/libcuda.so.{VERSION}"
LIBNVML = f"{LIBS}/libnvidia-ml.so.{VERSION}"
RO = ["ro", "nosuid", "nodev", "bind"]
HOOK_ENV = ["NVIDIA_CTK_DEBUG=false"]


def _gpu(i: int, migs: tuple[MigDevice, ...] = ()) -> Gpu:
    return Gpu(index=i, uuid=f"GPU-{i:08d}-0000-0000-0000-000000000000", minor=i,
               name="NVIDIA A100-SXM4-40GB", memory_mb=40960, mig_capable=True,
               mig_enabled=bool(migs), mig_devices=migs)  # fmt: skip


def _proc(root: Path, gpu_minor: int, gi: int, ci: int) -> str:
    d = root / f"proc/driver/nvidia/capabilities/gpu{gpu_minor}/mig/gi{gi}"
    (d / f"ci{ci}").mkdir(parents=True)
    (d / "access").write_text(ds.cap_file(ds.caps_minor(gpu_minor, gi)))
    (d / f"ci{ci}/access").write_text(ds.cap_file(ds.caps_minor(gpu_minor, gi, ci)))
    return str(root)


def driver_root(tmp: Path) -> Path:
    """A node's root as the stand-in driver package leaves it (merged /usr: lib -> usr/lib)."""
    root = tmp / "driver"
    lib = root / LIBS.lstrip("/")
    lib.mkdir(parents=True)
    (root / "lib").symlink_to("usr/lib")
    (lib / f"libcuda.so.{VERSION}").write_bytes(
        cuda_lib.build("12.4", tmp / "build").read_bytes())
    (lib / "libcuda.so.1").symlink_to(f"libcuda.so.{VERSION}")
    (lib / f"libnvidia-ml.so.{VERSION}").write_bytes(b"\x7fELF mock")
    (lib / "libnvidia-ml.so.1").symlink_to(f"libnvidia-ml.so.{VERSION}")
    (lib / "libnvidia-ml.so.470.1.1").write_bytes(b"another driver's")  # not this version
    for tool in ("nvidia-smi", "nvidia-persistenced", "nvidia-cuda-mps-control"):
        (root / "usr/bin").mkdir(parents=True, exist_ok=True)
        (root / "usr/bin" / tool).write_text("#!/bin/sh\n")
        (root / "usr/bin" / tool).chmod(0o755)
    (root / "run/nvidia-persistenced").mkdir(parents=True)
    (root / "run/nvidia-persistenced/socket").write_text("")
    fw = root / f"lib/firmware/nvidia/{VERSION}"
    fw.mkdir(parents=True)
    (fw / "gsp_ga10x.bin").write_bytes(b"fw")
    return root


def hooks_of(spec: dict[str, Any]) -> list[list[str]]:
    hooks = spec["containerEdits"].get("hooks", [])
    assert all(h["hookName"] == "createContainer" and h["path"] == "/usr/bin/nvidia-cdi-hook"
               and h["env"] == HOOK_ENV for h in hooks), hooks  # fmt: skip
    return [h["args"] for h in hooks]


def test_node_spec_is_shaped_like_nvidias_and_the_runtime_injects_it(tmp_path: Path) -> None:
    root = driver_root(tmp_path)
    mig = MigDevice(uuid="MIG-11111111-0000-0000-0000-000000000000", parent_uuid=_gpu(0).uuid,
                    parent_index=0, index=0, gi=2, ci=0, profile="3g.20gb", memory_mb=19968)
    inv = NodeDevices(gpus=(_gpu(0, (mig,)), _gpu(1)), driver_version=VERSION)
    present = {"/dev/nvidiactl", "/dev/nvidia-uvm", "/usr/bin/nvidia-cdi-hook"}
    spec = cdi.build(inv, exists=present.__contains__, driver_root=str(root),
                     proc_root=_proc(tmp_path, 0, 2, 0))  # fmt: skip
    edits = spec["containerEdits"]
    assert edits["env"] == ["NVIDIA_VISIBLE_DEVICES=void", f"NVIDIA_CTK_LIBCUDA_DIR={LIBS}"]
    assert edits["deviceNodes"] == [{"path": "/dev/nvidiactl"}, {"path": "/dev/nvidia-uvm"}]
    bound = ["/usr/lib/x86_64-linux-gnu/libcuda.so.550.90.07",
             "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.90.07",
             "/run/nvidia-persistenced/socket",
             "/lib/firmware/nvidia/550.90.07/gsp_ga10x.bin",
             "/usr/bin/nvidia-smi", "/usr/bin/nvidia-persistenced",
             "/usr/bin/nvidia-cuda-mps-control"]  # fmt: skip
    assert [m["containerPath"] for m in edits["mounts"]] == bound
    assert all(m["hostPath"] == f"{root}{m['containerPath']}" for m in edits["mounts"])
    assert [m["options"] for m in edits["mounts"]] == [RO, RO, [*RO, "noexec"], *[RO] * 4]
    assert hooks_of(spec) == [
        ["nvidia-cdi-hook", "create-symlinks", "--link", f"libcuda.so.1::{LIBS}/libcuda.so"],
        ["nvidia-cdi-hook", "enable-cuda-compat", f"--host-driver-version={VERSION}"],
        ["nvidia-cdi-hook", "update-ldcache", "--folder", LIBS],
        ["nvidia-cdi-hook", "disable-device-node-modification"],
    ]
    gi, ci = ds.caps_minor(0, 2), ds.caps_minor(0, 2, 0)
    caps = [f"/dev/nvidia-caps/nvidia-cap{gi}", f"/dev/nvidia-caps/nvidia-cap{ci}"]
    by_name = {d["name"]: d["containerEdits"]["deviceNodes"] for d in spec["devices"]}
    assert list(by_name) == [_gpu(0).uuid, "0", mig.uuid, "0:0", _gpu(1).uuid, "1", "all"]
    assert by_name["0:0"] == by_name[mig.uuid] == [{"path": p} for p in ["/dev/nvidia0", *caps]]
    assert by_name["all"] == [{"path": p} for p in ["/dev/nvidia0", *caps, "/dev/nvidia1"]]

    # the runtime (CDI mode) reads the rendered file and injects the MIG device with its caps
    spec_dir = tmp_path / "cdi"
    spec_dir.mkdir()
    (spec_dir / "nvidia.yaml").write_text(cdi.render(spec))
    assert yaml.safe_load((spec_dir / "nvidia.yaml").read_text()) == spec
    nodes = {"/dev/nvidia0": ncr.DevNode("c", 195, 0, 0o666),
             "/dev/nvidiactl": ncr.DevNode("c", 195, 255, 0o666),
             "/dev/nvidia-uvm": ncr.DevNode("c", 510, 0, 0o666),
             caps[0]: ncr.DevNode("c", 509, gi, 0o444), caps[1]: ncr.DevNode("c", 509, ci, 0o444)}
    host = ncr.Host(stat=nodes.get, discover=lambda: [])
    oci: dict[str, Any] = {"process": {"env": ["PATH=/bin", f"NVIDIA_VISIBLE_DEVICES={mig.uuid}"]},
                           "mounts": [], "linux": {}}  # fmt: skip
    mode, _, _ = ncr.modify(oci, ncr.Config(mode="cdi", spec_dirs=(str(spec_dir),)), host)
    assert mode == "cdi"
    assert [d["path"] for d in oci["linux"]["devices"]] == [
        "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia0", *caps]
    assert oci["process"]["env"][-2:] == ["NVIDIA_VISIBLE_DEVICES=void",
                                          f"NVIDIA_CTK_LIBCUDA_DIR={LIBS}"]  # fmt: skip
    assert [m["destination"] for m in oci["mounts"]] == bound
    assert [h["args"][1] for h in oci["hooks"]["createContainer"]] == [
        "create-symlinks", "enable-cuda-compat", "update-ldcache",
        "disable-device-node-modification"]  # fmt: skip


def test_without_the_hook_the_soname_links_are_bound_instead(tmp_path: Path) -> None:
    root = driver_root(tmp_path)
    inv = NodeDevices(gpus=(_gpu(0),), driver_version=VERSION)
    spec = cdi.build(inv, exists={"/dev/nvidiactl"}.__contains__, driver_root=str(root))
    mounts = {m["containerPath"]: m["hostPath"] for m in spec["containerEdits"]["mounts"]}
    assert hooks_of(spec) == []
    assert mounts[f"{LIBS}/libcuda.so.1"] == f"{root}{LIBS}/libcuda.so.1"  # a link to the file
    assert f"{LIBS}/libnvidia-ml.so.1" in mounts and LIBCUDA in mounts


def test_no_driver_files_without_a_driver_and_sonames_without_a_version(tmp_path: Path) -> None:
    inv = NodeDevices(gpus=(_gpu(0),), driver_version=VERSION)
    spec = cdi.build(inv, exists=lambda _: False, driver_root=str(tmp_path))
    assert "mounts" not in spec["containerEdits"] and hooks_of(spec) == []
    assert spec["containerEdits"]["env"] == ["NVIDIA_VISIBLE_DEVICES=void"]
    unversioned = NodeDevices(gpus=(_gpu(0),))
    lib = f"{LIBS}/libnvidia-ml.so.1"
    spec = cdi.build(unversioned, exists={lib}.__contains__)
    assert spec["containerEdits"]["mounts"] == [
        {"hostPath": lib, "containerPath": lib, "options": RO}]


def test_agent_spec_finds_the_driver_under_the_root_it_sees(tmp_path: Path) -> None:
    """The agent sees the driver root at deviceRootInPlugin; host paths are under deviceRoot."""
    root = driver_root(tmp_path)
    (root / "dev").mkdir()
    (root / "dev/nvidiactl").write_text("")
    config = parse_config({"version": "v1", "gpukit": {
        "deviceRoot": "/host-driver", "deviceRootInPlugin": str(root)}})
    spec = plugin_cdi.agent_spec([gpu_unit(_gpu(0))], config, VERSION)
    edits = spec["containerEdits"]
    assert edits["deviceNodes"] == [{"path": "/dev/nvidiactl", "hostPath": "/host-driver/dev/nvidiactl"}]
    mounts = {m["containerPath"]: m["hostPath"] for m in edits["mounts"]}
    assert mounts[LIBCUDA] == f"/host-driver{LIBCUDA}"
    assert f"{LIBS}/libcuda.so.1" in mounts and "hooks" not in edits  # no hook under the root
    (root / "usr/bin/nvidia-cdi-hook").write_text("#!/bin/sh\n")
    hooked = plugin_cdi.agent_spec([gpu_unit(_gpu(0))], config, VERSION)["containerEdits"]
    assert len(hooked["hooks"]) == 4
    assert f"{LIBS}/libcuda.so.1" not in {m["containerPath"] for m in hooked["mounts"]}
    assert [d["name"] for d in spec["devices"]] == [_gpu(0).uuid, "0"]


def test_agent_spec_binds_the_sonames_where_no_versioned_library_is(tmp_path: Path) -> None:
    """NVML gave a version, but the library is only there by its soname (the lab's bare
    nodes): the container still gets it, as before the versioned discovery."""
    root = tmp_path / "root"
    (root / LIBS.lstrip("/")).mkdir(parents=True)
    (root / LIBS.lstrip("/") / "libnvidia-ml.so.1").write_bytes(b"\x7fELF")
    config = parse_config({"version": "v1", "gpukit": {
        "deviceRoot": "/", "deviceRootInPlugin": str(root)}})
    edits = plugin_cdi.agent_spec([gpu_unit(_gpu(0))], config, VERSION)["containerEdits"]
    assert [m["containerPath"] for m in edits["mounts"]] == [f"{LIBS}/libnvidia-ml.so.1"]
    assert "hooks" not in edits


def _bundle(tmp: Path, spec: dict[str, Any]) -> tuple[Path, str]:
    """A container's bundle whose root has the spec's mounts in place (copies of the host
    files, as the runtime's binds show them); the OCI state a runtime gives its hooks."""
    bundle = tmp / "bundle"
    rootfs = bundle / "rootfs"
    (rootfs / "etc").mkdir(parents=True)
    for m in spec["containerEdits"]["mounts"]:
        target = rootfs / m["containerPath"].lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(Path(m["hostPath"]).read_bytes())
    (bundle / "config.json").write_text(json.dumps({"root": {"path": "rootfs"}}))
    return rootfs, json.dumps({"ociVersion": "1.2.0", "id": "c", "bundle": str(bundle)})


@pytest.mark.skipif(not os.access("/sbin/ldconfig", os.X_OK), reason="needs the host's ldconfig")
def test_the_hooks_make_libcuda_loadable_by_soname_and_it_counts_the_given_gpus(
    tmp_path: Path,
) -> None:
    root = driver_root(tmp_path)
    inv = NodeDevices(gpus=(_gpu(0), _gpu(1)), driver_version=VERSION)
    spec = cdi.build(inv, exists={"/usr/bin/nvidia-cdi-hook"}.__contains__, driver_root=str(root))
    rootfs, state = _bundle(tmp_path, spec)
    assert not (rootfs / f"{LIBS.lstrip('/')}/libcuda.so.1").exists()  # only the file is bound
    for args in hooks_of(spec):
        hook.run(args[1:], state)
    lib_dir = rootfs / LIBS.lstrip("/")
    assert os.readlink(lib_dir / "libcuda.so.1") == f"libcuda.so.{VERSION}"  # ldconfig's link
    assert os.readlink(lib_dir / "libcuda.so") == "libcuda.so.1"  # create-symlinks
    cache = subprocess.run(["/sbin/ldconfig", "-r", str(rootfs), "-C", "/etc/ld.so.cache", "-p"],
                           capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert f"libcuda.so.1 (libc6,x86-64) => {LIBS}/libcuda.so.1" in cache, cache

    # a container given GPU 1 and the control node: the stand-in counts one device
    dev = tmp_path / "container-dev"
    dev.mkdir()
    (dev / "nvidiactl").write_text("")
    (dev / "nvidia1").write_text("")
    os.environ["GPUKIT_LAB_CUDA_DEV_ROOT"] = str(dev)
    try:
        libcuda = ctypes.CDLL(str(lib_dir / "libcuda.so.1"))
        count, version = ctypes.c_int(-1), ctypes.c_int(0)
        assert libcuda.cuDeviceGetCount(ctypes.byref(count)) == 3  # not initialised
        assert libcuda.cuInit(0) == 0
        assert libcuda.cuDeviceGetCount(ctypes.byref(count)) == 0 and count.value == 1
        assert libcuda.cuDriverGetVersion(ctypes.byref(version)) == 0 and version.value == 12040
        (dev / "nvidiactl").unlink()  # no driver control node: no CUDA device
        assert libcuda.cuInit(0) == 100
    finally:
        del os.environ["GPUKIT_LAB_CUDA_DEV_ROOT"]


def test_hook_failures_name_the_problem(tmp_path: Path) -> None:
    _, state = _bundle(tmp_path, {"containerEdits": {"mounts": []}})
    with pytest.raises(hook.HookFailure, match="unknown command 'chmod-all'"):
        hook.run(["chmod-all"], state)
    with pytest.raises(hook.HookFailure, match="expected <target>::<absolute path>"):
        hook.run(["create-symlinks", "--link", "libcuda.so.1"], state)
    with pytest.raises(hook.HookFailure, match="outside the container's root"):
        hook.run(["update-ldcache", "--folder", "/../../etc"], state)
    with pytest.raises(hook.HookFailure, match="cannot find the container's root"):
        hook.run(["update-ldcache", "--folder", LIBS], "{}")


def test_cdi_spec_module_writes_the_driver_files_it_finds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The collection's module over the mock NVML (driver 550.90.07 in the A100 profile)."""
    lib = mock_nvml.library_path()
    if lib is None:
        pytest.skip("mock NVML not built (make nvml)")
    root = driver_root(tmp_path)
    for k, v in mock_nvml.env("a100-sxm4-40gb-x8", tmp_path / "state", library=False).items():
        monkeypatch.setenv(k, v)
    out = tmp_path / "nvidia.yaml"
    result = run_module(tmp_path, "cdi_spec", {"path": str(out), "library": str(lib),
                                               "driver_root": str(root)})  # fmt: skip
    assert result.get("changed") is True and result["devices"] == 8, result
    spec = yaml.safe_load(out.read_text())
    mounts = {m["containerPath"]: m["hostPath"] for m in spec["containerEdits"]["mounts"]}
    assert mounts[LIBCUDA] == f"{root}{LIBCUDA}" and mounts[LIBNVML] == f"{root}{LIBNVML}"
    assert [d["name"] for d in spec["devices"]][:2] == [spec["devices"][0]["name"], "0"]
    assert spec["devices"][-1]["name"] == "all"


def test_the_stand_in_driver_package_is_what_the_spec_finds(tmp_path: Path) -> None:
    """The driver package unpacked into a root: the spec binds its versioned libraries and
    tools, and the toolkit package ships the hook the spec names."""
    if mock_nvml.library_path() is None:
        pytest.skip("mock NVML not built (make nvml)")
    src = package_sources()
    branch = catalog.BRANCHES[0]
    pkg = next(p for p in catalog.driver_packages(branch, src)
               if p.name == f"nvidia-driver-{branch.name}")  # fmt: skip
    built = deb.build(pkg, tmp_path / "debs", compression="gzip")
    root = tmp_path / "root"
    subprocess.run(["dpkg-deb", "-x", str(built), str(root)], check=True)
    assert os.readlink(root / f"{LIBS[1:]}/libcuda.so.1") == f"libcuda.so.{branch.driver_version}"
    inv = NodeDevices(gpus=(_gpu(0),), driver_version=branch.driver_version)
    spec = cdi.build(inv, exists={plugin_cdi.CDI_HOOK}.__contains__, driver_root=str(root))
    assert [m["containerPath"] for m in spec["containerEdits"]["mounts"]] == [
        f"{LIBS}/libcuda.so.{branch.driver_version}",
        f"{LIBS}/libnvidia-ml.so.{branch.driver_version}",
        "/usr/bin/nvidia-smi", "/usr/bin/nvidia-debugdump", "/usr/bin/nvidia-cuda-mps-control",
        "/usr/bin/nvidia-cuda-mps-server"]  # fmt: skip
    libcuda = ctypes.CDLL(str(root / f"{LIBS[1:]}/libcuda.so.1"))
    version = ctypes.c_int(0)
    assert libcuda.cuDriverGetVersion(ctypes.byref(version)) == 0
    assert version.value == cuda_lib.encoded(branch.cuda_version)
    toolkit = catalog.toolkit_packages()[0].files
    assert plugin_cdi.CDI_HOOK in toolkit
    assert toolkit[f"{catalog.RUNTIME_DIR}/nvidia_cdi_hook.py"].data() == Path(hook.__file__).read_bytes()


def test_cuda_compat_libraries_of_a_newer_driver_go_first(tmp_path: Path) -> None:
    """enable-cuda-compat: an image's /usr/local/cuda/compat of a newer driver than the host's
    is configured for the loader; of an older or the same driver, it is not."""
    rootfs, state = _bundle(tmp_path, {"containerEdits": {"mounts": []}})
    compat = rootfs / "usr/local/cuda/compat"
    compat.mkdir(parents=True)
    (compat / "libcuda.so.570.86.15").write_bytes(b"compat")
    conf = rootfs / "etc/ld.so.conf.d/00-compat-gpukit.conf"
    hook.run(["enable-cuda-compat", "--host-driver-version=570.86.15"], state)
    assert not conf.exists()
    hook.run(["enable-cuda-compat", "--host-driver-version=550.90.07"], state)
    assert conf.read_text() == "/usr/local/cuda/compat\n"
