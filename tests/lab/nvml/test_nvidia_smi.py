"""gpukit.lab.nvidia_smi: nvidia-smi's -L, summary table, --query-gpu and topo -m over pynvml;
the stand-in driver's nvidia-smi binary (gpukit/lab/nvidia_smi.c): -L itself, the rest handed
to nvidia_smi.py."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from nvmltest import enable_mig

from gpukit.lab import nvidia_smi
from gpukit.lab import nvml as mock
from gpukit.lab.nvml.control import MockControl
from gpukit.lab.packages import nvidia_smi_bin

pytestmark = pytest.mark.nvml


def smi(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = nvidia_smi.main(list(args))
    return code, capsys.readouterr().out


def _mig_node(nvml: Any, ctl: MockControl) -> Any:
    h = enable_mig(nvml, ctl, 0)
    for profile, ci in ((9, 2), (9, 2)):  # two 3g.20gb (driver id 9), each one full CI
        gi = nvml.nvmlDeviceCreateGpuInstance(h, profile)
        nvml.nvmlGpuInstanceCreateComputeInstance(gi, ci)
    return h


def test_list_gpus_like_nvidia_smi(nvml: Any, ctl: MockControl, capsys: Any) -> None:
    h = _mig_node(nvml, ctl)
    code, out = smi(capsys, "-L")
    assert code == 0
    lines = out.splitlines()
    assert len(lines) == 10
    assert lines[0] == f"GPU 0: NVIDIA A100-SXM4-40GB (UUID: {nvml.nvmlDeviceGetUUID(h)})"
    for k in (0, 1):
        uuid = nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, k))
        assert lines[1 + k] == f"  MIG 3g.20gb     Device  {k}: (UUID: {uuid})"
    assert re.fullmatch(r"GPU 7: NVIDIA A100-SXM4-40GB \(UUID: GPU-[0-9a-f-]{36}\)", lines[9])


def test_list_shows_lost_gpus_and_exits_with_the_nvml_code(
    nvml: Any, ctl: MockControl, capsys: Any
) -> None:
    ctl.lose(1)
    code, out = smi(capsys, "-L", "-i", "0,1")
    assert code == 15
    assert out.splitlines()[1] == "Unable to determine the device handle for GPU 1: GPU is lost"


def test_query_gpu_csv(nvml: Any, ctl: MockControl, capsys: Any) -> None:
    _mig_node(nvml, ctl)
    fields = "name,uuid,driver_version,memory.total,mig.mode.current"
    code, out = smi(capsys, f"--query-gpu={fields}", "--format=csv,noheader", "-i", "0,3")
    assert code == 0
    u0, u3 = (nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i)) for i in (0, 3))
    assert out.splitlines() == [
        f"NVIDIA A100-SXM4-40GB, {u0}, 550.90.07, 40960 MiB, Enabled",
        f"NVIDIA A100-SXM4-40GB, {u3}, 550.90.07, 40960 MiB, Disabled",
    ]
    code, out = smi(capsys, "--query-gpu=index,memory.total,power.draw,mig.mode.pending",
                    "--format=csv")
    assert out.splitlines()[0] == "index, memory.total [MiB], power.draw [W], mig.mode.pending"
    assert out.splitlines()[1] == "0, 40960 MiB, 62.00 W, Enabled"
    code, out = smi(capsys, "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0")
    assert out.strip() == "424"
    code, out = smi(capsys, "--query-gpu=name,flux", "--format=csv")
    assert code == 2 and 'Field "flux" is not a valid field to query.' in out


@pytest.mark.parametrize("profile_name", ["t4-x2"])
def test_query_mig_mode_on_t4_is_not_available(nvml: Any, capsys: Any) -> None:
    code, out = smi(capsys, "--query-gpu=name,mig.mode.current", "--format=csv,noheader")
    assert code == 0
    assert out.splitlines() == ["Tesla T4, [N/A]", "Tesla T4, [N/A]"]


def test_summary_table(nvml: Any, ctl: MockControl, capsys: Any) -> None:
    _mig_node(nvml, ctl)
    ctl.set_process(0, pid=4242, mem_mb=300, gi=1, ci=0, name="trainer")
    code, out = smi(capsys, "-i", "0,1")
    assert code == 0
    assert "Driver Version: 550.90.07" in out and "CUDA Version: 12.4" in out
    assert "|   0  NVIDIA A100-SXM4-40GB          On  |   00000000:07:00.0 Off |" in out
    assert "MIG devices:" in out
    assert re.search(r"\|\s+0\s+1\s+0\s+4242\s+C\s+trainer\s+300MiB \|", out)
    widths = {len(line) for line in out.splitlines()[1:] if line.startswith(("|", "+"))}
    assert widths == {91}, widths


def _matrix(out: str) -> dict[str, list[str]]:
    """topo -m rows by GPU: the cells of the GPU columns, then CPU and NUMA affinity."""
    rows = out.split("\n\nLegend:")[0].splitlines()
    assert rows[0].startswith("\t\x1b[4mGPU0\t") and rows[0].endswith("GPU NUMA ID\x1b[0m")
    head = rows[0].replace("\x1b[4m", "").replace("\x1b[0m", "").split("\t")
    assert head[0] == "" and head[-3:] == ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"]
    return {r.split("\t")[0]: r.split("\t")[1:] for r in rows[1:]}


@pytest.mark.parametrize("profile_name", ["h100-80gb-x8"])
def test_topo_matrix_nvswitch_node(nvml: Any, capsys: Any) -> None:
    """DGX H100: every pair NV18 through the four NVSwitches, as the real nvidia-smi shows."""
    code, out = smi(capsys, "topo", "-m")
    assert code == 0
    m = _matrix(out)
    assert list(m) == [f"GPU{i}" for i in range(8)]
    for i in range(8):
        assert m[f"GPU{i}"][:8] == ["NV18" if j != i else " X " for j in range(8)]
    assert m["GPU0"][8:] == ["0-55,112-167", "0", "", "N/A"]
    assert m["GPU7"][8:10] == ["56-111,168-223", "1"]
    assert "  NV#  = Connection traversing a bonded set of # NVLinks" in out


@pytest.mark.parametrize("profile_name", ["a100-sxm4-40gb-x16"])
def test_topo_matrix_pair_node(nvml: Any, capsys: Any) -> None:
    """GPU-to-GPU pairs: NV12 within a pair, the PCIe path to every other GPU."""
    _, out = smi(capsys, "topo", "-m")
    m = _matrix(out)
    assert m["GPU0"][:4] == [" X ", "NV12", "NODE", "NODE"]
    assert m["GPU0"][8] == "SYS" and m["GPU9"][8] == "NV12"


@pytest.mark.parametrize("profile_name", ["t4-x2"])
def test_topo_matrix_without_nvlink(nvml: Any, capsys: Any) -> None:
    _, out = smi(capsys, "topo", "-m")
    assert _matrix(out)["GPU1"][:2] == ["NODE", " X "]


def test_without_a_driver(mock_lib: Path, tmp_path: Path) -> None:
    env = mock.env("t4-x2", tmp_path, library=mock_lib)
    env[mock.ENV_PROFILE] = str(tmp_path / "none.yaml")
    r = subprocess.run([sys.executable, "-m", "gpukit.lab.nvidia_smi", "-L"], env=env,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 9
    assert "couldn't communicate with the NVIDIA driver" in r.stdout


def test_runs_as_a_program_against_libnvidia_ml(nvml_env: dict[str, str]) -> None:
    """Unchanged pynvml in a fresh process, finding libnvidia-ml.so.1 by the library path."""
    r = subprocess.run([sys.executable, "-m", "gpukit.lab.nvidia_smi", "-L", "-i", "2"],
                       env=nvml_env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("GPU 2: NVIDIA A100-SXM4-40GB (UUID: GPU-")


def test_compute_mode_set_by_uuid_and_read_back_in_another_process(
        nvml: Any, nvml_env: dict[str, str], capsys: Any) -> None:
    """`nvidia-smi -i <uuid> -c EXCLUSIVE_PROCESS`, as NVIDIA's mps-control-daemon runs it; the
    mode is the node's (the state file), so a fresh process reads it back, then DEFAULT again."""
    uuid = nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(1))
    code, out = smi(capsys, "-i", uuid, "-c", "EXCLUSIVE_PROCESS")
    assert code == 0, out
    assert re.match(r"Set compute mode to EXCLUSIVE_PROCESS for GPU [0-9A-F:.]+\.\nAll done\.",
                    out), out

    def query() -> list[str]:
        r = subprocess.run([sys.executable, "-m", "gpukit.lab.nvidia_smi",
                            "--query-gpu=index,compute_mode", "--format=csv,noheader"],
                           env=nvml_env, capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        return r.stdout.splitlines()[:3]

    assert query() == ["0, Default", "1, Exclusive_Process", "2, Default"]
    assert smi(capsys, "-i", "1", "-c", "0")[0] == 0
    assert query()[1] == "1, Default"
    code, out = smi(capsys, "-i", "1", "-c", "BOGUS")
    assert code != 0 and "Invalid compute mode" in out


def test_the_binary_lists_as_the_script_does_through_libnvidia_ml(
        nvml: Any, ctl: MockControl, nvml_env: dict[str, str], capsys: Any,
        tmp_path: Path) -> None:
    """The package's nvidia-smi is a program loading libnvidia-ml.so.1 by soname (it runs in a
    container with the driver's files and no Python): its -L is the script's, MIG devices
    included; any other command line goes to <lab dir>/nvidia_smi.py with python3."""
    _mig_node(nvml, ctl)
    lab = tmp_path / "lab"
    lab.mkdir()
    (lab / "nvidia_smi.py").write_text("import sys; print('SCRIPT', sys.argv[1:])\n")
    binary = nvidia_smi_bin.build(tmp_path / "bin", str(lab))
    r = subprocess.run([str(binary), "-L"], env=nvml_env, capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r.stderr
    assert r.stdout == smi(capsys, "-L")[1]
    assert "  MIG 3g.20gb     Device  1: (UUID: MIG-" in r.stdout
    r = subprocess.run([str(binary), "--query-gpu=index", "-i", "0"], env=nvml_env,
                       capture_output=True, text=True, timeout=30)
    assert r.stdout == "SCRIPT ['--query-gpu=index', '-i', '0']\n"
    cache = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    if "libnvidia-ml.so.1 " not in cache:  # a host with a driver would find its library
        env = {**nvml_env, "LD_LIBRARY_PATH": str(tmp_path)}
        r = subprocess.run([str(binary), "-L"], env=env, capture_output=True, text=True,
                           timeout=30)
        assert r.returncode == 12 and "couldn't find libnvidia-ml.so" in r.stdout
