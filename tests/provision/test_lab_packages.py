"""The lab's stand-in NVIDIA packages and its local, signed apt repository."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from gpukit.lab.packages import catalog, deb, repo
from gpukit.provision import debversion

pytestmark = pytest.mark.skipif(
    not all(shutil.which(t) for t in ("dpkg-deb", "dpkg-scanpackages", "apt-ftparchive", "gpg")),
    reason="needs dpkg-dev, apt-utils and gnupg on the host",
)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, mock_lib: Path) -> Path:
    from gpukit.lab.packages import sources

    base = tmp_path_factory.mktemp("repo")
    src = sources()
    return repo.build(base / "apt", base / "state", catalog.Sources(mock_lib, src.nvidia_smi,
                                                                    src.pynvml))  # fmt: skip


@pytest.fixture(scope="session")
def mock_lib() -> Path:
    from gpukit.lab import nvml

    return nvml.build()


def control(deb_file: Path, field: str) -> str:
    return subprocess.run(["dpkg-deb", "-f", str(deb_file), field], capture_output=True,
                          text=True, check=True).stdout.strip()  # fmt: skip


def packages_index(path: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for stanza in path.read_text().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines()
                      if ": " in line and not line.startswith(" "))  # fmt: skip
        if "Package" in fields:
            out.setdefault(fields["Package"], []).append(fields["Version"])
    return {k: sorted(v, key=debversion.sort_key, reverse=True) for k, v in out.items()}


def test_repository_index_has_every_branch_and_is_signed(built: Path) -> None:
    index = packages_index(built / "Packages")
    assert index["nvidia-driver"] == ["570.86.15-1", "550.90.07-1"]
    assert index["nvidia-kernel-open-550"] == ["550.90.07-1"]
    assert index["nvidia-container-toolkit"] == ["1.17.4-1"]
    assert (built / "InRelease").read_text().startswith("-----BEGIN PGP SIGNED MESSAGE-----")
    assert "Suite: ./" in (built / "Release").read_text()
    assert (built / repo.KEY_NAME).read_text().startswith("-----BEGIN PGP PUBLIC KEY BLOCK-----")


def test_driver_package_owns_the_nvml_library_and_conflicts(built: Path, mock_lib: Path) -> None:
    pkg = built / "nvidia-driver-550_550.90.07-1_amd64.deb"
    files = subprocess.run(["dpkg-deb", "-c", str(pkg)], capture_output=True, text=True).stdout
    assert "./usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1" in files
    assert "./usr/bin/nvidia-smi" in files and "root/root" in files
    # MPS: both tools launch the stand-in that ships beside them (gpukit.lab.mps)
    assert "./usr/lib/nvidia/lab/mps_control.py" in files
    tar = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(pkg)], capture_output=True,
                         check=True).stdout  # fmt: skip
    for tool, role in (("nvidia-cuda-mps-control", "control"), ("nvidia-cuda-mps-server", "server")):
        assert f"./usr/bin/{tool}" in files
        assert f'sys.argv[1:1] = ["{role}"]'.encode() in tar
    # No shell: the launchers also run from a driver root mounted into a shell-less image.
    assert b"#!/bin/sh\n# nvidia-cuda-mps" not in tar and b"#!/usr/bin/python3 -I\n" in tar
    assert control(pkg, "Conflicts") == "nvidia-driver-binary"
    assert control(pkg, "Depends").startswith(
        "nvidia-kernel-open-550 (= 550.90.07-1) | nvidia-kernel-550 (= 550.90.07-1)"
    )
    meta = built / "nvidia-driver_570.86.15-1_amd64.deb"
    assert control(meta, "Depends") == "nvidia-driver-570 (= 570.86.15-1)"


def test_every_maintainer_script_can_be_made_to_fail(built: Path, tmp_path: Path) -> None:
    pkg = built / "nvidia-kernel-open-570_570.86.15-1_amd64.deb"
    subprocess.run(["dpkg-deb", "-e", str(pkg), str(tmp_path / "ctl")], check=True)
    postinst = (tmp_path / "ctl/postinst").read_text()
    assert "/etc/gpukit-lab/fail-postinst" in postinst
    assert "deb-systemd-helper enable nvidia-lab-module.service" in postinst
    broken = deb.Package(name="x", version="1-1", description="d", postinst_fails=True)
    assert "exit 1" in broken.script("postinst")
    assert "/etc/gpukit-lab/fail-prerm" in broken.script("prerm")


def test_rebuild_without_changes_keeps_the_repository(built: Path, mock_lib: Path) -> None:
    from gpukit.lab.packages import sources

    before = {p.name: p.stat().st_mtime_ns for p in built.iterdir()}
    src = sources()
    repo.build(built, built.parent / "state", catalog.Sources(mock_lib, src.nvidia_smi, src.pynvml))
    assert {p.name: p.stat().st_mtime_ns for p in built.iterdir()} == before


def test_packages_are_reproducible(tmp_path: Path, mock_lib: Path) -> None:
    from gpukit.lab.packages import sources

    src = sources()
    pkg = catalog.driver_packages(
        catalog.BRANCHES[0], catalog.Sources(mock_lib, src.nvidia_smi, src.pynvml)
    )[2]
    a = deb.build(pkg, tmp_path / "a").read_bytes()
    b = deb.build(pkg, tmp_path / "b").read_bytes()
    assert a == b
