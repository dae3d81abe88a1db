"""The node's CDI spec carries what nvidia-ctk's does (control nodes, the driver's files as
read-only binds, NVIDIA_VISIBLE_DEVICES=void, MIG caps nodes, `all` with every device), and the
lab's nvidia-container-runtime in CDI mode injects exactly that into a container."""

from __future__ import annotations

from pathlib import Path

import yaml

from gpukit.lab import driver_surface as ds
from gpukit.lab.runtime import nvidia_container_runtime as ncr
from gpukit.plugin.inventory import Gpu, Inventory, MigDevice
from gpukit.provision import cdi

LIB = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"


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


def test_node_spec_is_shaped_like_nvidias_and_the_runtime_injects_it(tmp_path: Path) -> None:
    mig = MigDevice(uuid="MIG-11111111-0000-0000-0000-000000000000", parent_uuid=_gpu(0).uuid,
                    parent_index=0, index=0, gi=2, ci=0, profile="3g.20gb", memory_mb=19968)
    inv = Inventory(gpus=(_gpu(0, (mig,)), _gpu(1)))
    present = {"/dev/nvidiactl", "/dev/nvidia-uvm", LIB, "/usr/bin/nvidia-smi"}
    spec = cdi.build(inv, exists=present.__contains__, proc_root=_proc(tmp_path, 0, 2, 0))
    edits = spec["containerEdits"]
    assert edits["env"] == ["NVIDIA_VISIBLE_DEVICES=void"]
    assert edits["deviceNodes"] == [{"path": "/dev/nvidiactl"}, {"path": "/dev/nvidia-uvm"}]
    assert edits["mounts"] == [
        {"hostPath": LIB, "containerPath": LIB, "options": ["ro", "nosuid", "nodev", "bind"]},
        {"hostPath": "/usr/bin/nvidia-smi", "containerPath": "/usr/bin/nvidia-smi",
         "options": ["ro", "nosuid", "nodev", "bind"]}]
    gi, ci = ds.caps_minor(0, 2), ds.caps_minor(0, 2, 0)
    caps = [f"/dev/nvidia-caps/nvidia-cap{gi}", f"/dev/nvidia-caps/nvidia-cap{ci}"]
    by_name = {d["name"]: d["containerEdits"]["deviceNodes"] for d in spec["devices"]}
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
    oci = {"process": {"env": ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=MIG-11111111-0000-0000-0000-000000000000"]},
           "mounts": [], "linux": {}}
    mode, _, _ = ncr.modify(oci, ncr.Config(mode="cdi", spec_dirs=(str(spec_dir),)), host)
    assert mode == "cdi"
    assert [d["path"] for d in oci["linux"]["devices"]] == [
        "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia0", *caps]
    assert oci["process"]["env"][-1] == "NVIDIA_VISIBLE_DEVICES=void"
    assert [m["destination"] for m in oci["mounts"]] == [LIB, "/usr/bin/nvidia-smi"]
