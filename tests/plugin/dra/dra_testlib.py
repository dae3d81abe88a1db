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
