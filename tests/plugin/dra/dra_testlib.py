"""Stand-ins for the DRA plugin's tests."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any


class FakeResourceApi:
    """resource.k8s.io/v1 ResourceSlices as the API server keeps them (by name)."""

    def __init__(self) -> None:
        self.slices: dict[str, dict[str, Any]] = {}
        self.writes = 0
        self.version = 0

    def list_resource_slice(self, field_selector: str, _preload_content: bool) -> Any:
        want = dict(kv.split("=") for kv in field_selector.split(","))
        items = [s for s in self.slices.values()
                 if s["spec"]["nodeName"] == want["spec.nodeName"]
                 and s["spec"]["driver"] == want["spec.driver"]]
        return SimpleNamespace(data=json.dumps({"items": items}))

    def _store(self, body: dict[str, Any]) -> None:
        self.version += 1
        body = json.loads(json.dumps(body))
        body["metadata"]["resourceVersion"] = str(self.version)
        self.slices[body["metadata"]["name"]] = body
        self.writes += 1

    def create_resource_slice(self, body: dict[str, Any], field_manager: str) -> None:
        assert body["metadata"]["name"] not in self.slices
        self._store(body)

    def replace_resource_slice(self, name: str, body: dict[str, Any], field_manager: str) -> None:
        assert self.slices[name]["metadata"]["resourceVersion"] == \
            body["metadata"]["resourceVersion"]
        self._store(body)

    def delete_resource_slice(self, name: str) -> None:
        del self.slices[name]
        self.writes += 1


def mig_and_whole_gpu_plugin(tmp_path: Any, monkeypatch: Any, **options: Any) -> Any:
    """A DRA plugin for node n1 with a MIG device (3g.20gb on GPU 0) and a whole GPU 1,
    publishing to a FakeResourceApi (`plugin.publisher.api`); `options`: more
    KubeletPluginOptions."""
    from plugin_testlib import make_gpu, make_inventory

    from gpukit.contracts.plugin_config import HealthSettings
    from gpukit.plugin.dra import kubelet_plugin as plugin_mod
    from gpukit.plugin.dra.slice_devices import Placement
    from gpukit.plugin.dra.slices import SlicePublisher

    gpu0 = make_gpu(0, migs=("3g.20gb",))
    node = make_inventory([gpu0, make_gpu(1)])
    monkeypatch.setattr(plugin_mod.nvml, "discover", lambda with_topology: node)
    monkeypatch.setattr(plugin_mod, "placements",
                        lambda devices, reader: {(gpu0.uuid, 1): Placement(4, 4)})
    opts = plugin_mod.KubeletPluginOptions(
        node="n1", plugin_dir=str(tmp_path / "plugin"), registry_dir=str(tmp_path / "reg"),
        cdi_dir=str(tmp_path / "cdi"), health=HealthSettings(recovery_seconds=None), **options)
    plugin = plugin_mod.DraKubeletPlugin(opts, api_client=None)
    plugin.publisher = SlicePublisher(None, "n1", api=FakeResourceApi())
    return plugin
