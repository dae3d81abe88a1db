"""GPU facts, the CDI spec and MIG runs against the lab's mock NVML (in subprocesses: pynvml
keeps one library per process)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from gpukit.plugin.devices import Gpu, MigDevice, NodeDevices
from gpukit.provision import cdi

FACTS = """
import json, os
from gpukit.provision import gpu_facts
print(json.dumps(gpu_facts.gather(library=os.environ['GPUKIT_NVML_LIB']).as_dict()))
"""


def run_py(code: str, env: dict[str, str]) -> str:
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_gpu_facts_from_the_mock(mock_env: dict[str, str]) -> None:
    facts = json.loads(run_py(FACTS, mock_env))
    assert facts["nvml"] is True and facts["error"] is None
    assert facts["driver_version"] == "550.90.07"
    assert facts["cuda_driver_version"] == "12.4"
    assert facts["gpu_count"] == 8
    assert facts["products"] == ["NVIDIA A100-SXM4-40GB"]
    g0 = facts["gpus"][0]
    assert g0["mig_capable"] is True and g0["mig_mode_current"] == "disabled"
    assert g0["memory_mib"] == 40960 and g0["compute_capability"] == "8.0"
    assert facts["mig_enabled_gpus"] == [] and facts["nouveau_loaded"] is False


def test_gpu_facts_report_a_missing_driver_instead_of_failing(mock_env: dict[str, str],
                                                              tmp_path: Path) -> None:  # fmt: skip
    env = {**mock_env, "GPUKIT_NVML_PROFILE": str(tmp_path / "no-such-profile.yaml")}
    facts = json.loads(run_py(FACTS, env))
    assert facts["nvml"] is False and "nvmlInit" in facts["error"]
    assert facts["driver_version"] is None and facts["gpu_count"] == 0


def _gpu(i: int, migs: tuple[MigDevice, ...] = ()) -> Gpu:
    return Gpu(index=i, uuid=f"GPU-{i:08d}-0000-0000-0000-000000000000", minor=i,
               name="NVIDIA A100-SXM4-40GB", memory_mb=40960, mig_capable=True,
               mig_enabled=bool(migs), mig_devices=migs)  # fmt: skip


def test_cdi_spec_names_every_device_by_index_uuid_and_all() -> None:
    mig0 = MigDevice(uuid="MIG-11111111-0000-0000-0000-000000000000",
                     parent_uuid=_gpu(0).uuid, parent_index=0, index=0, gi=1, ci=0,
                     profile="3g.20gb", memory_mb=19968)  # fmt: skip
    inv = NodeDevices(gpus=(_gpu(0, (mig0,)), _gpu(1)))
    present = {"/dev/nvidiactl", "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"}
    spec = cdi.build(inv, exists=present.__contains__)
    names = [d["name"] for d in spec["devices"]]
    assert names == [_gpu(0).uuid, "0", mig0.uuid, "0:0", _gpu(1).uuid, "1", "all"]
    assert spec["kind"] == "nvidia.com/gpu" and spec["cdiVersion"] == "0.5.0"
    assert spec["containerEdits"]["deviceNodes"] == [{"path": "/dev/nvidiactl"}]
    assert spec["containerEdits"]["mounts"][0]["hostPath"].endswith("libnvidia-ml.so.1")
    all_dev = spec["devices"][-1]["containerEdits"]["deviceNodes"]
    assert all_dev == [{"path": "/dev/nvidia0"}, {"path": "/dev/nvidia1"}]
    edit = cdi.plan(inv, None, "/etc/cdi/nvidia.yaml", exists=present.__contains__)
    assert edit.changes == ("/etc/cdi/nvidia.yaml: created (3 devices)",)
    assert yaml.safe_load(edit.after or "") == spec
    again = cdi.plan(inv, edit.after, "/etc/cdi/nvidia.yaml", exists=present.__contains__)
    assert not again.changed


MIG_RUN = """
import json, sys
from gpukit.provision import mig
path = sys.argv[1]
open(path, "w").write(mig.parted_config({
    "mixed": [{"devices": [0], "mig-enabled": True, "mig-devices": {"3g.20gb": 2}},
              {"devices": [1, 2, 3, 4, 5, 6, 7], "mig-enabled": False}]}))
out = {}
for cmd in ("plan", "apply", "plan"):
    r = mig.run(cmd, path, "mixed")
    out[cmd + str(len(out))] = {"changed": r.changed, "summary": r.summary}
print(json.dumps(out))
"""


def test_mig_manager_plan_apply_converge(mock_env: dict[str, str], tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-c", MIG_RUN, str(tmp_path / "mig.yaml")],
                       env=mock_env, capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["plan0"]["changed"] is True
    assert out["plan0"]["summary"][0].startswith("GPU 0: ")
    assert out["apply1"]["changed"] is True
    assert out["plan2"] == {"changed": False, "summary": []}


def test_a_library_of_another_version_than_the_loaded_module_is_a_mismatch(
        mock_env: dict[str, str], tmp_path: Path) -> None:  # fmt: skip
    """As the driver package installs it (libnvidia-ml.so.<version>), the library answers
    nvmlInit with NVML_ERROR_LIB_RM_VERSION_MISMATCH (18) while the loaded module (the
    profile's driver_version, which the stand-in module's load writes) has another version."""
    lib_dir = tmp_path / "lib"
    lib_dir.mkdir()
    for version in ("550.90.07", "570.86.15"):
        (lib_dir / f"libnvidia-ml.so.{version}").write_bytes(
            Path(mock_env["GPUKIT_NVML_LIB"]).read_bytes())
    code = """
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
lib.nvmlErrorString.restype = ctypes.c_char_p
rc = lib.nvmlInit_v2()
print(rc, lib.nvmlErrorString(rc).decode())
"""
    def init(version: str) -> str:
        r = subprocess.run([sys.executable, "-c", code, str(lib_dir / f"libnvidia-ml.so.{version}")],
                           env=mock_env, capture_output=True, text=True)  # fmt: skip
        assert r.returncode == 0, r.stderr
        return r.stdout.strip()

    assert init("550.90.07") == "0 Success"
    assert init("570.86.15") == "18 RM has detected an NVML/RM version mismatch."


MIG_PLAN_MISMATCHED = """
import json, sys
from gpukit.provision import mig
path = sys.argv[1]
open(path, "w").write(mig.parted_config({"one": [{"devices": "all", "mig-enabled": False}]}))
try:
    mig.run("plan", path, "one")
except mig.MigRunError as e:
    print(json.dumps({"error": str(e), "pending": mig.driver_not_activated(e)}))
"""


def test_a_plan_while_the_installed_driver_is_not_loaded_says_so(
        mock_env: dict[str, str], tmp_path: Path) -> None:  # fmt: skip
    """After a driver install that was not activated (the library is 570, the module 550), the
    MIG manager cannot read the GPUs: the plan says the driver is pending activation (the
    mig_layout module's check mode then reports a change instead of failing the play)."""
    lib = tmp_path / "libnvidia-ml.so.570.86.15"
    lib.write_bytes(Path(mock_env["GPUKIT_NVML_LIB"]).read_bytes())
    env = {**mock_env, "GPUKIT_NVML_LIB": str(lib)}
    r = subprocess.run([sys.executable, "-c", MIG_PLAN_MISMATCHED, str(tmp_path / "mig.yaml")],
                       env=env, capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["pending"] is True, out
    assert "version mismatch" in out["error"], out
