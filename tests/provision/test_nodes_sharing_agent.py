"""Node labels/taints plans, sharing checks, the device plugin manifests, MIG config files."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from gpukit.contracts import node_declaration as nd
from gpukit.provision import agent, mig, nodes, sharing
from gpukit.provision.nodes import NodeSpecError, Taint

CONFIGS: dict[str, Any] = {
    "default": {"version": "v1", "flags": {"migStrategy": "none"}},
    "mig-mixed": {"version": "v1", "flags": {"migStrategy": "mixed"}},
    "time-sliced": {
        "version": "v1",
        "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}},
    },
}
MIG = {
    "all-disabled": [{"devices": "all", "mig-enabled": False}],
    "mixed-a100": [{"devices": [0, 1], "mig-enabled": True, "mig-devices": {"3g.20gb": 2}}],
}


def node(labels: dict[str, str] | None = None, taints: list[dict[str, str]] | None = None,
         annotations: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    return {"metadata": {"name": "n", "labels": labels or {}, "annotations": annotations or {}},
            "spec": {"taints": taints} if taints is not None else {}}  # fmt: skip


def test_declared_labels() -> None:
    labels = nodes.declared_labels({"team": "ml", "ssd": True}, "time-sliced", "mixed-a100")
    assert labels == {
        "team": "ml", "ssd": "true", "nvidia.com/device-plugin.config": "time-sliced",
        "nvidia.com/mig.config": "mixed-a100", "nvidia.com/gpu.deploy.device-plugin": "true",
    }  # fmt: skip
    assert nodes.declared_labels({}, None, None, deploy_device_plugin=False) == {}


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        # The inventory model's rules (gpukit.inventory.node_meta): the preflight's.
        ({"bad key": "x"}, "gpukit_node_labels: 'bad key' is not a valid label key "
                           "([prefix/]name: the name must be"),
        ({"Example.COM/x": "y"}, "the prefix 'Example.COM' is not a DNS subdomain"),
        ({"ok": "not ok!"}, "gpukit_node_labels.ok: 'not ok!' is not a valid label value"),
    ],
)
def test_bad_labels_name_the_variable(extra: dict[str, str], needle: str) -> None:
    with pytest.raises(NodeSpecError, match=re.escape(needle)):
        nodes.declared_labels(extra)


@pytest.mark.parametrize(
    ("taints", "needle"),
    [
        ([{"key": "a"}], r"gpukit_node_taints\[0\].effect: is not one of NoSchedule, "),
        ([{"effect": "NoSchedule"}], r"gpukit_node_taints\[0\].key: is not a valid taint key"),
        ([{"key": "a", "effect": "Never"}], r"gpukit_node_taints\[0\].effect: 'Never'"),
        ([{"key": "a", "effect": "NoSchedule", "x": 1}],
         r"gpukit_node_taints\[0\].x: 1 is not a known field"),
        ([{"key": "a", "effect": "NoSchedule", "value": "no way"}],
         r"gpukit_node_taints\[0\].value: 'no way' is not a valid label value"),
        ([{"key": "a", "effect": "NoSchedule"}] * 2,
         r"gpukit_node_taints\[1\]: 'a:NoSchedule' is declared twice"),
    ],
)
def test_bad_taints_name_the_variable(taints: list[dict[str, Any]], needle: str) -> None:
    with pytest.raises(NodeSpecError, match=needle):
        nodes.parse_taints(taints, "gpukit_node_taints")


def test_plan_sets_labels_taints_and_bookkeeping() -> None:
    gpu = Taint("nvidia.com/gpu", "NoSchedule", "present")
    cordon = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
    p = nodes.plan(node({"kubernetes.io/hostname": "n"}, [cordon]), {"team": "ml"}, [gpu])
    assert p.changed
    assert p.patch["metadata"]["labels"] == {"team": "ml"}
    assert p.patch["spec"]["taints"] == [cordon, gpu.as_dict()]
    assert p.patch["metadata"]["annotations"] == {
        nodes.MANAGED_LABELS: "team",
        nodes.MANAGED_TAINTS: "nvidia.com/gpu:NoSchedule",
    }
    assert "taint nvidia.com/gpu:NoSchedule: added" in p.changes


def test_plan_on_a_converged_node_is_empty() -> None:
    gpu = Taint("nvidia.com/gpu", "NoSchedule", "present")
    n = node(
        {"team": "ml", "nvidia.com/gpu.count": "8"},
        [gpu.as_dict()],
        {nodes.MANAGED_LABELS: "team", nodes.MANAGED_TAINTS: "nvidia.com/gpu:NoSchedule"},
    )
    p = nodes.plan(n, {"team": "ml"}, [gpu])
    assert not p.changed and p.patch == {"metadata": {}}


def test_plan_removes_only_what_gpukit_set_before() -> None:
    n = node(
        {"team": "ml", "other": "x", "nvidia.com/gpu.count": "8"},
        [{"key": "old", "effect": "NoExecute"}, {"key": "theirs", "effect": "NoSchedule"}],
        {nodes.MANAGED_LABELS: "team", nodes.MANAGED_TAINTS: "old:NoExecute"},
    )
    p = nodes.plan(n, {}, [])
    assert p.patch["metadata"]["labels"] == {"team": None}
    assert p.patch["spec"]["taints"] == [{"key": "theirs", "effect": "NoSchedule"}]
    assert p.patch["metadata"]["annotations"] == {nodes.MANAGED_LABELS: None,
                                                  nodes.MANAGED_TAINTS: None}  # fmt: skip
    assert "label team: removed (no longer declared)" in p.changes


def test_sharing_check() -> None:
    ok = sharing.check(CONFIGS, "time-sliced", MIG, None)
    assert ok.ok and ok.shared_replicas == {"nvidia.com/gpu": 4}
    unknown = sharing.check(CONFIGS, "nope", MIG, None)
    # The inventory model's checks and wording (gpukit.inventory.validate.sharing).
    assert unknown.problems == [
        "gpukit_device_plugin_config: 'nope' is not a named config"
        " (known: default, mig-mixed, time-sliced)"
    ]
    no_layout = sharing.check(CONFIGS, "mig-mixed", MIG, "all-7g")
    assert no_layout.problems == ["gpukit_mig_config: 'all-7g' is not a named MIG layout"
                                  " (known: all-disabled, mixed-a100)"]
    assert sharing.check({}, None, None, None).problems == [
        "gpukit_device_plugin_configs: must map config names to device plugin configs"]
    unserved = sharing.check(CONFIGS, "default", MIG, "mixed-a100")
    assert unserved.ok and "migStrategy none" in unserved.warnings[0]
    broken = sharing.check(CONFIGS, "mig-mixed", {"l": [{"devices": "all"}]}, "l")
    assert broken.problems == ["gpukit_mig_configs.l[0].mig-enabled: missing (true or false)"]
    bad = sharing.check(
        {
            "x": {
                "version": "v1",
                "sharing": {
                    "timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 1}]}
                },
            }
        },
        "x",
        None,
        None,
    )
    assert (
        "gpukit_device_plugin_configs.x.sharing.timeSlicing.resources[0].replicas"
        in (bad.problems[0])
    )


def test_agent_manifests_from_role_variables() -> None:
    objs = agent.render(
        image="localhost/x:dev",
        configs=CONFIGS,
        default_config="default",
        nvml_library="/driver-root/lib/libnvidia-ml.so.1",
        node_selector={"nvidia.com/gpu.deploy.device-plugin": "true"},
        env={"A": 1},
        image_pull_policy="Never",
        host_mounts=[{"name": "s", "host_path": "/var/lib/s", "read_only": False}],
    )
    kinds = [o["kind"] for o in objs]
    assert kinds[0] == "Namespace" and kinds[-1] == "DaemonSet" and "ConfigMap" in kinds
    cm = next(o for o in objs if o["kind"] == "ConfigMap")
    assert sorted(cm["data"]) == ["default", "mig-mixed", "time-sliced"]
    assert yaml.safe_load(cm["data"]["time-sliced"]) == CONFIGS["time-sliced"]
    ds = objs[-1]["spec"]["template"]["spec"]
    assert ds["nodeSelector"] == {"nvidia.com/gpu.deploy.device-plugin": "true"}
    c = ds["containers"][0]
    assert c["imagePullPolicy"] == "Never"
    assert {"name": "A", "value": "1"} in c["env"]
    # a writable mount carries no readOnly: false (the API leaves it out; GitOps applies match)
    assert {"name": "s", "mountPath": "/var/lib/s"} in c["volumeMounts"]
    # No emptyDir: kubernetes.core's k8s_drain would delete the agent's pod on every drain.
    assert not [v for v in ds["volumes"] if "emptyDir" in v], ds["volumes"]
    tmp = next(m for m in c["volumeMounts"] if m["mountPath"] == "/tmp")
    assert next(v for v in ds["volumes"] if v["name"] == tmp["name"])["hostPath"]["path"] == (
        "/run/gpukit"
    )


@pytest.mark.parametrize("image", [
    "10.244.77.1:5000/gpukit-node-agent:0.1.0",
    "10.244.77.1:5000/gpukit-node-agent@sha256:" + "ab" * 32,
])
def test_the_daemonset_runs_exactly_the_image_given_by_tag_or_digest(image: str) -> None:
    objs = agent.render(image=image, configs=CONFIGS, default_config="default")
    ds = next(o for o in objs if o["kind"] == "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    assert {c["image"] for c in [*pod["containers"], *pod.get("initContainers", [])]} == {image}


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        ({"image": ""}, "gpukit_device_plugin_image: an image reference is required"),
        ({"image": "reg:5000/agent@sha256:12"},
         r"gpukit_device_plugin_image: 'reg:5000/agent@sha256:12' is not an image reference"),
        ({"image_pull_policy": "Sometimes"}, "gpukit_device_plugin_image_pull_policy"),
        ({"default_config": "nope"}, "gpukit_device_plugin_default_config: 'nope'"),
        ({"configs": {}}, "gpukit_device_plugin_configs: must map config names"),
        ({"configs": {"ts": {}}},
         r"gpukit_device_plugin_configs\['ts'\]: the config is empty"),
        ({"host_mounts": [{"name": "x"}]}, r"gpukit_device_plugin_host_mounts\[0\]"),
    ],
)
def test_agent_variables_are_checked(kw: dict[str, Any], needle: str) -> None:
    args: dict[str, Any] = {"image": "i", "configs": CONFIGS, **kw}
    with pytest.raises(agent.AgentSpecError, match=needle):
        agent.render(**args)


def test_mig_parted_config_and_argv() -> None:
    text = mig.parted_config(MIG)
    doc = yaml.safe_load(text)
    assert text.startswith("# Managed by gpukit")
    assert doc == {"version": "v1", "mig-configs": MIG}
    argv = mig.argv(
        "apply",
        "/etc/gpukit/mig-parted.yaml",
        "mixed-a100",
        force=True,
        extra=["--state-file", "/run/s"],
        python="/opt/gpukit/bin/python",
    )
    assert argv == ["/opt/gpukit/bin/python", "-m", "gpukit.plugin.mig", "apply",
                    "--config-file", "/etc/gpukit/mig-parted.yaml", "--selected", "mixed-a100",
                    "--json", "--force", "--state-file", "/run/s"]  # fmt: skip
    assert "--force" not in mig.argv("plan", "f", "s", force=True)
    with pytest.raises(ValueError, match="not plan or apply"):
        mig.argv("export", "f", "s")


def test_mig_parted_config_rejects_bad_layouts() -> None:
    from gpukit.contracts.mig_parted import MigConfigError

    with pytest.raises(MigConfigError):
        mig.parted_config({"bad": [{"devices": "all", "mig-enabled": "maybe"}]})
def test_named_configs_of_all_nodes_merge_into_one_configmap() -> None:
    from gpukit.provision.agent import AgentSpecError, merge_configs

    base = {"version": "v1", "flags": {"migStrategy": "none"}}
    sliced = {"version": "v1", "sharing": {"timeSlicing": {"resources": [
        {"name": "nvidia.com/gpu", "replicas": 4}]}}}  # fmt: skip
    merged = merge_configs({"a100-1": {"default": base},
                            "t4-1": {"default": base, "time-sliced": sliced}})  # fmt: skip
    assert merged == {"default": base, "time-sliced": sliced}
    other = {**sliced, "sharing": {"timeSlicing": {"resources": [
        {"name": "nvidia.com/gpu", "replicas": 8}]}}}  # fmt: skip
    with pytest.raises(AgentSpecError, match=r"gpukit_device_plugin_configs\['time-sliced'\]:"
                                             r" differs between t4-1 and t4-2"):  # fmt: skip
        merge_configs({"t4-1": {"time-sliced": sliced}, "t4-2": {"time-sliced": other}})


def _node(labels: dict[str, str], allocatable: dict[str, str], ready: str = "True",
          said: dict[str, int] | None = None) -> Any:
    """A node whose agent says it serves `said` (default: what it advertises)."""
    said = {k: int(v) for k, v in allocatable.items()} if said is None else said
    declared = {"type": nd.CONDITION_TYPE, "status": "False",
                "message": nd.served_message("gpu-t4", said)}
    return {"metadata": {"name": "gpu-t4", "labels": labels},
            "status": {"allocatable": {"cpu": "2", **allocatable},
                       "conditions": [{"type": "Ready", "status": ready}, declared]}}  # fmt: skip


def test_site_waits_until_a_selected_node_serves_what_it_declares() -> None:
    selector = {"nvidia.com/gpu.deploy.device-plugin": "true"}
    picked = {"nvidia.com/gpu.deploy.device-plugin": "true"}
    want = {"nvidia.com/gpu": 8}
    serves = agent.node_serves_declared
    assert serves(_node(picked, {"nvidia.com/gpu": "8"}), want, selector)
    # registered with the kubelet but not yet in the node's status: wait
    assert not serves(_node(picked, {"nvidia.com/gpu": "0"}), want, selector)
    assert not serves(_node(picked, {"nvidia.com/gpu": "4"}), want, selector)
    assert not serves(_node(picked, {"nvidia.com/gpu": "8"}, ready="False"), want, selector)
    # advertised, but the agent has not yet read its new declaration (it says the old one)
    assert not serves(_node(picked, {"nvidia.com/gpu": "8"}, said={"nvidia.com/gpu": 4}),
                      want, selector)  # fmt: skip
    # a resource the inventory does not declare is not served as declared either
    assert not serves(_node(picked, {"nvidia.com/gpu": "8", "nvidia.com/mig-1g.5gb": "2"}),
                      want, selector)  # fmt: skip
    # no agent is scheduled there: nothing to wait for
    assert serves(_node({}, {}), want, selector)
    assert serves(_node({"nvidia.com/gpu.deploy.device-plugin": "false"}, {}), want, selector)
