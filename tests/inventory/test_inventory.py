"""The inventory model: Ansible precedence and templating, typed declarations, and errors
that name the host, the variable and the value (what a node must then serve:
tests/conformance/test_expect.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpukit import inventory as inv

REPO = Path(__file__).resolve().parents[2]
LAB = REPO / "inventories" / "lab"
A100 = "NVIDIA A100-SXM4-40GB"


def _write(root: Path, files: dict[str, Any]) -> Path:
    for rel, doc in files.items():
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(yaml.safe_dump(doc, sort_keys=False))
    return root


def _hosts(**hosts: dict[str, Any]) -> dict[str, Any]:
    return {"all": {"children": {"gpu_nodes": {"hosts": hosts}}}}

OPT_OUT = "gpukit_runtime_accept_envvar_unprivileged"


def _decl(**raw: Any) -> inv.NodeDecl:
    raw.setdefault("gpukit_gpu", {"product": "Tesla T4", "count": 2})
    # These declarations are about what a node serves, not the runtime's hardening: their
    # configs keep NVIDIA's default strategy (envvar), which needs the opt-out.
    raw.setdefault(OPT_OUT, True)
    return inv.node_from_vars("n1", raw)


def _error(**raw: Any) -> str:
    with pytest.raises(inv.InventoryError) as exc:
        _decl(**raw)
    return str(exc.value)


# ---- the lab inventory


def test_lab_inventory_declares_both_nodes() -> None:
    lab = inv.load(LAB)
    assert lab.node_names() == ["gpu-a100", "gpu-t4"]
    a100, t4 = lab.node("gpu-a100"), lab.node("gpu-t4")
    assert a100.gpu == inv.GpuDecl(A100, 8, 40960)
    assert (a100.plugin_config_name, a100.mig_strategy, a100.mig_config_name) == (
        "mig-mixed", "mixed", "mixed-a100")
    assert [g.mig_enabled for g in a100.mig_gpus] == [True, True] + [False] * 6
    assert a100.mig_gpus[0].profiles == ("1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb")
    assert (t4.plugin_config_name, t4.mig_layout, t4.driver_branch) == ("time-sliced", None, "550")
    assert t4.plugin_config.time_slicing.fail_requests_greater_than_one
    assert t4.selection_labels() == {"nvidia.com/device-plugin.config": "time-sliced"}
    assert lab.kubeconfig == "/var/lib/gpukit-lab/kubeconfig"


def test_node_filter(tmp_path: Path) -> None:
    assert inv.load(LAB, hosts=["gpu-t4"]).node_names() == ["gpu-t4"]
    with pytest.raises(inv.InventoryError, match=r"nodes: \['gpu-x'\] are not GPU nodes"):
        inv.load(LAB, hosts=["gpu-x"])


# ---- Ansible semantics


def test_host_vars_beat_group_vars_and_templates_resolve(tmp_path: Path) -> None:
    root = _write(tmp_path / "inv", {
        "hosts.yml": {"all": {"vars": {"gpukit_kubeconfig": "{{ inventory_dir }}/kc"},
                              "children": {"gpu_nodes": {"children": {"t4s": {"hosts": {
                                  "h1": {"ansible_host": "10.0.0.1"}, "h2": {}}}}}}}},
        "group_vars/gpu_nodes.yml": {"gpukit_gpu": {"product": "Tesla T4", "count": 2},
                                     "nvidia_driver_branch": 535,
                                     "gpukit_node_name": "node-{{ inventory_hostname }}"},
        "group_vars/t4s.yml": {"nvidia_driver_branch": "550"},
        "host_vars/h2.yml": {"gpukit_gpu": {"product": "Tesla T4", "count": 4},
                             "gpukit_node_labels": {"team": "ml", "tier": 1, "spot": True}},
    })
    got = inv.load(root)
    h1, h2 = got.node("node-h1"), got.node("h2")
    assert (h1.host, h1.address, h1.gpu.count, h1.driver_branch) == ("h1", "10.0.0.1", 2, "550")
    assert (h2.node_name, h2.gpu.count) == ("node-h2", 4)
    assert h2.labels == {"team": "ml", "tier": "1", "spot": "true"}
    assert h1.kubeconfig == f"{root}/kc"


def test_host_vars_win_over_the_files_as_a_plays_extra_vars_do() -> None:
    lab = inv.load(LAB)
    t4 = lab.node("gpu-t4")
    given = {"gpu-t4": {"nvidia_driver_branch": "570", "gpukit_device_plugin_config": "default"}}
    got = inv.load(LAB, host_vars=given)
    assert got.node("gpu-t4").driver_branch == "570" != t4.driver_branch
    assert got.node("gpu-t4").plugin_config_name == "default" != t4.plugin_config_name
    assert got.node("gpu-a100") == lab.node("gpu-a100")  # only the host named


def test_declared_vars_are_the_declaration_from_hostvars() -> None:
    hostvars = {"nvidia_driver_branch": 570, "gpukit_kubeconfig": "/k", "ansible_host": "x",
                "gpukit_gpu": {"product": "Tesla T4", "count": 2}}
    assert inv.declared_vars(hostvars) == {"nvidia_driver_branch": 570,
                                           "gpukit_gpu": {"product": "Tesla T4", "count": 2}}


def test_a_pinned_driver_version_from_the_inventory_files(tmp_path: Path) -> None:
    root = _write(tmp_path / "inv", {
        "hosts.yml": _hosts(h1={}, h2={}, h3={}),
        "group_vars/gpu_nodes.yml": {"gpukit_gpu": {"product": "Tesla T4", "count": 2},
                                     "nvidia_driver_branch": "550"},
        "host_vars/h1.yml": {"nvidia_driver_version": "550.127.05"},
        "host_vars/h2.yml": {"nvidia_driver_version": ""},  # the role's default: newest
    })
    got = inv.load(root)
    assert [n.driver_version for n in got.nodes] == ["550.127.05", None, None]
    assert got.node("h1").driver_branch == "550"


def test_host_vars_pin_a_driver_version() -> None:
    """`--host-vars '{"gpu-t4": {"nvidia_driver_version": "550.127.05"}}'` (issue #14)."""
    assert inv.load(LAB).node("gpu-t4").driver_version is None
    got = inv.load(LAB, host_vars={"gpu-t4": {"nvidia_driver_version": "550.127.05"}})
    assert got.node("gpu-t4").driver_version == "550.127.05"
    assert got.node("gpu-a100").driver_version is None
    # A rolling upgrade hands the suite what its play applied, the pinned version included.
    assert inv.declared_vars({"nvidia_driver_version": "550.127.05", "x": 1}) == {
        "nvidia_driver_version": "550.127.05"}


@pytest.mark.parametrize(("given", "needle"), [
    ({"gpu-x": {}}, r"host_vars: 'gpu-x' is not a GPU node of this inventory"),
    ({"gpu-t4": ["570"]}, r"host gpu-t4: host_vars: \['570'\] is not a mapping"),
    ({"gpu-t4": {"nvidia_driver_brnach": "570"}},
     r"host gpu-t4: host_vars: \['nvidia_driver_brnach'\] are not declaration variables"),
    ({"gpu-t4": {"nvidia_driver_kernel_modules": "closed"}},
     r"host gpu-t4: nvidia_driver_kernel_modules: 'closed' is not one of"),
    ({"gpu-t4": {"nvidia_driver_version": "550.127.05-1"}},
     r"host gpu-t4: nvidia_driver_version: '550.127.05-1' is not a driver version"),
])  # fmt: skip
def test_bad_host_vars_name_host_and_variable(given: dict[str, Any], needle: str) -> None:
    with pytest.raises(inv.InventoryError, match=needle):
        inv.load(LAB, host_vars=given)


def test_inventory_without_gpu_nodes_group(tmp_path: Path) -> None:
    root = _write(tmp_path / "inv", {"hosts.yml": {"all": {"hosts": {"x": {}}}}})
    with pytest.raises(inv.InventoryError, match="has no 'gpu_nodes' group"):
        inv.load(root)


def test_missing_inventory(tmp_path: Path) -> None:
    with pytest.raises(inv.InventoryError, match="does not exist"):
        inv.load(tmp_path / "nope")


def test_every_problem_of_every_host_is_reported(tmp_path: Path) -> None:
    root = _write(tmp_path / "inv", {"hosts.yml": _hosts(
        a={"gpukit_gpu": {"product": "Tesla T4", "count": "two"}},
        b={"gpukit_gpu": {"product": "Tesla T4", "count": 1}, "gpukit_container_runtime": "dockr",
           "gpukit_node_name": "a"},
    )})
    with pytest.raises(inv.InventoryError) as exc:
        inv.load(root)
    text = str(exc.value)
    assert "host a: gpukit_gpu.count: 'two' is not an integer from 0 to 64" in text
    assert "host b: gpukit_container_runtime: 'dockr' is not one of containerd, crio" in text


def test_duplicate_node_names(tmp_path: Path) -> None:
    gpu = {"product": "Tesla T4", "count": 1}
    root = _write(tmp_path / "inv", {"hosts.yml": _hosts(
        a={"gpukit_gpu": gpu, "gpukit_node_name": "n"},
        b={"gpukit_gpu": gpu, "gpukit_node_name": "n"})})
    with pytest.raises(inv.InventoryError, match="host b: gpukit_node_name: 'n' is also the node"):
        inv.load(root)


def test_undefined_template_names_host_and_variable(tmp_path: Path) -> None:
    root = _write(tmp_path / "inv", {"hosts.yml": _hosts(
        a={"gpukit_gpu": {"product": "Tesla T4", "count": 1},
           "nvidia_driver_branch": "{{ no_such_var }}"})})
    with pytest.raises(inv.InventoryError, match=r"host a: nvidia_driver_branch: .*templated"):
        inv.load(root)


# ---- bad declarations


@pytest.mark.parametrize(("raw", "needle"), [
    ({"gpukit_gpu": None}, "gpukit_gpu: is not set"),
    ({"gpukit_gpu": "8x A100"}, "gpukit_gpu: '8x A100' is not a mapping"),
    ({"gpukit_gpu": {"count": 2}}, "gpukit_gpu.product: is not a product name"),
    ({"gpukit_gpu": {"product": "T4", "count": -1}}, "gpukit_gpu.count: -1 is not an integer"),
    # A typo, not a node (issue 29): no server holds 100000 GPUs.
    ({"gpukit_gpu": {"product": "T4", "count": 100000}},
     "gpukit_gpu.count: 100000 is not an integer from 0 to 64"),
    ({"gpukit_gpu": {"product": "T4", "count": 1, "memory": 5}}, "gpukit_gpu.memory: 5 is not a"),
    ({"gpukit_gpu": {"product": "T4", "count": 1, "memory_mib": 0}}, "memory_mib: 0 is not an"),
    ({"nvidia_driver_branch": "latest"}, "nvidia_driver_branch: 'latest' is not a driver branch"),
    ({"nvidia_driver_kernel_modules": "nouveau"}, "'nouveau' is not one of open, proprietary"),
    ({"nvidia_driver_branch": "550", "nvidia_driver_version": "latest"},
     "nvidia_driver_version: 'latest' is not a driver version such as '550.90.07'"),
    ({"nvidia_driver_branch": "550", "nvidia_driver_version": "570.86.15"},
     "nvidia_driver_version: '570.86.15' is not in branch nvidia_driver_branch='550'"),
    ({"nvidia_driver_branch": "550", "nvidia_driver_version": 550.9},
     "nvidia_driver_version: 550.9 is a number, not a driver version: quote it"),
    ({"nvidia_driver_branch": "550", "nvidia_driver_version": ["550.90.07"]},
     "nvidia_driver_version: ['550.90.07'] is not a driver version"),
    ({"nvidia_driver_version": "550.90.07"},
     "nvidia_driver_version: '550.90.07' pins a version without nvidia_driver_branch"),
    ({"gpukit_node_name": "Bad_Name"}, "gpukit_node_name: 'Bad_Name' is not a valid"),
    ({"gpukit_device_plugin_config": "x",
      "gpukit_device_plugin_configs": {"a": {"version": "v1"}}},
     "gpukit_device_plugin_config: 'x' is not a named config (known: a)"),
    ({"gpukit_device_plugin_config": "x"},
     "'x' is not a named config (known: none declared in gpukit_device_plugin_configs)"),
    ({"gpukit_device_plugin_config": "a", "gpukit_device_plugin_configs": {"a": {}}},
     "gpukit_device_plugin_configs.a: the config is empty"),
    ({"gpukit_device_plugin_config": "a", "gpukit_device_plugin_configs": {"a": [1]}},
     "gpukit_device_plugin_configs.a: [1] is not a device plugin config"),
    ({"gpukit_node_labels": {"bad key!": "x"}}, "gpukit_node_labels: 'bad key!' is not a valid"),
    ({"gpukit_node_labels": {"a": "not ok!"}}, "gpukit_node_labels.a: 'not ok!' is not a valid"),
    ({"gpukit_node_taints": [{"key": "k", "effect": "Never"}]},
     "gpukit_node_taints[0].effect: 'Never' is not one of NoSchedule"),
    ({"gpukit_node_taints": {"k": "v"}}, "gpukit_node_taints: {'k': 'v'} is not a list"),
])
def test_bad_declarations_name_host_variable_and_value(raw: dict[str, Any], needle: str) -> None:
    text = _error(**raw)
    assert text.startswith("host n1: "), text
    assert needle in text


def test_invalid_plugin_config_names_the_field_inside_the_variable() -> None:
    cfg = {"version": "v1", "sharing": {"timeSlicing": {"resources": [
        {"name": "nvidia.com/gpu", "replicas": 1}]}}}
    text = _error(gpukit_device_plugin_configs={"ts": cfg}, gpukit_device_plugin_config="ts")
    assert ("host n1: gpukit_device_plugin_configs.ts.sharing.timeSlicing.resources[0].replicas:"
            " 1 is not >= 2") in text


def test_the_only_config_is_used_without_a_selection() -> None:
    cfg = {"version": "v1", "flags": {"migStrategy": "mixed"}}
    decl = _decl(gpukit_device_plugin_configs={"only": cfg})
    assert (decl.plugin_config_name, decl.mig_strategy) == ("only", "mixed")
    assert _decl().plugin_config_name is None


A100_GPU = {"product": A100, "count": 8}


def _mig(layout: list[dict[str, Any]], **raw: Any) -> dict[str, Any]:
    return {"gpukit_gpu": A100_GPU, "gpukit_mig_configs": {"l": layout},
            "gpukit_mig_config": "l", OPT_OUT: True, **raw}


@pytest.mark.parametrize(("layout", "needle"), [
    ([{"devices": "all", "mig-enabled": True, "mig-devices": {"5g.25gb": 1}}],
     "mig-devices: '5g.25gb' is not a MIG profile of A100-SXM4-40GB (known: 1g.5gb,"),
    ([{"devices": "all", "mig-enabled": True, "mig-devices": {"3g.20gb": 3}}],
     "does not fit on one A100-SXM4-40GB"),
    ([{"devices": [0, 8], "mig-enabled": False}],
     "gpukit_mig_configs.l[0].devices: 8 is not a GPU of this node (gpukit_gpu.count is 8"),
    ([{"devices": [0], "mig-enabled": False}, {"devices": [0, 1], "mig-enabled": False}],
     "gpukit_mig_configs.l[1].devices: 0 is already laid out by gpukit_mig_configs.l[0]"),
    # The shape is the MIG manager's own schema (gpukit.contracts.mig_parted), its paths
    # named as the inventory variable.
    ([{"devices": "some", "mig-enabled": False}],
     "host n1: gpukit_mig_configs.l[0].devices: expected 'all' or a list of GPU indices, "
     'got "some"'),
    ([{"devices": "all", "mig-enabled": "yes"}],
     'gpukit_mig_configs.l[0].mig-enabled: expected true or false, got "yes"'),
    ([{"devices": "all", "mig-enabled": False, "mig-devices": {"1g.5gb": 1}}],
     "gpukit_mig_configs.l[0].mig-devices: MIG devices listed but mig-enabled is not true"),
    ([{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.5gb": "x"}}],
     'gpukit_mig_configs.l[0].mig-devices.1g.5gb: expected a count (integer >= 0), got "x"'),
    ([{"devices": "all", "mig-enable": True}], "l[0].mig-enable: unknown key (known: devices,"),
    ("all-on", 'gpukit_mig_configs.l: expected a non-empty list of device entries, got "all-on"'),
])
def test_bad_mig_layouts(layout: Any, needle: str) -> None:
    assert needle in _error(**_mig(layout))


def test_mig_on_a_gpu_without_mig() -> None:
    layout = [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.5gb": 1}}]
    text = _error(gpukit_gpu={"product": "Tesla T4", "count": 2},
                  gpukit_mig_configs={"l": layout}, gpukit_mig_config="l")
    assert "asks for MIG devices, but Tesla T4 is not MIG capable" in text
    assert "unknown layout" not in _error(gpukit_mig_config="nope")
    assert "gpukit_mig_config: 'nope' is not a named MIG layout" in _error(gpukit_mig_config="nope")


def test_a_layout_that_fits_only_by_search_is_valid() -> None:
    # Lowest-free placement puts 3g.20gb at slice 0 and then finds no start for a 1g.5gb; the
    # planner's search (gpukit.mig.placement, the same for the inventory and the node) fits it.
    layout = [{"devices": [0], "mig-enabled": True,
               "mig-devices": {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}}]
    node = inv.node_from_vars("n1", _mig(layout))
    assert node.mig_gpus[0].profiles == ("1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb")
    too_many = [{"devices": [0], "mig-enabled": True, "mig-devices": {"7g.40gb": 1, "1g.5gb": 1}}]
    assert "does not fit on one A100-SXM4-40GB" in _error(**_mig(too_many))


def test_the_model_hands_expectations_to_the_suites_oracle() -> None:
    # `gpukit inventory check` and the roles' expected_resources filter know the model only.
    from gpukit.conformance import expect

    node = inv.load(LAB).node("gpu-a100")
    assert inv.expected_resources(node) == expect.expected_resources(node)
    assert inv.expected_labels(node) == expect.expected_labels(node)
    assert inv.check(LAB).resources["gpu-t4"] == {"nvidia.com/gpu": 8}


def test_a_config_the_hardened_runtime_cannot_serve_is_refused_by_name() -> None:
    """The runtime ignores NVIDIA_VISIBLE_DEVICES from unprivileged containers unless the
    declaration opts out: a config passing devices only that way is refused before any host
    is touched (the preflight), naming host, config and strategy."""
    configs = {"plain": {"version": "v1"},
               "env": {"version": "v1", "flags": {"plugin": {"deviceListStrategy": "envvar"}}},
               "mounts": {"version": "v1", "flags": {"plugin": {
                   "deviceListStrategy": ["envvar", "volume-mounts"]}}}}
    raw = {"gpukit_gpu": {"product": "Tesla T4", "count": 2},
           "gpukit_device_plugin_configs": configs, "gpukit_device_plugin_config": "mounts"}
    with pytest.raises(inv.InventoryError) as exc:
        inv.node_from_vars("n1", raw)
    problems = {p.variable: p for p in exc.value.problems}
    assert sorted(problems) == ["gpukit_device_plugin_configs.env",
                                "gpukit_device_plugin_configs.plain"]
    assert problems["gpukit_device_plugin_configs.plain"].value == "envvar"
    assert "(not set: NVIDIA's default)" in problems["gpukit_device_plugin_configs.plain"].message
    assert "(not set" not in problems["gpukit_device_plugin_configs.env"].message
    assert all(p.host == "n1" and OPT_OUT in p.message for p in problems.values())
    # The opt-out accepts them; a hardened strategy alone needs none.
    assert inv.node_from_vars("n1", {**raw, OPT_OUT: True}).plugin_config_name == "mounts"
    del configs["plain"], configs["env"]
    assert inv.node_from_vars("n1", raw).plugin_config_name == "mounts"
    with pytest.raises(inv.InventoryError, match=f"{OPT_OUT}: 'yes' is not true or false"):
        inv.node_from_vars("n1", {**raw, OPT_OUT: "yes"})


def test_an_h200_layout_is_checked_against_the_h200_table() -> None:
    """Issue 25's check: `1g.18gb: 7` fits an H200 (7 x 1g.18gb, the planner's table), an 8th
    is refused naming the host, the variable, the profile and the GPU's limit."""
    h200 = {"product": "NVIDIA H200", "count": 8}
    seven = [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.18gb": 7}}]
    node = inv.node_from_vars("n1", _mig(seven, gpukit_gpu=h200))
    assert {g.profiles for g in node.mig_gpus} == {("1g.18gb",) * 7}
    eight = [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.18gb": 8}}]
    assert ("host n1: gpukit_mig_configs.l[0].mig-devices: {'1g.18gb': 8} does not fit on one "
            "H200-141GB (1g.18gb: 8 requested, at most 7 per GPU") in _error(
                **_mig(eight, gpukit_gpu=h200))


def _mps(replicas: int, **flags: Any) -> dict[str, Any]:
    return {"version": "v1", "flags": flags, "sharing": {"mps": {"resources": [
        {"name": "nvidia.com/gpu", "replicas": replicas}]}}}


def test_mps_config_serves_its_replicas_and_labels() -> None:
    decl = _decl(gpukit_device_plugin_configs={"mps4": _mps(4)})
    assert inv.expected_resources(decl) == {"nvidia.com/gpu": 8}
    labels = inv.expected_labels(decl)
    assert labels["nvidia.com/gpu.sharing-strategy"] == "mps"
    assert labels["nvidia.com/mps.capable"] == "true"
    assert labels["nvidia.com/gpu.product"] == "Tesla-T4-SHARED"


@pytest.mark.parametrize(("raw", "message"), [
    ({"gpukit_gpu": {"product": "Tesla T4", "count": 2, "memory_mib": 15360},
      "gpukit_device_plugin_configs": {"mps16": _mps(16)}},
     "host n1: gpukit_device_plugin_configs.mps16.sharing.mps.resources[0].replicas: 16 leaves "
     "each MPS client 960 MiB of the 15360 MiB of Tesla T4, below the 1024 MiB floor"),
    (_mig([{"devices": "all", "mig-enabled": True, "mig-devices": {"3g.20gb": 2}}],
          gpukit_device_plugin_configs={"m": _mps(2, migStrategy="single")}),
     "gpukit_device_plugin_configs.m.sharing.mps.resources[0].name: 'nvidia.com/gpu' is served "
     "by MIG devices on this node (3g.20gb, migStrategy single); MIG devices cannot be shared "
     "with MPS"),
])
def test_mps_configs_the_node_cannot_serve_are_refused(raw: dict[str, Any], message: str
                                                        ) -> None:
    """A per-client memory share below the floor, MIG devices behind an MPS resource."""
    decl = _decl(**raw)
    with pytest.raises(inv.InventoryError) as exc:
        inv.expected_resources(decl)
    assert message in str(exc.value)


def test_a_b200_layout_is_checked_against_the_b200_table() -> None:
    """Issue 25's check for the B200: `1g.23gb: 7` fits, an 8th is refused naming the host, the
    variable, the profile and the GPU's limit."""
    b200 = {"product": "NVIDIA B200", "count": 8}
    seven = [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.23gb": 7}}]
    node = inv.node_from_vars("n1", _mig(seven, gpukit_gpu=b200))
    assert {g.profiles for g in node.mig_gpus} == {("1g.23gb",) * 7}
    assert len(node.mig_gpus) == 8
    eight = [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.23gb": 8}}]
    assert ("host n1: gpukit_mig_configs.l[0].mig-devices: {'1g.23gb': 8} does not fit on one "
            "B200-180GB (1g.23gb: 8 requested, at most 7 per GPU") in _error(
                **_mig(eight, gpukit_gpu=b200))


def test_a_product_without_a_table_is_not_called_mig_incapable() -> None:
    """A MIG layout for a product gpukit has no table of is refused as exactly that, naming the
    host, the variable and the product, never as "not MIG capable" (NVIDIA says it is)."""
    gh200 = {"product": "NVIDIA GH200 144G HBM3e", "count": 1}
    layout = [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.18gb": 7}}]
    text = _error(**_mig(layout, gpukit_gpu=gh200))
    assert ("host n1: gpukit_mig_configs.l[0].mig-devices: {'1g.18gb': 7} asks for MIG devices, "
            "but no MIG table for 'NVIDIA GH200 144G HBM3e' in gpukit (known: ") in text
    assert "NVIDIA B200" in text and "not MIG capable" not in text


def test_values_without_jinja_skip_the_templar_and_load_the_same() -> None:
    """The loader templates only what holds Jinja (templating every host's plain values took
    most of a 1000-host load); the result is what Ansible's templating gives."""
    import importlib

    load_module = importlib.import_module("gpukit.inventory.load")
    assert load_module._plain_data({"a": [1, 2.5, True, None, "x"]})
    assert not load_module._plain_data({"a": ["{{ x }}"]})
    assert not load_module._plain_data({"{% if x %}": 1})
    assert not load_module._plain_data(b"bytes")  # anything else goes through Ansible
    lab = REPO / "inventories" / "lab"
    fast = inv.load(lab)
    plain_data = load_module._plain_data
    try:
        load_module._plain_data = lambda value, depth=0: False
        assert inv.load(lab) == fast
    finally:
        load_module._plain_data = plain_data
