"""The suite's MIG capability check (issue 13): the NVML probe reads the /dev/nvidia-caps minors
the driver lists for each MIG device, the fill pods list /dev/nvidia-caps, and a container must
see exactly the capability nodes of its MIG devices (none for a whole GPU or no GPU)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any

import pytest

from gpukit.conformance import host, nvml_probe
from gpukit.conformance import test_isolation as isolation
from gpukit.conformance.checks import Check
from gpukit.conformance.cluster import PodState
from gpukit.conformance.fill import NodeFill, Seen

MIG = "nvidia.com/mig-3g.20gb"
GPU = "nvidia.com/gpu"


def _access(path: Path, minor: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n")


def test_the_probe_reads_the_caps_the_driver_lists_for_a_mig_device(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    caps = tmp_path / "capabilities"
    _access(caps / "gpu0/mig/gi1/access", 12)
    _access(caps / "gpu0/mig/gi1/ci0/access", 13)
    _access(caps / "gpu0/mig/gi2/access", 21)  # another instance's: not this device's
    (caps / "gpu0/mig/gi3").mkdir(parents=True)
    (caps / "gpu0/mig/gi3/access").write_text("garbage\n")
    monkeypatch.setattr(nvml_probe, "CAPABILITIES", str(caps))
    assert nvml_probe._mig_caps(0, 1, 0) == [12, 13]
    assert nvml_probe._mig_caps(0, 3, 0) == []  # unreadable lines and missing files: none
    assert nvml_probe._mig_caps(1, 1, 0) == []


def _probe() -> host.NvmlSeen:
    migs = [{"uuid": f"MIG-{gi}", "gi": gi, "ci": 0, "gi_profile_id": 9, "start": 4 * (gi - 1),
             "size": 4, "memory_mib": 19968, "caps": [10 * gi + 2, 10 * gi + 3]}
            for gi in (1, 2)]
    return host.parse_probe({"ok": True, "driver_version": "550.90.07", "gpus": [
        {"index": 0, "uuid": "GPU-0", "name": "NVIDIA A100-SXM4-40GB", "minor": 0,
         "memory_mib": 40960, "mig_current": True, "mig_pending": True, "migs": migs},
        {"index": 1, "uuid": "GPU-1", "name": "NVIDIA A100-SXM4-40GB", "minor": 1,
         "memory_mib": 40960, "mig_current": False, "mig_pending": False, "migs": []}]})


def _seen(pod: str, resource: str, device: str, observed: str) -> Seen:
    s = Seen(pod, resource, 1, PodState(pod, "Running"), kubelet_ids=(device,))
    s.parse(observed)
    return s


def _run(seen: list[Seen]) -> Check:
    fill = NodeFill("gpu-a100", {MIG: 2, GPU: 1}, fillers={MIG: seen[:-1], GPU: seen[-1:]})
    suite = NS(fill=lambda _n: fill, probe=lambda _n: _probe(), shared_resources=lambda _n: set())
    for resource in (MIG, GPU):
        c = Check("gpu-a100", "isolation")
        isolation.test_containers_see_only_their_devices(suite, "gpu-a100", resource, c)
    return c


def _observed(dev: str, *caps: str, env: str = "") -> str:
    return "\n".join([f"DEV {dev}", "DEV nvidiactl", *(f"CAP {c}" for c in caps),
                      f"ENV {env}"])


def test_containers_with_exactly_their_caps_pass() -> None:
    _run([_seen("m1", MIG, "MIG-1", _observed("nvidia0", "nvidia-cap12", "nvidia-cap13",
                                              env="MIG-1")),
          _seen("m2", MIG, "MIG-2", _observed("nvidia0", "nvidia-cap22", "nvidia-cap23",
                                              env="MIG-2")),
          _seen("g", GPU, "GPU-1", _observed("nvidia1", env="GPU-1"))])


@pytest.mark.parametrize(("caps", "observed"), [
    ((), "[]"),  # the runtime or plugin passed none: the MIG device is unusable
    (("nvidia-cap12", "nvidia-cap13", "nvidia-cap22"),
     "[nvidia-cap12, nvidia-cap13, nvidia-cap22]"),  # another instance's too
])
def test_a_mig_container_without_its_caps_or_with_anothers_fails(
        caps: tuple[str, ...], observed: str) -> None:
    seen = [_seen("m1", MIG, "MIG-1", _observed("nvidia0", *caps, env="MIG-1")),
            _seen("m2", MIG, "MIG-2", _observed("nvidia0", "nvidia-cap22", "nvidia-cap23",
                                                env="MIG-2")),
            _seen("g", GPU, "GPU-1", _observed("nvidia1", env="GPU-1"))]
    with pytest.raises(pytest.fail.Exception) as exc:
        _run(seen)
    assert (f"node gpu-a100: {MIG}: pod m1: MIG capability nodes (/dev/nvidia-caps): expected "
            f"[nvidia-cap12, nvidia-cap13], observed {observed}") in str(exc.value)


def test_a_whole_gpu_container_with_caps_fails() -> None:
    seen: list[Any] = [
        _seen("m1", MIG, "MIG-1", _observed("nvidia0", "nvidia-cap12", "nvidia-cap13",
                                            env="MIG-1")),
        _seen("m2", MIG, "MIG-2", _observed("nvidia0", "nvidia-cap22", "nvidia-cap23",
                                            env="MIG-2")),
        _seen("g", GPU, "GPU-1", _observed("nvidia1", "nvidia-cap12", env="GPU-1"))]
    with pytest.raises(pytest.fail.Exception) as exc:
        _run(seen)
    assert (f"node gpu-a100: {GPU}: pod g: MIG capability nodes (/dev/nvidia-caps): expected "
            "[], observed [nvidia-cap12]") in str(exc.value)
