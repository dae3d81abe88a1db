"""The lab registry's configuration and the nodes' containerd side of it (gpukit.lab.registry);
tests/roles/test_collection_lab.py pushes to it and deploys the agent from it on the lab."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
import yaml

from gpukit.lab import registry
from gpukit.lab.config import load_spec

NODE_FILES = Path(registry.__file__).resolve().parent / "node"


@pytest.mark.parametrize("instance", ["0", "7"])
def test_each_lab_has_its_registry_on_its_bridge(monkeypatch: pytest.MonkeyPatch,
                                                 instance: str) -> None:  # fmt: skip
    monkeypatch.setenv("GPUKIT_LAB_INSTANCE", instance)
    lab = load_spec()
    host = f"10.244.{77 + int(instance)}.1:5000"
    assert registry.address(lab) == host
    cfg = yaml.safe_load(registry.config_text(lab, Path("/srv/r")))  # docker-registry reads YAML
    assert cfg["http"]["addr"] == host and cfg["storage"]["filesystem"]["rootdirectory"] == "/srv/r"
    assert len(cfg["http"]["secret"]) == 32 and json.loads(registry.config_text(lab, Path("/x")))
    # containerd: one hosts.toml per registry host under the config_path the lab's configs set
    ((path, text),) = registry.node_files(lab).items()
    assert path == f"/etc/containerd/certs.d/{host}/hosts.toml"
    hosts = tomllib.loads(text)
    assert hosts == {"server": f"http://{host}",
                     "host": {f"http://{host}": {"capabilities": ["pull", "resolve"]}}}


@pytest.mark.parametrize(("version", "table"), [
    (3, 'plugins."io.containerd.cri.v1.images"'), (2, 'plugins."io.containerd.grpc.v1.cri"')])
def test_the_labs_containerd_configs_read_certs_d(version: int, table: str) -> None:
    doc = tomllib.loads((NODE_FILES / f"containerd-v{version}.toml").read_text())
    plugin = doc["plugins"][table.split('"')[1]]
    assert plugin["registry"]["config_path"] == registry.CERTS_D
