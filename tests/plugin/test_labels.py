"""GFD-compatible labels: names from label_names, values valid label values."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from plugin_testlib import A100, T4, cfg, make_gpu, make_inventory

from gpukit.contracts import label_names as ln
from gpukit.plugin.devices import NodeDevices
from gpukit.plugin.labels import (
    SYSFS_ROOT_ENV,
    compute_labels,
    label_changes,
    label_value,
    write_labels_file,
)

VALID_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
VALID_NAME = re.compile(r"^[a-z0-9.-]+/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


@pytest.fixture(autouse=True)
def empty_sysfs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Host files come from an empty sysfs tree, not this machine's /sys."""
    root = tmp_path / "sys"
    (root / "bus/pci/devices").mkdir(parents=True)
    monkeypatch.setenv(SYSFS_ROOT_ENV, str(root))
    return root


def check_valid(labels: dict[str, str]) -> None:
    for k, v in labels.items():
        assert VALID_NAME.match(k) and len(k.split("/")[1]) <= 63, k
        assert VALID_VALUE.match(v) and len(v) <= 63, (k, v)


def test_full_gpus_t4() -> None:
    labels = compute_labels(make_inventory([make_gpu(0, T4), make_gpu(1, T4)]), cfg())
    check_valid(labels)
    assert labels["nvidia.com/gpu.product"] == "Tesla-T4"
    assert labels["nvidia.com/gpu.count"] == "2"
    assert labels["nvidia.com/gpu.replicas"] == "1"
    assert labels["nvidia.com/gpu.memory"] == "15360"
    assert labels["nvidia.com/gpu.family"] == "turing"
    assert (labels["nvidia.com/gpu.compute.major"], labels["nvidia.com/gpu.compute.minor"]) == (
        "7", "5")
    assert labels[ln.MIG_CAPABLE] == "false"
    assert labels[ln.SHARING_STRATEGY] == "none"
    assert labels[ln.GPU_MODE] == "unknown"  # no PCI function under the (empty) sysfs
    assert labels[ln.GPU_MACHINE] == "unknown"
    assert labels[ln.CUDA_DRIVER_MAJOR] == "550"
    assert labels[ln.CUDA_DRIVER_MINOR] == "54"
    assert labels[ln.CUDA_DRIVER_REVISION] == "15"
    assert labels[ln.CUDA_RUNTIME_MAJOR] == "12"
    assert labels[ln.CUDA_RUNTIME_MINOR] == "4"
    assert ln.MIG_STRATEGY not in labels


def test_time_sliced_product_is_shared() -> None:
    doc = {"sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 4}]}}}
    labels = compute_labels(make_inventory([make_gpu(0, T4)]), cfg(doc))
    assert labels["nvidia.com/gpu.product"] == "Tesla-T4-SHARED"
    assert labels["nvidia.com/gpu.replicas"] == "4"
    assert labels[ln.SHARING_STRATEGY] == "time-slicing"


def test_renamed_shared_product_has_no_suffix() -> None:
    doc = {"sharing": {"timeSlicing": {"renameByDefault": True,
                                       "resources": [{"name": "gpu", "replicas": 4}]}}}
    labels = compute_labels(make_inventory([make_gpu(0, T4)]), cfg(doc))
    assert labels["nvidia.com/gpu.product"] == "Tesla-T4"
    assert labels["nvidia.com/gpu.replicas"] == "4"


def test_mixed_mig_labels() -> None:
    inv = make_inventory([make_gpu(0, migs=("3g.20gb", "1g.5gb", "1g.5gb")), make_gpu(1)])
    labels = compute_labels(inv, cfg({"flags": {"migStrategy": "mixed"}}))
    check_valid(labels)
    assert labels[ln.MIG_STRATEGY] == "mixed"
    assert labels[ln.MIG_CAPABLE] == "true"
    assert labels["nvidia.com/mig-1g.5gb.count"] == "2"
    assert labels["nvidia.com/mig-1g.5gb.sharing-strategy"] == "none"
    assert labels["nvidia.com/mig-1g.5gb.product"] == "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"
    assert labels["nvidia.com/mig-1g.5gb.memory"] == "4864"
    assert labels["nvidia.com/mig-1g.5gb.multiprocessors"] == "14"
    assert labels["nvidia.com/mig-1g.5gb.slices.gi"] == "1"
    assert labels["nvidia.com/mig-3g.20gb.slices.ci"] == "3"
    assert labels["nvidia.com/mig-3g.20gb.engines.copy"] == "3"
    assert labels["nvidia.com/gpu.count"] == "2"  # GFD counts every GPU of the model
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB"


def test_single_mig_labels_and_invalid() -> None:
    inv = make_inventory([make_gpu(i, migs=("3g.20gb", "3g.20gb")) for i in range(2)])
    labels = compute_labels(inv, cfg({"flags": {"migStrategy": "single"}}))
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb"
    assert labels["nvidia.com/gpu.count"] == "4"
    assert labels["nvidia.com/gpu.memory"] == "19968"
    inv = make_inventory([make_gpu(0, migs=("3g.20gb", "1g.5gb"))])
    labels = compute_labels(inv, cfg({"flags": {"migStrategy": "single"}}))
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB-MIG-INVALID"
    assert labels["nvidia.com/gpu.count"] == "0"
    assert labels["nvidia.com/gpu.sharing-strategy"] == ""


def test_no_gpus_no_device_labels() -> None:
    # GFD writes only vgpu.present (lm/labeler.go: the vGPU labeler runs without devices)
    assert compute_labels(NodeDevices(), cfg()) == {ln.VGPU_PRESENT: "false"}


def test_label_value_sanitised() -> None:
    assert label_value("NVIDIA GeForce RTX 4090 (Laptop)") == "NVIDIA-GeForce-RTX-4090-Laptop"
    assert len(label_value("x" * 100)) == 63


def test_label_changes_removes_only_owned() -> None:
    current = {"nvidia.com/gpu.product": "Old", "nvidia.com/mig-1g.5gb.count": "7",
               "nvidia.com/device-plugin.config": "a", "kubernetes.io/hostname": "n1"}
    wanted = {"nvidia.com/gpu.product": A100.replace(" ", "-")}
    assert label_changes(current, wanted) == {
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB", "nvidia.com/mig-1g.5gb.count": None}


def test_labels_file(tmp_path: object) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "features.d" / "gpukit"
    write_labels_file({"nvidia.com/gpu.count": "2", "nvidia.com/a": "b"}, str(path))
    assert path.read_text() == "nvidia.com/a=b\nnvidia.com/gpu.count=2\n"
