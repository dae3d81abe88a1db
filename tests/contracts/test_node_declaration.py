"""The declaration entry the roles render for each node's agent (issue 30)."""

from __future__ import annotations

import pytest

from gpukit.contracts import node_declaration as nd


def test_a_rendered_entry_reads_back() -> None:
    decl = nd.NodeDeclaration("gpu-t4", {"nvidia.com/gpu": 8}, "ts")
    text = nd.render(decl)
    assert nd.parse(text) == decl
    assert text.startswith("version: v1\nnode: gpu-t4\n")


def test_json_is_read_and_absent_resources_mean_none() -> None:
    assert nd.parse('{"version": "v1", "node": "n"}') == nd.NodeDeclaration("n", {}, "")


@pytest.mark.parametrize(("text", "message"), [
    ("version: v1\nnode: n\nresources: {nvidia.com/gpu: -1}\n",
     "gpu-decl.resources.nvidia.com/gpu: -1 is not a count >= 0"),
    ("version: v1\nnode: n\nresources: {nvidia.com/gpu: true}\n",
     "gpu-decl.resources.nvidia.com/gpu: True is not a count >= 0"),
    ("version: v1\nnode: n\nresources: {cpu: 1}\n",
     "gpu-decl.resources: 'cpu' is not an nvidia.com/ resource"),
    ("version: v2\nnode: n\n", "gpu-decl.version: 'v2' is not 'v1'"),
    ("version: v1\n", "gpu-decl.node: None is not a node name"),
    ("version: v1\nnode: n\nresource: {}\n", "gpu-decl.resource: unknown field"),
    ("- a\n", "gpu-decl: ['a'] is not a mapping"),
    ("version: [v1\n", "gpu-decl: not YAML:"),
])
def test_bad_entries_are_one_line_naming_field_and_value(text: str, message: str) -> None:
    with pytest.raises(nd.DeclarationError) as err:
        nd.parse(text, "gpu-decl")
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value)


def test_values_of_str_subclasses_render_as_plain_strings() -> None:
    class Tagged(str):  # as an Ansible inventory's strings are
        pass

    decl = nd.from_dict({"version": "v1", "node": Tagged("n"), "devicePluginConfig": Tagged("c"),
                         "resources": {Tagged("nvidia.com/gpu"): 2}})
    assert nd.render(decl) == ("version: v1\nnode: n\ndevicePluginConfig: c\nresources:\n"
                               "  nvidia.com/gpu: 2\n")


def test_a_dra_nodes_entry_names_its_device_kinds_and_reads_back() -> None:
    """A DRA node's entry (issue 30): the healthy devices its slices must publish, by kind;
    an entry without draDevices is a device plugin node's, rendered as before."""
    decl = nd.NodeDeclaration("gpu-a100", dra_devices={nd.dra_kind("gpu"): 1,
                                                       nd.dra_kind("mig", "1g.5gb"): 2})
    text = nd.render(decl)
    assert text == ("version: v1\nnode: gpu-a100\ndevicePluginConfig: ''\nresources: {}\n"
                    "draDevices:\n  gpu.nvidia.com/gpu: 1\n  gpu.nvidia.com/mig-1g.5gb: 2\n")
    assert nd.parse(text) == decl and decl.dra and decl.counts() == decl.dra_devices
    plain = nd.NodeDeclaration("gpu-t4", {"nvidia.com/gpu": 2})
    assert "draDevices" not in nd.render(plain) and not plain.dra
    assert nd.dra_counts([{"type": "mig", "profile": "1g.5gb"}, {"type": "gpu", "profile": None},
                          {"type": "mig", "profile": "1g.5gb"}]) == {
        "gpu.nvidia.com/gpu": 1, "gpu.nvidia.com/mig-1g.5gb": 2}


@pytest.mark.parametrize(("text", "message"), [
    ("version: v1\nnode: n\ndraDevices: {nvidia.com/gpu: 1}\n",
     "gpu-decl.draDevices: 'nvidia.com/gpu' is not a gpu.nvidia.com/ device kind"),
    ("version: v1\nnode: n\ndraDevices: {gpu.nvidia.com/gpu: -2}\n",
     "gpu-decl.draDevices.gpu.nvidia.com/gpu: -2 is not a count >= 0"),
    ("version: v1\nnode: n\ndraDevices: [gpu]\n",
     "gpu-decl.draDevices: ['gpu'] is not a mapping of names to counts"),
    ("version: v1\nnode: n\nresources: {nvidia.com/gpu: 1}\ndraDevices: {}\n",
     "gpu-decl.resources: {'nvidia.com/gpu': 1} on a DRA node (draDevices)"),
    ("version: v1\nnode: n\ndevicePluginConfig: ts\ndraDevices: {}\n",
     "gpu-decl.devicePluginConfig: 'ts' on a DRA node (draDevices)"),
])
def test_bad_dra_entries_are_one_line_naming_field_and_value(text: str, message: str) -> None:
    with pytest.raises(nd.DeclarationError) as err:
        nd.parse(text, "gpu-decl")
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value)


def test_serves_reads_dra_kinds_back_from_the_condition() -> None:
    kinds = {nd.dra_kind("gpu"): 1, nd.dra_kind("mig", "3g.20gb"): 2}
    cond = {"status": "False", "message": nd.served_message("n", kinds)}
    assert nd.serves(cond, "n", kinds)
    assert not nd.serves(cond, "n", {nd.dra_kind("gpu"): 1})
    assert not nd.serves({**cond, "status": "True"}, "n", kinds)
