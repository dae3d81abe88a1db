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
