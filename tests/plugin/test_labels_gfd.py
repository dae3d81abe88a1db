"""The labels GFD v0.20 writes beyond the resource basics, and the values it gives them.

Expected values are derived from NVIDIA/k8s-device-plugin v0.20.0 (gpu-feature-discovery):
internal/lm/nvml.go (gpu.mode, mps.capable), internal/lm/machine-type.go (gpu.machine),
internal/lm/vgpu.go with internal/vgpu/{vgpu,pciutil}.go (vgpu.*), internal/lm/resource.go
(baseLabeler: per-resource replicas and sharing-strategy, getProductName/sanitise) and
internal/lm/mig-strategy.go (newGPULabelers, newInvalidMigStrategyLabeler), internal/lm/imex.go
(gpu.clique), plus go-nvlib's pkg/nvpci/nvpci.go (what GetPCIClass reads from sysfs) and
pkg/nvlib/device/device.go (IsFabricAttached). A fake sysfs tree stands in for /sys.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

import pytest
from plugin_testlib import T4, cfg, make_gpu, make_inventory

from gpukit.contracts import label_names as ln
from gpukit.plugin.devices import (
    FABRIC_STATE_COMPLETED,
    FABRIC_STATE_IN_PROGRESS,
    Fabric,
    Gpu,
    NodeDevices,
)
from gpukit.plugin.labels import (
    SYSFS_ROOT_ENV,
    clique_labels,
    compute_labels,
    gfd_sanitise,
    label_changes,
    owned,
)

COMPUTE = "0x030200"  # 3D controller: nvpci.PCI3dControllerClass
GRAPHICS = "0x030000"  # VGA controller: nvpci.PCIVgaControllerClass
RESOURCE_LINES = (
    "0x00000000f2000000 0x00000000f2ffffff 0x0000000000040200\n"
    "0x0000038000000000 0x0000038fffffffff 0x000000000014220c\n"
    "0x0000000000000000 0x0000000000000000 0x0000000000000000\n"
)


def pci_config(vgpu: bool = False, host_record: bool = True) -> bytes:
    """A 256-byte PCI config space: capability list power management (0x40) -> vendor
    specific (0x60). With `vgpu`, the vendor capability has the "VF" signature and a host
    driver record (id 0) with a 10-byte version and a 10-byte branch."""
    cfg_space = bytearray(256)
    cfg_space[0:2] = b"\xde\x10"
    cfg_space[0x06] = 0x10  # status: capability list present
    cfg_space[0x34] = 0x40
    cfg_space[0x40:0x43] = bytes([0x01, 0x60, 0x08])
    if vgpu:
        record = (bytes([0x00, 0x16]) + b"550.54.15".ljust(10, b"\0")
                  + b"r550_00".ljust(10, b"\0")) if host_record else bytes([0x07, 0x00])
        cap = bytes([0x09, 0x00, 5 + len(record)]) + b"VF" + record
    else:
        cap = bytes([0x09, 0x00, 0x08, 0x01, 0x02, 0x00, 0x00, 0x00])
    cfg_space[0x60:0x60 + len(cap)] = cap
    return bytes(cfg_space)


def add_pci(root: Path, bus_id: str, pci_class: str | None = COMPUTE, vendor: str = "0x10de",
            config: bytes | None = None, skip: tuple[str, ...] = ()) -> Path:
    """One function under <root>/bus/pci/devices as sysfs shows it."""
    dev = root / "bus/pci/devices" / bus_id
    dev.mkdir(parents=True)
    files = {"vendor": f"{vendor}\n", "device": "0x20b0\n", "numa_node": "-1\n",
             "resource": RESOURCE_LINES}
    if pci_class is not None:
        files["class"] = f"{pci_class}\n"
    for name, text in files.items():
        if name not in skip:
            (dev / name).write_text(text)
    (dev / "config").write_bytes(pci_config() if config is None else config)
    return dev


def bus(gpu_index: int) -> str:
    """The PCI bus id plugin_testlib.make_gpu gives GPU `gpu_index`."""
    return f"0000:{gpu_index + 7:02x}:00.0"


def set_product_name(root: Path, text: str) -> None:
    path = root / "class/dmi/id/product_name"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    root = tmp_path / "sys"
    (root / "bus/pci/devices").mkdir(parents=True)
    return root


def labels_for(inv: NodeDevices, root: Path, doc: Mapping[str, object] | None = None
               ) -> dict[str, str]:
    return compute_labels(inv, cfg(dict(doc) if doc else None), str(root))


def t4s(root: Path, *classes: str) -> NodeDevices:
    for i, pci_class in enumerate(classes):
        add_pci(root, bus(i), pci_class)
    return make_inventory([make_gpu(i, T4) for i in range(len(classes))])


# -- gpu.machine (lm/machine-type.go) ---------------------------------------------------------


@pytest.mark.parametrize(("product_name", "expected"), [
    ("PowerEdge R750xa\n", "PowerEdge-R750xa"),
    ("Standard PC (Q35 + ICH9, 2009)\n", "Standard-PC-Q35-ICH9-2009"),
    # sanitise drops '/' (label_value would have made it '-')
    ("ProLiant DL380 Gen10/Plus\n", "ProLiant-DL380-Gen10Plus"),
    ("  DGX   H100 \n", "DGX-H100"),
    ("\n", ""),  # TrimSpace then sanitise of an empty name: an empty value
])
def test_machine_is_the_sanitised_dmi_product_name(sysfs: Path, product_name: str,
                                                   expected: str) -> None:
    set_product_name(sysfs, product_name)
    assert labels_for(t4s(sysfs, COMPUTE), sysfs)[ln.GPU_MACHINE] == expected


def test_machine_unknown_without_dmi(sysfs: Path) -> None:
    # getMachineType fails to read the file: newMachineTypeLabeler writes "unknown"
    assert labels_for(t4s(sysfs, COMPUTE), sysfs)[ln.GPU_MACHINE] == "unknown"


def test_gfd_sanitise() -> None:
    assert gfd_sanitise("NVIDIA GeForce RTX 4090 (Laptop)") == "NVIDIA-GeForce-RTX-4090-Laptop"
    assert gfd_sanitise("a+b\tc") == "abc"


# -- gpu.mode (lm/nvml.go newGPUModeLabeler, nvpci GetGPUByPciBusID) --------------------------


def test_mode_compute(sysfs: Path) -> None:
    assert labels_for(t4s(sysfs, COMPUTE, COMPUTE), sysfs)[ln.GPU_MODE] == "compute"


def test_mode_graphics(sysfs: Path) -> None:
    assert labels_for(t4s(sysfs, GRAPHICS, GRAPHICS), sysfs)[ln.GPU_MODE] == "graphics"


def test_mode_mixed_classes_unknown(sysfs: Path) -> None:
    # getModeForClasses: "Not all GPU devices belong to the same class" -> unknown
    assert labels_for(t4s(sysfs, COMPUTE, GRAPHICS), sysfs)[ln.GPU_MODE] == "unknown"


@pytest.mark.parametrize("missing", ["class", "vendor", "device", "numa_node", "resource"])
def test_mode_unknown_when_nvpci_cannot_read_a_gpu(sysfs: Path, missing: str) -> None:
    # nvpci reads vendor, class, device, numa_node and resource; any failing read is an error
    # from GetPCIClass, and newGPUModeLabeler then writes "unknown"
    add_pci(sysfs, bus(0), COMPUTE)
    add_pci(sysfs, bus(1), COMPUTE, skip=(missing,))
    inv = make_inventory([make_gpu(0, T4), make_gpu(1, T4)])
    assert labels_for(inv, sysfs)[ln.GPU_MODE] == "unknown"


def test_mode_unknown_without_the_pci_device(sysfs: Path) -> None:
    # the lab's mock GPUs have no PCI function under /sys: GFD's read fails
    inv = make_inventory([make_gpu(0, T4)])
    assert labels_for(inv, sysfs)[ln.GPU_MODE] == "unknown"


def test_mode_unknown_for_a_non_gpu_class(sysfs: Path) -> None:
    # 0x030001 is neither the VGA nor the 3D controller class nvpci compares with
    assert labels_for(t4s(sysfs, "0x030001"), sysfs)[ln.GPU_MODE] == "unknown"


def test_mode_reads_mig_enabled_gpus_too(sysfs: Path) -> None:
    # GetDevices lists full GPUs, MIG mode on or off; each is read from sysfs
    add_pci(sysfs, bus(0), GRAPHICS)
    add_pci(sysfs, bus(1), GRAPHICS)
    inv = make_inventory([make_gpu(0, migs=("3g.20gb",)), make_gpu(1)])
    labels = labels_for(inv, sysfs, {"flags": {"migStrategy": "mixed"}})
    assert labels[ln.GPU_MODE] == "graphics"


def test_mode_follows_the_env_root(sysfs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inv = t4s(sysfs, GRAPHICS)
    monkeypatch.setenv(SYSFS_ROOT_ENV, str(sysfs))
    assert compute_labels(inv, cfg())[ln.GPU_MODE] == "graphics"  # the manager's call


# -- vgpu.* (lm/vgpu.go, vgpu/vgpu.go, vgpu/pciutil.go) ---------------------------------------


def test_vgpu_absent(sysfs: Path) -> None:
    add_pci(sysfs, "0000:00:01.0", "0x060000", vendor="0x8086")  # not NVIDIA: not read
    labels = labels_for(t4s(sysfs, COMPUTE), sysfs)
    assert labels[ln.VGPU_PRESENT] == "false"
    assert ln.VGPU_HOST_DRIVER_VERSION not in labels


def test_vgpu_present_with_host_driver(sysfs: Path) -> None:
    add_pci(sysfs, bus(0), COMPUTE, config=pci_config(vgpu=True))
    labels = labels_for(make_inventory([make_gpu(0, T4)]), sysfs)
    assert labels[ln.VGPU_PRESENT] == "true"
    assert labels[ln.VGPU_HOST_DRIVER_VERSION] == "550.54.15"
    assert labels[ln.VGPU_HOST_DRIVER_BRANCH] == "r550_00"


def test_vgpu_without_host_driver_record(sysfs: Path) -> None:
    add_pci(sysfs, bus(0), COMPUTE, config=pci_config(vgpu=True, host_record=False))
    labels = labels_for(make_inventory([make_gpu(0, T4)]), sysfs)
    assert labels[ln.VGPU_PRESENT] == "true"
    assert ln.VGPU_HOST_DRIVER_VERSION not in labels


def test_vgpu_capability_loop_is_not_a_vgpu(sysfs: Path) -> None:
    config = bytearray(pci_config())
    config[0x41] = 0x40  # the power management capability points to itself
    add_pci(sysfs, bus(0), COMPUTE, config=bytes(config))
    assert labels_for(make_inventory([make_gpu(0, T4)]), sysfs)[ln.VGPU_PRESENT] == "false"


def test_no_vgpu_label_when_config_space_is_truncated(sysfs: Path) -> None:
    # Without CAP_SYS_ADMIN sysfs gives 64 bytes of config: GetVendorSpecificCapability fails,
    # the vGPU labeler logs it and returns no labels
    add_pci(sysfs, bus(0), COMPUTE, config=pci_config()[:64])
    labels = labels_for(make_inventory([make_gpu(0, T4)]), sysfs)
    assert ln.VGPU_PRESENT not in labels
    assert labels[ln.GPU_MODE] == "compute"  # the mode is read without the config space


def test_no_vgpu_label_without_pci_devices(tmp_path: Path) -> None:
    labels = labels_for(make_inventory([make_gpu(0, T4)]), tmp_path / "no-sys")
    assert ln.VGPU_PRESENT not in labels
    assert labels[ln.GPU_MACHINE] == labels[ln.GPU_MODE] == "unknown"


def test_gpu_less_node_gets_only_vgpu_present(sysfs: Path) -> None:
    # NewLabelers merges the device labeler (empty without devices) with the vGPU labeler
    assert labels_for(NodeDevices(), sysfs) == {ln.VGPU_PRESENT: "false"}


# -- per-resource sharing-strategy and replicas (lm/resource.go, lm/mig-strategy.go) ----------

MIXED = {"migStrategy": "mixed"}


def test_sharing_strategy_is_per_resource(sysfs: Path) -> None:
    # Only mig-1g.5gb is time-sliced: baseLabeler gives it time-slicing, every other resource
    # (replicas 1) none
    inv = make_inventory([make_gpu(0, migs=("3g.20gb", "1g.5gb", "1g.5gb")), make_gpu(1)])
    doc = {"flags": MIXED, "sharing": {"timeSlicing": {"resources": [
        {"name": "nvidia.com/mig-1g.5gb", "replicas": 4}]}}}
    labels = labels_for(inv, sysfs, doc)
    assert labels["nvidia.com/gpu.sharing-strategy"] == "none"
    assert labels["nvidia.com/gpu.replicas"] == "1"
    assert labels["nvidia.com/mig-1g.5gb.sharing-strategy"] == "time-slicing"
    assert labels["nvidia.com/mig-1g.5gb.replicas"] == "4"
    assert labels["nvidia.com/mig-1g.5gb.product"] == "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb-SHARED"
    assert labels["nvidia.com/mig-3g.20gb.sharing-strategy"] == "none"
    assert labels["nvidia.com/mig-3g.20gb.replicas"] == "1"


def test_time_sliced_gpu_strategy(sysfs: Path) -> None:
    doc = {"sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 4}]}}}
    labels = labels_for(make_inventory([make_gpu(0, T4)]), sysfs, doc)
    assert labels["nvidia.com/gpu.sharing-strategy"] == "time-slicing"


def test_single_strategy_sharing_of_the_mig_resource(sysfs: Path) -> None:
    inv = make_inventory([make_gpu(i, migs=("3g.20gb", "3g.20gb")) for i in range(2)])
    doc = {"flags": {"migStrategy": "single"},
           "sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 2}]}}}
    labels = labels_for(inv, sysfs, doc)
    assert labels["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    assert labels["nvidia.com/gpu.replicas"] == "2"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb-SHARED"


@pytest.mark.parametrize("strategy", ["none", "mixed"])
def test_mig_enabled_gpus_have_replicas_zero(sysfs: Path, strategy: str) -> None:
    # newGPULabelers labels MIG-enabled GPUs with NewGPUResourceLabelerWithoutSharing (nil
    # config): replicas 0, sharing-strategy none, no -SHARED, whatever the MIG strategy
    inv = make_inventory([make_gpu(i, migs=("3g.20gb", "3g.20gb")) for i in range(2)])
    doc = {"flags": {"migStrategy": strategy},
           "sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 4}]}}}
    labels = labels_for(inv, sysfs, doc)
    assert labels["nvidia.com/gpu.replicas"] == "0"
    assert labels["nvidia.com/gpu.sharing-strategy"] == "none"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB"
    assert labels["nvidia.com/gpu.count"] == "2"


def test_full_gpus_override_mig_enabled_ones_under_none(sysfs: Path) -> None:
    # the full GPUs' labelers come after the MIG-enabled ones and override the same keys
    inv = make_inventory([make_gpu(0, migs=("3g.20gb",)), make_gpu(1), make_gpu(2)])
    doc = {"sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 4}]}}}
    labels = labels_for(inv, sysfs, doc)
    assert labels["nvidia.com/gpu.replicas"] == "4"
    assert labels["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    assert labels["nvidia.com/gpu.count"] == "3"


def test_invalid_single_layout_has_empty_sharing_strategy(sysfs: Path) -> None:
    # newInvalidMigStrategyLabeler: product ...-MIG-INVALID, count/replicas/memory 0 and
    # sharing-strategy "" (present, empty)
    inv = make_inventory([make_gpu(0, migs=("3g.20gb", "1g.5gb"))])
    labels = labels_for(inv, sysfs, {"flags": {"migStrategy": "single"}})
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB-MIG-INVALID"
    assert labels["nvidia.com/gpu.sharing-strategy"] == ""
    assert labels["nvidia.com/gpu.replicas"] == "0"
    assert labels["nvidia.com/gpu.memory"] == "0"


def test_media_extension_profile_product(sysfs: Path) -> None:
    # nvml-mig-device.go GetName: the profile with '+' as '.', so 1g.5gb+me -> 1g.5gb.me
    gpu = make_gpu(0, migs=("1g.5gb",))
    me = dataclasses.replace(gpu.mig_devices[0], profile="1g.5gb+me")
    inv = make_inventory([dataclasses.replace(gpu, mig_devices=(me,))])
    labels = labels_for(inv, sysfs, {"flags": MIXED})
    assert labels["nvidia.com/mig-1g.5gb.me.product"] == "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb.me"
    assert labels["nvidia.com/mig-1g.5gb.me.sharing-strategy"] == "none"


def test_product_is_sanitised_as_gfd(sysfs: Path) -> None:
    gpu: Gpu = dataclasses.replace(make_gpu(0, T4), name="Quadro RTX 6000/8000 (rev a)")
    labels = labels_for(make_inventory([gpu]), sysfs)
    assert labels["nvidia.com/gpu.product"] == "Quadro-RTX-60008000-rev-a"


def test_mps_capable_false(sysfs: Path) -> None:
    # newSharingLabeler: false unless the sharing strategy is MPS (gpukit refuses MPS)
    assert labels_for(t4s(sysfs, COMPUTE), sysfs)[ln.MPS_CAPABLE] == "false"


# -- ownership: what no longer applies is removed --------------------------------------------


def test_new_labels_are_owned_and_removed() -> None:
    for name in (ln.GPU_MODE, ln.GPU_MACHINE, ln.VGPU_PRESENT, ln.VGPU_HOST_DRIVER_VERSION,
                 ln.VGPU_HOST_DRIVER_BRANCH, "nvidia.com/gpu.sharing-strategy",
                 "nvidia.com/mig-1g.5gb.sharing-strategy",
                 "nvidia.com/mig-1g.5gb.me.sharing-strategy"):
        assert owned(name), name
    current = {"nvidia.com/mig-1g.5gb.sharing-strategy": "none", ln.GPU_MODE: "compute",
               ln.VGPU_HOST_DRIVER_VERSION: "550.54.15", ln.GPU_PRESENT: "true"}
    assert label_changes(current, {ln.GPU_MODE: "compute"}) == {
        "nvidia.com/mig-1g.5gb.sharing-strategy": None, ln.VGPU_HOST_DRIVER_VERSION: None}


def test_every_label_of_a_gfd_node(sysfs: Path) -> None:
    """The full set GFD writes for two compute-mode T4s on a DMI-named host (no timestamp)."""
    set_product_name(sysfs, "PowerEdge R740\n")
    labels = labels_for(t4s(sysfs, COMPUTE, COMPUTE), sysfs)
    assert labels == {
        "nvidia.com/cuda.driver-version.full": "550.54.15",
        "nvidia.com/cuda.driver-version.major": "550",
        "nvidia.com/cuda.driver-version.minor": "54",
        "nvidia.com/cuda.driver-version.revision": "15",
        "nvidia.com/cuda.driver.major": "550",
        "nvidia.com/cuda.driver.minor": "54",
        "nvidia.com/cuda.driver.rev": "15",
        "nvidia.com/cuda.runtime-version.full": "12.4",
        "nvidia.com/cuda.runtime-version.major": "12",
        "nvidia.com/cuda.runtime-version.minor": "4",
        "nvidia.com/cuda.runtime.major": "12",
        "nvidia.com/cuda.runtime.minor": "4",
        "nvidia.com/gpu.compute.major": "7",
        "nvidia.com/gpu.compute.minor": "5",
        "nvidia.com/gpu.count": "2",
        "nvidia.com/gpu.family": "turing",
        "nvidia.com/gpu.machine": "PowerEdge-R740",
        "nvidia.com/gpu.memory": "15360",
        "nvidia.com/gpu.mode": "compute",
        "nvidia.com/gpu.product": "Tesla-T4",
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/mig.capable": "false",
        "nvidia.com/mps.capable": "false",
        "nvidia.com/vgpu.present": "false",
    }


# ---- gpu.clique (lm/imex.go getFabricIDs, go-nvlib IsFabricAttached) ----
CLUSTER_A = "6f1c2a9e-3b7d-4e58-a0c4-9d21e5b7f360"
CLUSTER_B = "0b4e2f6a-9c1d-4a7e-8f35-2d6c9e1a7b40"
NIL = "00000000-0000-0000-0000-000000000000"


def _fabric_gpus(*fabrics: Fabric | None) -> list[Gpu]:
    return [dataclasses.replace(make_gpu(i), fabric=f) for i, f in enumerate(fabrics)]


@pytest.mark.parametrize(("fabrics", "expected"), [
    # every GPU in one clique: the label
    ((Fabric(CLUSTER_A, 32766), Fabric(CLUSTER_A, 32766)), f"{CLUSTER_A}.32766"),
    # GPUs not attached are left out of the count, whatever they report
    ((Fabric(CLUSTER_A, 7), None, Fabric(CLUSTER_B, 9, state=FABRIC_STATE_IN_PROGRESS),
      Fabric(CLUSTER_B, 9, status=3), Fabric(NIL, 9)), f"{CLUSTER_A}.7"),
    # two cliques, or two clusters, among the attached GPUs: no label
    ((Fabric(CLUSTER_A, 1), Fabric(CLUSTER_A, 2)), None),
    ((Fabric(CLUSTER_A, 1), Fabric(CLUSTER_B, 1)), None),
    # nothing attached: registration not done, failed, a nil cluster, no fabric at all
    ((Fabric(CLUSTER_A, 1, state=FABRIC_STATE_IN_PROGRESS),), None),
    ((Fabric(CLUSTER_A, 1, state=FABRIC_STATE_COMPLETED, status=999),), None),
    ((Fabric(NIL, 1),), None),
    ((None, None), None),
])
def test_clique_label_follows_gfd(fabrics: tuple[Fabric | None, ...], expected: str | None
                                  ) -> None:
    gpus = _fabric_gpus(*fabrics)
    assert clique_labels(gpus) == ({ln.GPU_CLIQUE: expected} if expected else {})
    labels = compute_labels(NodeDevices(gpus=tuple(gpus)), cfg(), sysfs_root="/nonexistent")
    assert labels.get(ln.GPU_CLIQUE) == expected


def test_clique_label_is_owned_and_removed_when_it_no_longer_applies() -> None:
    assert owned(ln.GPU_CLIQUE)
    assert label_changes({ln.GPU_CLIQUE: f"{CLUSTER_A}.1"}, {}) == {ln.GPU_CLIQUE: None}
