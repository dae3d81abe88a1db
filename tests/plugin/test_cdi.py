"""CDI spec: devices by UUID and index, host paths under the device root, atomic writes."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from plugin_testlib import T4, cfg, gpu_uuid, make_gpu, make_inventory, mig_uuid

from gpukit.plugin.cdi import build_spec, write_spec
from gpukit.plugin.resources import build_resources


def test_spec_names_devices_by_uuid_and_index() -> None:
    inv = make_inventory([make_gpu(0, T4), make_gpu(1, migs=("3g.20gb",))])
    units = build_resources(inv, cfg({"flags": {"migStrategy": "mixed"}})).units()
    spec = build_spec(units.values(), "/srv/n1", ["/dev/nvidiactl"])
    assert spec["cdiVersion"] == "0.5.0" and spec["kind"] == "nvidia.com/gpu"
    names = [d["name"] for d in spec["devices"]]
    assert names == [gpu_uuid(0), "0", mig_uuid(1, 0), "1:0"]
    assert spec["devices"][2]["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia1", "hostPath": "/srv/n1/dev/nvidia1"}]
    assert spec["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidiactl", "hostPath": "/srv/n1/dev/nvidiactl"}]


def test_write_is_atomic_and_readable(tmp_path: Path) -> None:
    path = write_spec({"cdiVersion": "0.5.0"}, str(tmp_path / "cdi"))
    assert json.loads(path.read_text()) == {"cdiVersion": "0.5.0"}
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    write_spec({"cdiVersion": "0.6.0"}, str(tmp_path / "cdi"))
    assert os.listdir(tmp_path / "cdi") == [path.name]
