"""The lab's nvidia-container-runtime (gpukit/lab/runtime/nvidia_container_runtime.py) without a lab:
a bundle dir with a config.json, a fake /dev (stat table) and /proc, the config's keys; what
it writes into the OCI spec, what it refuses, and that only `create` is touched. Its NVML
enumeration against the mock library (MIG devices and their capability minors included)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from gpukit.lab import driver_surface as ds
from gpukit.lab.runtime import nvidia_container_runtime as ncr
from gpukit.lab.runtime.nvidia_container_runtime import DevNode, Gpu, Host, MigDevice

GPU0 = "GPU-00000000-0000-0000-0000-000000000000"
GPU1 = "GPU-11111111-1111-1111-1111-111111111111"
MIG01 = "MIG-01010101-0101-0101-0101-010101010101"
CAPS_MAJOR = 509


def fake_dev(gpus: list[Gpu], control: bool = True) -> dict[str, DevNode]:
    nodes = {f"/dev/nvidia{g.minor}": DevNode("c", 195, g.minor, 0o666) for g in gpus}
    if control:
        nodes.update({"/dev/nvidiactl": DevNode("c", 195, 255, 0o666),
                      "/dev/nvidia-modeset": DevNode("c", 195, 254, 0o666),
                      "/dev/nvidia-uvm": DevNode("c", 510, 0, 0o666),
                      "/dev/nvidia-uvm-tools": DevNode("c", 510, 1, 0o666)})
    for minor in range(1, 32 * ds.CAPS_PER_GPU):
        nodes[f"/dev/nvidia-caps/nvidia-cap{minor}"] = DevNode("c", CAPS_MAJOR, minor, 0o444)
    return nodes


def fake_proc(root: Path, gpus: list[Gpu]) -> Path:
    """/proc/driver/nvidia/capabilities as the driver writes it for the MIG devices."""
    for g in gpus:
        for m in g.mig_devices:
            gi = root / f"driver/nvidia/capabilities/gpu{g.minor}/mig/gi{m.gi}"
            (gi / f"ci{m.ci}").mkdir(parents=True, exist_ok=True)
            (gi / "access").write_text(ds.cap_file(ds.caps_minor(g.minor, m.gi)))
            (gi / f"ci{m.ci}/access").write_text(ds.cap_file(ds.caps_minor(g.minor, m.gi, m.ci)))
    return root


GPUS = [
    Gpu(0, GPU0, 0, (MigDevice(MIG01, 0, 7, 0), MigDevice("MIG-b", 1, 8, 0))),
    Gpu(1, GPU1, 1),
]


@pytest.fixture
def host(tmp_path: Path) -> Host:
    table = fake_dev(GPUS)
    driver = tmp_path / "driver"
    for rel in ("usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", "usr/bin/nvidia-smi"):
        (driver / rel).parent.mkdir(parents=True, exist_ok=True)
        (driver / rel).write_text("x")
    return Host(dev_root="/", proc_root=str(fake_proc(tmp_path / "proc", GPUS)),
                driver_root=str(driver), stat=table.get, discover=lambda: list(GPUS))


def oci(env: dict[str, str] | None = None, privileged: bool = False,
        mounts: Sequence[str] = (), annotations: dict[str, str] | None = None) -> dict[str, Any]:
    caps = ["CAP_CHOWN", "CAP_KILL"] + (["CAP_SYS_ADMIN"] if privileged else [])
    return {
        "ociVersion": "1.1.0",
        "process": {"env": ["PATH=/bin"] + [f"{k}={v}" for k, v in (env or {}).items()],
                    "capabilities": {"bounding": caps, "effective": caps}},
        "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}]
        + [{"destination": f"/var/run/nvidia-container-devices/{m}", "type": "bind",
            "source": "/dev/null", "options": ["rbind", "ro"]} for m in mounts],
        "annotations": annotations or {},
        "linux": {"resources": {"devices": [{"allow": False, "access": "rwm"}]}},
    }


def devices(spec: dict[str, Any]) -> dict[str, tuple[int, int]]:
    return {d["path"]: (d["major"], d["minor"]) for d in spec["linux"].get("devices", [])}


def allowed(spec: dict[str, Any]) -> set[tuple[int, int]]:
    return {(r["major"], r["minor"]) for r in spec["linux"]["resources"]["devices"] if r["allow"]}


CONTROL = {"/dev/nvidiactl", "/dev/nvidia-modeset", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}
LEGACY = ncr.Config(mode="legacy")


# --- config -----------------------------------------------------------------------------------


def test_config_defaults_are_nvidias() -> None:
    cfg = ncr.load_config("")
    assert cfg.mode == "auto" and cfg.envvar_when_unprivileged and not cfg.volume_mounts
    assert cfg.spec_dirs == ("/etc/cdi", "/var/run/cdi")
    assert cfg.default_kind == "nvidia.com/gpu" and cfg.annotation_prefixes == ("cdi.k8s.io/",)


def test_config_reads_the_real_keys() -> None:
    cfg = ncr.load_config("""
accept-nvidia-visible-devices-envvar-when-unprivileged = false
accept-nvidia-visible-devices-as-volume-mounts = true
unknown-key = 1
[nvidia-container-cli]
root = "/run/nvidia/driver"
[nvidia-container-runtime]
debug = "/var/log/x.log"
mode = "cdi"
runtimes = ["crun", "runc"]
[nvidia-container-runtime.modes.cdi]
default-kind = "example.com/gpu"
annotation-prefixes = ["nvidia.cdi.k8s.io/"]
spec-dirs = ["/a"]
""")
    assert cfg == ncr.Config(mode="cdi", runtimes=("crun", "runc"), debug="/var/log/x.log",
                             spec_dirs=("/a",), default_kind="example.com/gpu",
                             annotation_prefixes=("nvidia.cdi.k8s.io/",),
                             envvar_when_unprivileged=False, volume_mounts=True,
                             driver_root="/run/nvidia/driver")


@pytest.mark.parametrize(("text", "message"), [
    ('[nvidia-container-runtime]\nmode = "fast"', "nvidia-container-runtime.mode = 'fast': expected one of"),
    ("accept-nvidia-visible-devices-as-volume-mounts = 1", "accept-nvidia-visible-devices-as-volume-mounts = 1: expected a bool"),
    ('[nvidia-container-runtime]\nruntimes = "runc"', "nvidia-container-runtime.runtimes = 'runc': expected a list of strings"),
    ("[nvidia-container-runtime", "not valid TOML"),
])
def test_bad_config_is_refused_naming_key_and_value(text: str, message: str) -> None:
    with pytest.raises(ncr.RuntimeFailure, match=r"^/etc/nvidia-container-runtime/config\.toml: ") as e:
        ncr.load_config(text)
    assert message in str(e.value)


# --- command line -----------------------------------------------------------------------------


def test_create_and_bundle_found_among_runc_flags() -> None:
    args = ["--root", "/run/containerd/runc/k8s.io", "--log", "/b/log.json", "--log-format",
            "json", "create", "--bundle", "/b", "--pid-file", "/b/init.pid", "abc"]
    assert ncr.is_create(args) and ncr.bundle_dir(args) == "/b"
    assert not ncr.is_create(["--bundle", "create", "start", "abc"])
    assert ncr.bundle_dir(["create", "--bundle=/x", "id"]) == "/x"
    assert ncr.bundle_dir(["create", "-b", "/y", "id"]) == "/y"
    assert not ncr.is_create(["--root", "/r", "start", "abc"])


# --- legacy mode --------------------------------------------------------------------------------


def test_legacy_envvar_index_gets_its_gpu_control_nodes_and_driver_files(host: Host) -> None:
    spec = oci({"NVIDIA_VISIBLE_DEVICES": "1"})
    mode, _, _ = ncr.modify(spec, LEGACY, host)
    assert mode == "legacy"
    assert devices(spec) == {"/dev/nvidia1": (195, 1), "/dev/nvidiactl": (195, 255),
                             "/dev/nvidia-modeset": (195, 254), "/dev/nvidia-uvm": (510, 0),
                             "/dev/nvidia-uvm-tools": (510, 1)}
    assert allowed(spec) == set(devices(spec).values())
    assert spec["linux"]["resources"]["devices"][0] == {"allow": False, "access": "rwm"}
    binds = {m["destination"]: m for m in spec["mounts"] if m["type"] == "bind"}
    assert set(binds) == {"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", "/usr/bin/nvidia-smi"}
    assert binds["/usr/bin/nvidia-smi"]["source"] == f"{host.driver_root}/usr/bin/nvidia-smi"
    assert "ro" in binds["/usr/bin/nvidia-smi"]["options"]


def test_legacy_uuid_list_and_all(host: Host) -> None:
    spec = oci({"NVIDIA_VISIBLE_DEVICES": f"{GPU0},{GPU1}"})
    ncr.modify(spec, LEGACY, host)
    assert set(devices(spec)) - CONTROL == {"/dev/nvidia0", "/dev/nvidia1"}
    spec = oci({"NVIDIA_VISIBLE_DEVICES": "all"})
    ncr.modify(spec, LEGACY, host)
    gi7 = [ds.caps_minor(0, 7), ds.caps_minor(0, 7, 0), ds.caps_minor(0, 8), ds.caps_minor(0, 8, 0)]
    assert set(devices(spec)) - CONTROL == {"/dev/nvidia0", "/dev/nvidia1",
                                            *(f"/dev/nvidia-caps/nvidia-cap{m}" for m in gi7)}


@pytest.mark.parametrize("request_", [MIG01, "0:0"])
def test_legacy_mig_device_gets_parent_node_and_its_caps(host: Host, request_: str) -> None:
    spec = oci({"NVIDIA_VISIBLE_DEVICES": request_})
    ncr.modify(spec, LEGACY, host)
    gi, ci = ds.caps_minor(0, 7), ds.caps_minor(0, 7, 0)
    assert set(devices(spec)) - CONTROL == {"/dev/nvidia0", f"/dev/nvidia-caps/nvidia-cap{gi}",
                                            f"/dev/nvidia-caps/nvidia-cap{ci}"}
    assert devices(spec)[f"/dev/nvidia-caps/nvidia-cap{ci}"] == (CAPS_MAJOR, ci)
    assert (CAPS_MAJOR, gi) in allowed(spec) and (CAPS_MAJOR, ds.caps_minor(0, 8)) not in allowed(spec)


def test_none_gives_driver_but_no_gpu_void_and_unset_give_nothing(host: Host) -> None:
    spec = oci({"NVIDIA_VISIBLE_DEVICES": "none"})
    ncr.modify(spec, LEGACY, host)
    assert set(devices(spec)) == CONTROL
    for env in ({"NVIDIA_VISIBLE_DEVICES": "void"}, {}):
        spec = oci(env)
        before = json.dumps(spec)
        ncr.modify(spec, LEGACY, host)
        assert json.dumps(spec) == before


def test_legacy_cuda_image_without_the_variable_gets_every_gpu(host: Host) -> None:
    spec = oci({"CUDA_VERSION": "12.4.0"})
    ncr.modify(spec, LEGACY, host)
    assert {"/dev/nvidia0", "/dev/nvidia1"} <= set(devices(spec))


def test_unknown_device_is_an_error(host: Host) -> None:
    with pytest.raises(ncr.RuntimeFailure, match="device error: 7: unknown device"):
        ncr.modify(oci({"NVIDIA_VISIBLE_DEVICES": "0,7"}), LEGACY, host)


def test_missing_mig_capability_file_is_an_error(host: Host, tmp_path: Path) -> None:
    host.proc_root = str(tmp_path / "empty")
    with pytest.raises(ncr.RuntimeFailure, match="capabilities/gpu0/mig/gi7/access"):
        ncr.modify(oci({"NVIDIA_VISIBLE_DEVICES": "0:0"}), LEGACY, host)


# --- who may ask: privilege, volume mounts -------------------------------------------------------

HARDENED = ncr.Config(mode="legacy", envvar_when_unprivileged=False, volume_mounts=True)


def test_hardened_ignores_the_variable_in_unprivileged_containers(host: Host) -> None:
    spec = oci({"NVIDIA_VISIBLE_DEVICES": "all"})
    _, edits, notes = ncr.modify(spec, HARDENED, host)
    assert "devices" not in spec["linux"] and not edits.mounts
    assert "ignoring NVIDIA_VISIBLE_DEVICES in an unprivileged container" in notes[0]
    spec = oci({"NVIDIA_VISIBLE_DEVICES": "all"}, privileged=True)
    ncr.modify(spec, HARDENED, host)
    assert {"/dev/nvidia0", "/dev/nvidia1"} <= set(devices(spec))


def test_volume_mounts_when_accepted_and_over_the_variable(host: Host) -> None:
    spec = oci({"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices"}, mounts=[GPU1])
    ncr.modify(spec, HARDENED, host)
    assert set(devices(spec)) - CONTROL == {"/dev/nvidia1"}
    # not accepted (NVIDIA's default): the variable's value is taken as the device list
    with pytest.raises(ncr.RuntimeFailure, match="/var/run/nvidia-container-devices: unknown device"):
        ncr.modify(oci({"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices"},
                       mounts=[GPU1]), LEGACY, host)


# --- CDI mode ---------------------------------------------------------------------------------


def write_specs(d: Path) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "nvidia.yaml").write_text("""
cdiVersion: 0.5.0
kind: nvidia.com/gpu
containerEdits:
  env: [NVIDIA_VISIBLE_DEVICES=void]
  deviceNodes: [{path: /dev/nvidiactl}]
  mounts:
  - {hostPath: /usr/bin/nvidia-smi, containerPath: /usr/bin/nvidia-smi, options: [ro, nosuid, nodev, bind]}
  hooks:
  - {hookName: createContainer, path: /usr/bin/nvidia-cdi-hook, args: [nvidia-cdi-hook, update-ldcache]}
devices:
- name: "0"
  containerEdits: {deviceNodes: [{path: /dev/nvidia0}]}
- name: "0:0"
  containerEdits:
    deviceNodes: [{path: /dev/nvidia0}, {path: /dev/nvidia-caps/nvidia-cap66}, {path: /dev/nvidia-caps/nvidia-cap67}]
""")
    (d / "other.json").write_text(json.dumps({
        "cdiVersion": "0.5.0", "kind": "example.com/fpga",
        "devices": [{"name": "f0", "containerEdits": {"deviceNodes": [
            {"path": "/dev/fpga0", "type": "c", "major": 240, "minor": 3}]}}]}))
    return d


CDI = "cdi.k8s.io/gpukit-device-plugin_1234"


def test_cdi_annotation_resolved_from_the_spec_dirs(host: Host, tmp_path: Path) -> None:
    cfg = ncr.Config(mode="cdi", spec_dirs=(str(write_specs(tmp_path / "cdi")),))
    spec = oci(annotations={CDI: "nvidia.com/gpu=0:0", "other": "nvidia.com/gpu=1"})
    ncr.modify(spec, cfg, host)
    assert set(devices(spec)) == {"/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap66",
                                  "/dev/nvidia-caps/nvidia-cap67"}
    assert devices(spec)["/dev/nvidia-caps/nvidia-cap66"] == (CAPS_MAJOR, 66)
    assert "NVIDIA_VISIBLE_DEVICES=void" in spec["process"]["env"]
    assert spec["hooks"]["createContainer"] == [
        {"path": "/usr/bin/nvidia-cdi-hook", "args": ["nvidia-cdi-hook", "update-ldcache"]}]
    assert any(m["destination"] == "/usr/bin/nvidia-smi" for m in spec["mounts"])


def test_cdi_mode_qualifies_the_variable_with_the_default_kind(host: Host, tmp_path: Path) -> None:
    cfg = ncr.Config(mode="cdi", spec_dirs=(str(write_specs(tmp_path / "cdi")),))
    spec = oci({"NVIDIA_VISIBLE_DEVICES": "0,example.com/fpga=f0"})
    ncr.modify(spec, cfg, host)
    assert devices(spec)["/dev/fpga0"] == (240, 3) and "/dev/nvidia0" in devices(spec)


def test_auto_mode_picks_cdi_for_annotations_and_qualified_names(host: Host, tmp_path: Path) -> None:
    cfg = ncr.Config(mode="auto", spec_dirs=(str(write_specs(tmp_path / "cdi")),))
    assert ncr.modify(oci(annotations={CDI: "nvidia.com/gpu=0"}), cfg, host)[0] == "cdi"
    assert ncr.modify(oci({"NVIDIA_VISIBLE_DEVICES": "nvidia.com/gpu=0"}), cfg, host)[0] == "cdi"
    assert ncr.modify(oci({"NVIDIA_VISIBLE_DEVICES": "0"}), cfg, host)[0] == "legacy"


def test_legacy_mode_ignores_cdi_annotations(host: Host) -> None:
    spec = oci(annotations={CDI: "nvidia.com/gpu=0"})
    ncr.modify(spec, LEGACY, host)
    assert "devices" not in spec["linux"]


def test_unresolvable_cdi_device_names_the_device_and_dirs(host: Host, tmp_path: Path) -> None:
    d = write_specs(tmp_path / "cdi")
    cfg = ncr.Config(mode="cdi", spec_dirs=(str(d), str(tmp_path / "none")))
    with pytest.raises(ncr.RuntimeFailure, match=r"unresolvable CDI devices nvidia.com/gpu=5 in .*/cdi"):
        ncr.modify(oci(annotations={CDI: "nvidia.com/gpu=0,nvidia.com/gpu=5"}), cfg, host)
    with pytest.raises(ncr.RuntimeFailure, match="not a qualified CDI device name"):
        ncr.modify(oci(annotations={CDI: "gpu0"}), cfg, host)


def test_later_spec_dir_wins_a_name_clash(host: Host, tmp_path: Path) -> None:
    first = write_specs(tmp_path / "etc")
    second = tmp_path / "run"
    second.mkdir()
    (second / "p.json").write_text(json.dumps({"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu",
        "devices": [{"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia1"}]}}]}))
    spec = oci(annotations={CDI: "nvidia.com/gpu=0"})
    ncr.modify(spec, ncr.Config(mode="cdi", spec_dirs=(str(first), str(second))), host)
    assert set(devices(spec)) == {"/dev/nvidia1"}


def test_cdi_device_node_missing_on_the_host_is_an_error(host: Host, tmp_path: Path) -> None:
    d = tmp_path / "cdi"
    d.mkdir()
    (d / "x.json").write_text(json.dumps({"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu",
        "devices": [{"name": "9", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia9"}]}}]}))
    with pytest.raises(ncr.RuntimeFailure, match="device node /dev/nvidia9 does not exist"):
        ncr.modify(oci(annotations={CDI: "nvidia.com/gpu=9"}), ncr.Config(mode="cdi", spec_dirs=(str(d),)), host)


# --- the binary: create edits the bundle then execs runc; failures start nothing -----------------


class Exec:
    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, path: str, argv: list[str]) -> None:
        self.calls.append(argv)


def bundle(tmp_path: Path, spec: dict[str, Any]) -> Path:
    b = tmp_path / "bundle" / "c0ffee"
    b.mkdir(parents=True)
    (b / "config.json").write_text(json.dumps(spec))
    return b


def config_file(tmp_path: Path, body: str) -> str:
    runc = tmp_path / "bin/runc"
    runc.parent.mkdir(exist_ok=True)
    runc.write_text("#!/bin/sh\n")
    runc.chmod(0o755)
    path = tmp_path / "config.toml"
    path.write_text(f'{body}\n[nvidia-container-runtime]\nruntimes = ["{runc}"]\n'
                    f'debug = "{tmp_path / "runtime.log"}"\nmode = "legacy"\n')
    return str(path)


def test_create_edits_the_bundle_then_runs_runc(host: Host, tmp_path: Path) -> None:
    b = bundle(tmp_path, oci({"NVIDIA_VISIBLE_DEVICES": "0"}))
    exe = Exec()
    args = ["--root", "/r", "--log", str(b / "log.json"), "create", "--bundle", str(b), "c0ffee"]
    assert ncr.run(args, config_file(tmp_path, ""), host, exe) == 0
    assert exe.calls == [[str(tmp_path / "bin/runc"), *args]]
    spec = json.loads((b / "config.json").read_text())
    assert "/dev/nvidia0" in devices(spec)
    log = (tmp_path / "runtime.log").read_text().splitlines()
    assert log[0].endswith(f"nvidia-container-runtime {' '.join(args)}")
    assert "c0ffee: mode legacy: devices /dev/nvidia0" in log[1]


def test_other_subcommands_pass_through_untouched(host: Host, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    spec = oci({"NVIDIA_VISIBLE_DEVICES": "0"})
    b = bundle(tmp_path, spec)
    exe = Exec()
    monkeypatch.chdir(b)  # `start` has no --bundle: the bundle would be the cwd
    assert ncr.run(["start", "c0ffee"], config_file(tmp_path, ""), host, exe) == 0
    assert exe.calls[0][1:] == ["start", "c0ffee"]
    assert json.loads((b / "config.json").read_text()) == spec


def test_failed_create_starts_nothing_and_says_why(host: Host, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    spec = oci({"NVIDIA_VISIBLE_DEVICES": "GPU-nope"})
    b = bundle(tmp_path, spec)
    exe = Exec()
    args = ["--log", str(b / "log.json"), "create", "--bundle", str(b), "c0ffee"]
    assert ncr.run(args, config_file(tmp_path, ""), host, exe) == 1
    assert exe.calls == []
    assert json.loads((b / "config.json").read_text()) == spec
    assert "nvidia-container-runtime: device error: GPU-nope: unknown device" in capsys.readouterr().err
    entry = json.loads((b / "log.json").read_text())
    assert entry["level"] == "error" and "GPU-nope: unknown device" in entry["msg"]


def test_bad_config_fails_every_call(host: Host, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.toml"
    path.write_text('[nvidia-container-runtime]\nmode = "fast"\n')
    exe = Exec()
    assert ncr.run(["start", "x"], str(path), host, exe) == 1 and exe.calls == []
    assert "mode = 'fast'" in capsys.readouterr().err


# --- NVML enumeration against the mock library --------------------------------------------------


@pytest.mark.nvml
def test_nvml_enumeration_matches_the_mock_driver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pynvml

    from gpukit.lab import nvml as mock
    from gpukit.lab.nvml.control import MockControl

    lib = mock.build()
    state = tmp_path / "state"
    env = mock.env("a100-sxm4-40gb-x8", state, library=lib)
    for key in (mock.ENV_PROFILE, mock.ENV_STATE_DIR, mock.ENV_LIB):
        monkeypatch.setenv(key, env[key])
    mock.load_mock(lib)
    pynvml.nvmlInit()
    try:
        ctl = MockControl(lib)
        ctl.boot()
        h = pynvml.nvmlDeviceGetHandleByIndex(2)
        pynvml.nvmlDeviceSetMigMode(h, pynvml.NVML_DEVICE_MIG_ENABLE)
        ctl.reset(2)
        info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(h, pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE)
        for _ in range(2):
            gi = pynvml.nvmlDeviceCreateGpuInstance(h, info.id)
            ci_info = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
                pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
            pynvml.nvmlGpuInstanceCreateComputeInstance(gi, ci_info.id)
        want_migs = []
        for slot in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(h)):
            try:
                m = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, slot)
            except pynvml.NVMLError_NotFound:
                continue
            want_migs.append((pynvml.nvmlDeviceGetUUID(m), pynvml.nvmlDeviceGetGpuInstanceId(m),
                              pynvml.nvmlDeviceGetComputeInstanceId(m)))
        gpus = ncr.nvml_gpus(str(lib))
        assert len(gpus) == 8
        assert [g.uuid for g in gpus] == [pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(8)]
        assert [(m.uuid, m.gi, m.ci) for m in gpus[2].mig_devices] == want_migs and len(want_migs) == 2
        assert [m.index for m in gpus[2].mig_devices] == [0, 1]
        assert all(not g.mig_devices for i, g in enumerate(gpus) if i != 2)
        # the runtime finds the caps minors in the mock driver's /proc files
        proc = tmp_path / "proc"
        proc.mkdir()
        (proc / "driver").symlink_to(state / "proc-driver")
        host = Host(proc_root=str(proc), stat=fake_dev(gpus).get, discover=lambda: gpus)
        spec = oci({"NVIDIA_VISIBLE_DEVICES": "2:1"})
        ncr.modify(spec, LEGACY, host)
        g2, m1 = gpus[2], gpus[2].mig_devices[1]
        caps = {f"/dev/nvidia-caps/nvidia-cap{ds.caps_minor(g2.minor, m1.gi)}",
                f"/dev/nvidia-caps/nvidia-cap{ds.caps_minor(g2.minor, m1.gi, m1.ci)}"}
        assert set(devices(spec)) - CONTROL == {f"/dev/nvidia{g2.minor}", *caps}
    finally:
        pynvml.nvmlShutdown()


# --- as packaged: the file runs on its own (python3 -I, no gpukit), with the package's config ---


def test_packaged_config_is_nvidias_default() -> None:
    from gpukit.lab.packages import catalog

    assert ncr.load_config(catalog.RUNTIME_CONFIG) == ncr.Config(
        debug=catalog.RUNTIME_LOG)  # mode auto, envvar accepted, no volume mounts
    files = catalog.toolkit_packages()[0].files
    assert files["/usr/bin/nvidia-container-runtime"].data().startswith(b"#!/bin/sh\n")
    assert files[f"{catalog.RUNTIME_DIR}/nvidia_container_runtime.py"].data() == Path(ncr.__file__).read_bytes()


def test_standalone_script_refuses_and_passes_through(tmp_path: Path) -> None:
    import subprocess
    import sys

    script = Path(ncr.__file__).resolve()
    runc = tmp_path / "runc"
    runc.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/runc.args\n")
    runc.chmod(0o755)
    cdi = write_specs(tmp_path / "cdi")
    conf = tmp_path / "xdg/nvidia-container-runtime/config.toml"
    conf.parent.mkdir(parents=True)
    conf.write_text(f'[nvidia-container-runtime]\nmode = "cdi"\nruntimes = ["{runc}"]\n'
                    f'[nvidia-container-runtime.modes.cdi]\nspec-dirs = ["{cdi}"]\n')
    b = bundle(tmp_path, oci(annotations={CDI: "nvidia.com/gpu=3"}))
    env = {"PATH": "/usr/bin:/bin", "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    r = subprocess.run([sys.executable, "-I", str(script), "create", "--bundle", str(b), "id1"],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 1, r
    assert "unresolvable CDI devices nvidia.com/gpu=3" in r.stderr
    assert not (tmp_path / "runc.args").exists()
    r = subprocess.run([sys.executable, "-I", str(script), "delete", "id1"], capture_output=True,
                       text=True, env=env)
    assert r.returncode == 0, r
    assert (tmp_path / "runc.args").read_text() == "delete id1\n"
