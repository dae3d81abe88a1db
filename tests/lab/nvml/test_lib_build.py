"""The library itself: built from source against the real nvml.h, exporting exactly the NVML
API (every function nvml.h declares) plus the gpukitMock* control entry points."""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path
from typing import Any

import pytest
from nvmltest import nvml_error

from gpukit.contracts import mig_profiles
from gpukit.lab.nvml import REPO_ROOT, build
from gpukit.lab.nvml import nvml_header as hdr
from gpukit.lab.nvml.gen_mig_tables import render

pytestmark = pytest.mark.nvml


def _dynsyms(lib: Path) -> set[str]:
    out = subprocess.run(
        ["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True
    ).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


def _dynamic(lib: Path) -> str:
    return subprocess.run(
        ["readelf", "-d", str(lib)], capture_output=True, text=True, check=True
    ).stdout


def test_exports_only_nvml_and_control_symbols(mock_lib: Path) -> None:
    syms = _dynsyms(mock_lib)
    assert "nvmlInitWithFlags" in syms and "gpukitMockInjectXid" in syms
    stray = sorted(s for s in syms if not s.startswith(("nvml", "gpukitMock")))
    assert stray == [], f"symbols leaked from the library: {stray}"


def test_every_function_of_nvml_h_exists(mock_lib: Path) -> None:
    header = (hdr.include_dir() / "nvml.h").read_text()
    declared = set(hdr.declared_functions(header)) | {"nvmlErrorString"}
    assert len(declared) > 300
    missing = declared - _dynsyms(mock_lib)
    assert not missing, f"declared in nvml.h but not exported: {sorted(missing)[:10]}"


def test_soname_link_and_dependencies(mock_lib: Path) -> None:
    dyn = _dynamic(mock_lib)
    assert "Library soname: [libnvidia-ml.so.1]" in dyn
    needed = {
        line.split("[", 1)[1].rstrip("]")
        for line in dyn.splitlines()
        if "(NEEDED)" in line
    }
    assert needed <= {"libc.so.6", "libyaml-0.so.2", "libpthread.so.0"}, needed
    link = mock_lib.parent / "libnvidia-ml.so"
    assert link.is_symlink() and link.resolve() == mock_lib.resolve()


def test_rebuild_is_a_noop_when_up_to_date(mock_lib: Path) -> None:
    before = mock_lib.stat().st_mtime_ns
    assert build() == mock_lib
    assert mock_lib.stat().st_mtime_ns == before


def test_unimplemented_entry_points_say_not_supported(nvml: Any) -> None:
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    nvml_error(nvml, nvml.NVML_ERROR_NOT_SUPPORTED, nvml.nvmlDeviceGetFanSpeed, h)
    nvml_error(nvml, nvml.NVML_ERROR_NOT_SUPPORTED, nvml.nvmlDeviceGetEncoderUtilization, h)
    nvml_error(nvml, nvml.NVML_ERROR_NOT_SUPPORTED, nvml.nvmlDeviceGetBAR1MemoryInfo, h)


def test_mig_header_is_checked_against_real_nvml_h(tmp_path: Path) -> None:
    """The generated C tables use the nvml.h constant names and assert their values: a table whose
    profile id disagrees with nvml.h does not compile."""
    good = render(mig_profiles.tables(), "test")
    assert "_Static_assert(NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1 == 7" in good
    assert '.name = "1g.5gb+me"' in good
    src = REPO_ROOT / "gpukit" / "lab" / "nvml" / "src"
    cc = ["cc", "-fsyntax-only", "-DNVML_NO_UNVERSIONED_FUNC_DEFS", f"-I{hdr.include_dir()}",
          f"-I{src}", f"-I{tmp_path}", "-x", "c", "-"]
    (tmp_path / "mig_tables.h").write_text(good)
    ok = subprocess.run(cc, input='#include "mig_tables.h"\n', capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr

    const = "NVML_GPU_INSTANCE_PROFILE_7_SLICE"
    text = mig_profiles.DATA_FILE.read_text().replace(
        f"{const}, profile_id: 4,", f"{const}, profile_id: 5,", 1
    )
    (tmp_path / "bad.yaml").write_text(text)
    (tmp_path / "mig_tables.h").write_text(render(mig_profiles.load(tmp_path / "bad.yaml"), "bad"))
    bad = subprocess.run(cc, input='#include "mig_tables.h"\n', capture_output=True, text=True)
    assert bad.returncode != 0
    assert "NVML_GPU_INSTANCE_PROFILE_7_SLICE is not 5" in bad.stderr


def test_library_loads_with_plain_ctypes(mock_lib: Path) -> None:
    lib = ctypes.CDLL(str(mock_lib))
    lib.nvmlErrorString.restype = ctypes.c_char_p
    assert lib.nvmlErrorString(15) == b"GPU is lost"
    assert lib.nvmlErrorString(23) == b"Insufficient resources"
