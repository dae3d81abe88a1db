"""`gpukit manifests`: the node agent's objects for an inventory (the device plugin's, then the
DRA plugin's), as the device_plugin role applies them (the lab's own comparison with the
cluster: tests/roles/test_site_lab.py)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpukit import agent_manifests as deploy
from gpukit import manifests
from gpukit.provision import agent

REPO = Path(__file__).resolve().parents[2]
LAB = REPO / "inventories" / "lab"
EXAMPLE = REPO / "inventories" / "example"
ROLE = REPO / "roles" / "device_plugin"
LOOKUP = REPO / "collections/ansible_collections/gpukit/gpu/plugins/lookup/agent_manifests.py"
DEVICE_PLUGIN_KINDS = ["Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
                       "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
                       "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
                       "ConfigMap", "ConfigMap", "DaemonSet"]  # fmt: skip
# Served vs declared's own objects: the condition policy and the declarations (issue 30).
SERVED_VS_DECLARED = {deploy.DECLARATIONS, f"{deploy.APP}-own-node-condition"}
DRA_KINDS = ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
             "ValidatingAdmissionPolicyBinding", "DeviceClass", "DeviceClass", "DaemonSet"]
KINDS = DEVICE_PLUGIN_KINDS + DRA_KINDS


def gpukit(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpukit", *args], capture_output=True,
                          text=True, timeout=120, cwd=REPO)  # fmt: skip


def by_kind(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The device plugin's objects by kind (the DRA plugin's left out: kinds repeat)."""
    return {o["kind"]: o for o in objects if "gpukit-dra-plugin" not in o["metadata"]["name"]
            and o["kind"] != "DeviceClass" and o["metadata"]["name"] not in SERVED_VS_DECLARED}


def by_name(objects: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


def group_vars(inventory: Path, name: str) -> dict[str, Any]:
    path = inventory / "group_vars" / f"{name}.yml"
    files = [path] if path.exists() else sorted((inventory / "group_vars" / name).glob("*.yml"))
    out: dict[str, Any] = {}
    for f in files:
        out.update(yaml.safe_load(f.read_text()) or {})
    return out


def test_the_lab_inventory_gives_the_objects_its_variables_declare() -> None:
    """Independently of gpukit.manifests: the objects gpukit.agent_manifests draws from the
    values the lab's group_vars files hold, with the role's defaults for the rest."""
    v = {**group_vars(LAB, "all"), **group_vars(LAB, "gpu_nodes")}
    want = deploy.manifests(deploy.AgentDeployment(
        image=v["gpukit_device_plugin_image"],
        configs=v["gpukit_device_plugin_configs"],
        default_config="default",
        nvml_library=v["gpukit_device_plugin_nvml_library"],
        node_selector={"nvidia.com/gpu.deploy.device-plugin": "true"},
        env=v["gpukit_device_plugin_env"],
        host_mounts=tuple(deploy.HostMount(m["name"], m["host_path"], m["mount_path"],
                                           m["read_only"])
                          for m in v["gpukit_device_plugin_host_mounts"]),
        image_pull_policy=v["gpukit_device_plugin_image_pull_policy"],
        metrics_auth="kubernetes",  # gpukit_metrics_auth's default
        dra=True,
        dra_node_selector={"gpukit.io/gpu.allocation": "dra"},
        # What each node must serve: the declaration check's (the suite's oracle's) answer.
        declarations={"gpu-a100": {
            "version": "v1", "node": "gpu-a100", "devicePluginConfig": "mig-mixed",
            "resources": {"nvidia.com/gpu": 6, "nvidia.com/mig-1g.5gb": 4,
                          "nvidia.com/mig-2g.10gb": 2, "nvidia.com/mig-3g.20gb": 2}},
            "gpu-t4": {"version": "v1", "node": "gpu-t4", "devicePluginConfig": "time-sliced",
                       "resources": {"nvidia.com/gpu": 8}}},
    ))  # fmt: skip
    got = manifests.for_inventory(LAB)
    assert [o["kind"] for o in got] == KINDS
    assert got == want
    ds = by_kind(got)["DaemonSet"]["spec"]["template"]["spec"]
    assert ds["containers"][0]["image"] == "localhost/gpukit-lab/node-agent:dev"
    assert {"name": "GPUKIT_NVML_PROFILE", "value": "/etc/gpukit-lab/nvml/profile.yaml"} in (
        ds["containers"][0]["env"])
    assert sorted(by_kind(got)["ConfigMap"]["data"]) == ["default", "mig-mixed", "time-sliced"]
    # Metrics only for authorised scrapers by default: the agent may review their tokens.
    assert {"name": "GPUKIT_METRICS_AUTH", "value": "kubernetes"} in ds["containers"][0]["env"]
    assert [r for r in by_kind(got)["ClusterRole"]["rules"] if "tokenreviews" in r["resources"]]


def test_the_example_fleet_and_a_limit() -> None:
    got = by_kind(manifests.for_inventory(EXAMPLE))
    pod = got["DaemonSet"]["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == "registry.example.com/platform/gpukit-node-agent:0.1.0"
    assert pod["containers"][0]["imagePullPolicy"] == "IfNotPresent"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.deploy.device-plugin": "true"}
    declared = group_vars(EXAMPLE, "gpu_nodes")["gpukit_device_plugin_configs"]
    assert sorted(got["ConfigMap"]["data"]) == sorted(declared)
    assert {yaml.safe_load(t)["version"] for t in got["ConfigMap"]["data"].values()} == {"v1"}
    # --limit (a group, a host) plays fewer hosts; their variables are the same here.
    assert by_kind(manifests.for_inventory(EXAMPLE, limit=["t4_nodes"])) == got
    assert [h for h, _ in manifests.play_vars(EXAMPLE, limit=["gpu-h100-02", "a100_nodes"])
            ] == ["gpu-a100-01", "gpu-a100-02", "gpu-a100-03", "gpu-h100-02"]  # fmt: skip


def test_extra_vars_and_the_role_s_own_variables_win(tmp_path: Path) -> None:
    (tmp_path / "vars.yml").write_text("gpukit_device_plugin_image: example.org/agent:2\n")
    got = by_kind(manifests.for_inventory(LAB, extra_vars=[
        f"@{tmp_path / 'vars.yml'}", "device_plugin_namespace=gpu-agents",
        '{"device_plugin_node_selector": {"pool": "gpu"}}']))
    pod = got["DaemonSet"]["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == "example.org/agent:2"
    assert pod["nodeSelector"] == {"pool": "gpu"}
    assert {o["metadata"].get("namespace") for o in got.values()} >= {"gpu-agents"}
    assert got["Namespace"]["metadata"]["name"] == "gpu-agents"


def test_configs_merge_across_hosts_and_a_conflict_names_both(tmp_path: Path) -> None:
    inv = tmp_path / "inv"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {"gpu_nodes": {
        "children": {"a": {"hosts": {"n1": None}}, "b": {"hosts": {"n2": None}}}}}}}))
    (inv / "group_vars" / "gpu_nodes.yml").write_text(yaml.safe_dump({
        "gpukit_device_plugin_image": "img:1",
        "gpukit_device_plugin_configs": {"default": {"version": "v1"}}}))
    (inv / "group_vars" / "b.yml").write_text(yaml.safe_dump({
        "gpukit_device_plugin_configs": {"default": {"version": "v1"}, "mixed": {
            "version": "v1", "flags": {"migStrategy": "mixed"}}}}))
    assert sorted(by_kind(manifests.for_inventory(inv))["ConfigMap"]["data"]) == [
        "default", "mixed"]
    # n1 alone: only its configs, as `ansible-playbook --limit n1` applies.
    assert sorted(by_kind(manifests.for_inventory(inv, limit=["n1"]))["ConfigMap"]["data"]
                  ) == ["default"]  # fmt: skip
    (inv / "group_vars" / "b.yml").write_text(yaml.safe_dump({
        "gpukit_device_plugin_configs": {"default": {"version": "v1", "flags": {
            "migStrategy": "single"}}}}))
    with pytest.raises(manifests.ManifestsError, match=r"\['default'\]: differs between n1 and n2"):
        manifests.for_inventory(inv)


@pytest.mark.parametrize(("group_vars_text", "message"), [
    ("gpukit_device_plugin_configs: {default: {version: v1}}\n",
     "host n1: gpukit_device_plugin_image: an image reference is required"),
    ("gpukit_device_plugin_image: i\ngpukit_device_plugin_configs: {default: {version: v1}}\n"
     "gpukit_device_plugin_image_pull_policy: Sometimes\n",
     "gpukit_device_plugin_image_pull_policy: 'Sometimes' is not one of"),
    ("gpukit_device_plugin_image: i\ngpukit_device_plugin_configs: [a]\n",
     "host n1: gpukit_device_plugin_configs: ['a'] is not a mapping"),
    ("gpukit_device_plugin_image: i\ngpukit_device_plugin_configs:\n"
     "  default: {version: v1, sharing: {timeSlicng: {}}}\n",
     "gpukit_device_plugin_configs['default'].sharing.timeSlicng: unknown field"),
    ("gpukit_device_plugin_image: '{{ nowhere }}'\n",
     "host n1: gpukit_device_plugin_image: '{{ nowhere }}' cannot be templated"),
    ("gpukit_device_plugin_image: i\ndevice_plugin_mode: host\n",
     "host n1: device_plugin_mode: 'host' runs the device plugin as a host service"),
])
def test_the_command_refuses_bad_variables_naming_them(tmp_path: Path, group_vars_text: str,
                                                       message: str) -> None:
    inv = tmp_path / "inv"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text("all:\n  children:\n    gpu_nodes:\n      hosts:\n        n1:\n")
    (inv / "group_vars" / "gpu_nodes.yml").write_text(group_vars_text)
    r = gpukit("manifests", "--inventory", str(inv))
    assert r.returncode == 2 and r.stdout == "", r.stdout + r.stderr
    assert message in r.stderr, r.stderr


def test_the_command_prints_one_yaml_stream() -> None:
    r = gpukit("manifests", "--inventory", str(LAB), "--host", "gpu-t4")
    assert r.returncode == 0, r.stderr
    # Led by the node labels the objects rely on, for the play's nodes only (issue 29, GitOps).
    head, sep, _ = r.stdout.partition("---\napiVersion: v1\nkind: Namespace\n")
    assert sep and head.splitlines()[2:] == [
        "#   gpu-t4: gpukit.io/gpu.allocation=device-plugin"
        " nvidia.com/device-plugin.config=time-sliced nvidia.com/gpu.deploy.device-plugin=true"]
    assert r.stdout.count("\n---\n") == len(KINDS)  # the DRA plugin's too, after the labels
    assert list(yaml.safe_load_all(r.stdout)) == manifests.for_inventory(LAB, limit=["gpu-t4"])
    # The configs read as a person writes them (literal blocks), and parse back the same.
    assert "  time-sliced: |\n    version: v1\n" in r.stdout
    none = gpukit("manifests", "--inventory", str(LAB), "--group", "h100_nodes")
    assert none.returncode == 2 and "no host of 'gpu_nodes' matches the limit" in none.stderr


def test_the_dra_plugin_s_objects_follow_the_device_plugin_s() -> None:
    """Applied always, the DRA plugin's DaemonSet selects the nodes labelled
    gpukit.io/gpu.allocation=dra (none until one declares DRA), runs the agent's image with its
    environment and host mounts (the lab's mock NVML), and NVIDIA's DeviceClasses come with it,
    gpu.nvidia.com mapping nvidia.com/gpu."""
    got = by_name(manifests.for_inventory(LAB))
    agent_pod = got[("DaemonSet", "gpukit-node-agent")]["spec"]["template"]["spec"]
    dra_pod = got[("DaemonSet", "gpukit-dra-plugin")]["spec"]["template"]["spec"]
    assert dra_pod["nodeSelector"] == {"gpukit.io/gpu.allocation": "dra"}
    assert agent_pod["nodeSelector"] == {"nvidia.com/gpu.deploy.device-plugin": "true"}
    a, d = agent_pod["containers"][0], dra_pod["containers"][0]
    assert d["image"] == a["image"] == "localhost/gpukit-lab/node-agent:dev"
    assert {"name": "GPUKIT_NVML_PROFILE", "value": "/etc/gpukit-lab/nvml/profile.yaml"} in d["env"]
    lab_mounts = {m["name"] for m in group_vars(LAB, "all")["gpukit_device_plugin_host_mounts"]}
    assert lab_mounts <= {m["name"] for m in d["volumeMounts"]}
    assert got[("DeviceClass", "gpu.nvidia.com")]["spec"]["extendedResourceName"] == (
        "nvidia.com/gpu")
    assert "extendedResourceName" not in got[("DeviceClass", "mig.nvidia.com")]["spec"]


@pytest.mark.parametrize(("version", "mapped"), [
    ("v1.35.4", False), ("v1.34.0", False), ("v1.36.1", True), ("v1.37.2", True), (None, True)])
def test_the_extended_resource_by_the_cluster_s_version(version: str | None, mapped: bool
                                                        ) -> None:
    """DRAExtendedResource is alpha (off) in 1.34 and 1.35: their apiservers drop the field,
    so the DeviceClass carries it from 1.36 on; unknown (offline), assumed; an explicit
    device_plugin_dra_extended_resource wins over the version."""
    extra = [json.dumps({"device_plugin_kubernetes_version": version})] if version else []
    spec = by_name(manifests.for_inventory(LAB, extra_vars=extra))[
        ("DeviceClass", "gpu.nvidia.com")]["spec"]
    assert ("extendedResourceName" in spec) is mapped
    forced = by_name(manifests.for_inventory(LAB, extra_vars=[*extra, json.dumps(
        {"device_plugin_dra_extended_resource": not mapped})]))  # fmt: skip
    assert ("extendedResourceName" in forced[("DeviceClass", "gpu.nvidia.com")]["spec"]) is (
        not mapped)
    with pytest.raises(manifests.ManifestsError, match="kubernetes version 'latest'"):
        manifests.for_inventory(LAB, extra_vars=['{"device_plugin_kubernetes_version": "latest"}'])


def test_the_command_leaves_dra_out_or_names_the_cluster_s_version() -> None:
    r = gpukit("manifests", "--inventory", str(LAB), "--no-dra")
    assert r.returncode == 0, r.stderr
    assert [o["kind"] for o in yaml.safe_load_all(r.stdout)] == DEVICE_PLUGIN_KINDS
    old = gpukit("manifests", "--inventory", str(LAB), "--kubernetes-version", "v1.35.4")
    assert old.returncode == 0, old.stderr
    classes = [o for o in yaml.safe_load_all(old.stdout) if o["kind"] == "DeviceClass"]
    assert [c["metadata"]["name"] for c in classes] == ["gpu.nvidia.com", "mig.nvidia.com"]
    assert not [c for c in classes if "extendedResourceName" in c["spec"]]


# ---- held to the role: its defaults, its lookup call, the lookup's options


class _Role:
    """The role's defaults, templated as Ansible templates a role's files (trusted)."""

    def __init__(self, variables: dict[str, Any]) -> None:
        from ansible.parsing.dataloader import DataLoader  # type: ignore[import-untyped]
        from ansible.template import Templar  # type: ignore[import-untyped]

        self.templar = Templar(loader=DataLoader(), variables=variables)

    def template(self, value: Any) -> Any:
        from ansible.template import trust_as_template  # type: ignore[import-untyped]

        from gpukit.inventory import plain

        trusted = trust_as_template(value) if isinstance(value, str) else value
        return plain(self.templar.template(trusted))


def _templar(variables: dict[str, Any]) -> _Role:
    return _Role(variables)


def test_the_role_s_defaults_are_the_library_s() -> None:
    """Each role variable, templated by Ansible from the role's defaults file, takes its
    inventory variable when set and the library's default when not."""
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    for name, (inventory_name, default) in manifests.FROM_INVENTORY.items():
        assert _templar({}).template(defaults[name]) == default, name
        assert _templar({inventory_name: "SET"}).template(defaults[name]) == "SET", name
    for name, default in manifests.ROLE_DEFAULTS.items():
        assert defaults[name] == default, name
    chosen = defaults[manifests.DEFAULT_CONFIG]
    assert _templar({"device_plugin_configs": {"default": {}}}).template(chosen) == "default"
    assert _templar({"device_plugin_configs": {"other": {}}}).template(chosen) is None
    assert manifests.role_vars("h", {"gpukit_device_plugin_configs": {"other": {}}})[
        manifests.DEFAULT_CONFIG] is None


def test_the_role_renders_through_the_same_arguments() -> None:
    tasks = (ROLE / "tasks" / "api_apply.yml").read_text()
    call = re.search(r"query\('gpukit\.gpu\.agent_manifests',(.*?)\)", tasks, re.S)
    assert call, "the role no longer renders through the agent_manifests lookup"
    args = dict(re.findall(r"(\w+)=(\w+)", call.group(1)))
    assert args == {"configs": "device_plugin_merged_configs",
                    "declarations": "device_plugin_declarations", **manifests.RENDER_ARGS}
    doc = yaml.safe_load(re.search(r'DOCUMENTATION = r"""(.*?)"""', LOOKUP.read_text(),
                                   re.S).group(1))  # type: ignore[union-attr]
    assert set(doc["options"]) == {"configs", "declarations", *manifests.RENDER_ARGS}
    # The lookup's arguments are agent.render's.
    import inspect

    assert set(inspect.signature(agent.deployment).parameters) >= set(doc["options"])


def test_the_node_labels_name_each_node_s_allocation_and_selections(tmp_path: Path) -> None:
    """What a GitOps apply without site.yml must label nodes with: a DRA node is labelled off
    the node agent's DaemonSet and onto the DRA plugin's, with its shares."""
    inv = tmp_path / "inv"
    shutil.copytree(LAB, inv)
    (inv / "host_vars").mkdir(exist_ok=True)
    (inv / "host_vars" / "gpu-t4.yml").write_text(
        "gpukit_gpu_allocation: dra\ngpukit_dra_shares: 4\n")
    got = manifests.node_labels(inv)
    assert got["gpu-t4"] == {"gpukit.io/gpu.allocation": "dra", "gpukit.io/dra.shares": "4",
                             "nvidia.com/gpu.deploy.device-plugin": "false",
                             "nvidia.com/device-plugin.config": "time-sliced"}
    assert got["gpu-a100"]["nvidia.com/mig.config"] == "mixed-a100"
    assert list(manifests.node_labels(inv, ["gpu-a100"])) == ["gpu-a100"]
