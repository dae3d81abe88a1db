"""The peer lab's pieces that need no cluster (gpukit.lab.peer): the inventory variant declares
the peer host not served by gpukit's node agent and stays valid, NVIDIA's DaemonSets run only
on that host with the config the inventory selects for it, and a wrong host is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpukit import inventory as inv
from gpukit.lab import peer
from gpukit.lab.config import LabConfigError, LabSpec, parse_nodes
from gpukit.lab.inventory import DRA_SETTING, LAB_INVENTORY

DEFAULT = "gpu-a100=a100-sxm4-40gb-x8,gpu-t4=t4-x2"


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LabSpec:
    monkeypatch.setenv("GPUKIT_LAB_DIR", str(tmp_path / "lab"))
    monkeypatch.delenv(DRA_SETTING, raising=False)
    monkeypatch.delenv(peer.PEER_SETTING, raising=False)
    return LabSpec(nodes=parse_nodes(DEFAULT), instance=0)


def test_the_peer_inventory_leaves_the_node_to_nvidia(lab: LabSpec) -> None:
    path = peer.inventory(lab)
    assert path != LAB_INVENTORY and not (LAB_INVENTORY / "host_vars").exists()
    host_vars = yaml.safe_load((path / "host_vars" / "gpu-t4.yml").read_text())
    assert host_vars == {"gpukit_node_agent": False}
    assert {d.node_name: d.node_agent for d in inv.load(path).nodes} == {
        "gpu-a100": True, "gpu-t4": False}
    assert not (path / "host_vars" / "gpu-a100.yml").exists()
    assert inv.check(path).problems == ()  # what the preflight runs: valid as declared
    # The config NVIDIA's plugin gets is the one the inventory selects for the node.
    config = peer.declared_config(path, "gpu-t4")
    t4 = yaml.safe_load((LAB_INVENTORY / "group_vars" / "t4_nodes.yml").read_text())
    every = yaml.safe_load((LAB_INVENTORY / "group_vars" / "gpu_nodes.yml").read_text())
    assert config == every["gpukit_device_plugin_configs"][t4["gpukit_device_plugin_config"]]


def test_an_unknown_peer_host_is_refused(lab: LabSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(peer.PEER_SETTING, "gpu-h100")
    with pytest.raises(LabConfigError, match=r"^GPUKIT_LAB_PEER: 'gpu-h100' is not a host"):
        peer.inventory(lab)


def test_nvidia_s_daemonsets_run_on_the_peer_node_only() -> None:
    config = {"version": "v1", "flags": {"migStrategy": "none"}}
    docs = peer.manifests("gpu-t4", config, [])
    daemonsets = {d["metadata"]["name"]: d for d in docs if d["kind"] == "DaemonSet"}
    assert set(daemonsets) == {"nfd-master", "nvidia-device-plugin", "gpu-feature-discovery"}
    for ds in daemonsets.values():
        pod = ds["spec"]["template"]["spec"]
        assert pod["nodeSelector"] == {"kubernetes.io/hostname": "gpu-t4"}
        assert [c["image"] for c in pod["containers"]] == [peer.IMAGE]
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    assert yaml.safe_load(cm["data"]["config.yaml"]) == config
    plugin = daemonsets["nvidia-device-plugin"]["spec"]["template"]["spec"]["containers"][0]
    # NVIDIA's binary, unmodified, started once the node's driver is there.
    assert plugin["command"][-1] == "nvidia-device-plugin"
    assert {"name": "CONFIG_FILE", "value": "/config/config.yaml"} in plugin["env"]


def test_the_image_carries_what_a_cgo_binary_loads() -> None:
    libs = peer._shared_libraries(Path("/bin/ls"))
    assert any(p.name.startswith("libc.so") for p in libs)


def test_the_suite_finds_the_mock_nvml_in_nvidia_s_pods() -> None:
    """No gpukit agent on the peer node: the suite's workload takes the mock NVML's host paths
    from a pod of NVIDIA's stack there (GFD mounts the library, profile and state)."""
    from types import SimpleNamespace as NS

    from gpukit.conformance import exclusive

    docs = peer.manifests("gpu-t4", {"version": "v1"}, [])
    gfd = next(d for d in docs if d["metadata"]["name"] == "gpu-feature-discovery")
    volumes = [NS(name=v["name"], host_path=NS(path=v["hostPath"]["path"]) if "hostPath" in v
                  else None) for v in gfd["spec"]["template"]["spec"]["volumes"]]
    pod = NS(metadata=NS(name="gfd-x"), spec=NS(volumes=volumes))

    def pods_on(node: str, selector: str) -> list[object]:
        return [] if selector else [pod]  # no gpukit agent pod; NVIDIA's pods

    suite = NS(kube=NS(pods_on=pods_on))
    assert exclusive.lab_mounts(suite, "gpu-t4") == [  # type: ignore[arg-type]
        ("nvml-lib", peer.NVML_LIB, "File"),
        ("nvml-profile", peer.NVML_PROFILE_DIR, "Directory"),
        ("nvml-state", peer.NVML_STATE, "Directory")]


def test_the_suite_names_nvidia_s_socket_and_cdi_kind_by_declaration(lab: LabSpec) -> None:
    from gpukit.conformance import host

    decls = {d.node_name: d for d in inv.load(peer.inventory(lab)).nodes}
    assert host.socket_prefix(decls["gpu-a100"]) == "gpukit-"
    assert host.cdi_kind(decls["gpu-a100"]) == "nvidia.com/gpu"
    # As NVIDIA's plugin v0.19.0 names them (seen on the peer lab's gpu-t4).
    assert host.socket_prefix(decls["gpu-t4"]) == "nvidia-"
    assert host.cdi_kind(decls["gpu-t4"]) == "k8s.device-plugin.nvidia.com/gpu"
