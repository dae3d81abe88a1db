"""The agent image's tag against the collection's version (gpukit.provision.image_version)."""

from __future__ import annotations

import pytest

from gpukit.provision.image_version import (
    PINNED_VARIABLE,
    check,
    digest,
    reference_problem,
    release_version,
    tag,
)


@pytest.mark.parametrize(("image", "expected"), [
    ("gpukit-node-agent:0.1.0", "0.1.0"),
    ("registry.example.com:5000/team/gpukit-node-agent:v1.2.3", "1.2.3"),
    ("registry.example.com:5000/gpukit-node-agent:1.2.3-rc1@sha256:" + "a" * 64, "1.2.3-rc1"),
    ("localhost/gpukit-lab/node-agent:dev", None),
    ("registry.example.com:5000/gpukit-node-agent", None),  # the port is no tag
    ("gpukit-node-agent@sha256:" + "b" * 64, None),
    ("gpukit-node-agent:latest", None),
    ("gpukit-node-agent:1.2", None),
])  # fmt: skip
def test_release_version_is_a_tag_that_names_one(image: str, expected: str | None) -> None:
    assert release_version(image) == expected


def test_tag_is_not_a_registry_port() -> None:
    assert tag("host:5000/a/b") is None and tag("host:5000/a/b:x") == "x"


def test_the_collections_version_passes() -> None:
    v = check("gpukit-node-agent:0.1.0", "0.1.0")
    assert v.problem is None and v.warning is None


def test_another_release_is_one_line_naming_the_variable_and_both_versions() -> None:
    v = check("gpukit-node-agent:0.0.9", "0.1.0")
    assert v.warning is None
    assert v.problem == ("gpukit_device_plugin_image: 'gpukit-node-agent:0.0.9' is version 0.0.9,"
                         " the collection gpukit.gpu is 0.1.0; use the image of version 0.1.0, or"
                         f" set {PINNED_VARIABLE}: true to deploy this one on purpose")  # fmt: skip
    assert "\n" not in v.problem


def test_pinned_another_release_is_a_warning() -> None:
    v = check("gpukit-node-agent:0.0.9", "0.1.0", pinned=True)
    assert v.problem is None and v.warning is not None and "0.0.9" in v.warning


def test_a_tag_that_is_no_release_is_a_warning_and_a_long_ref_is_cut() -> None:
    v = check("localhost/gpukit-lab/node-agent:dev", "0.1.0")
    assert v.problem is None and v.warning is not None
    assert v.warning.startswith("gpukit_device_plugin_image: 'localhost/gpukit-lab/node-agent:dev'"
                                " is not tagged with a release version")  # fmt: skip
    long = check("r/" + "x" * 200 + ":dev", "0.1.0")
    assert long.warning is not None and len(long.warning) < 400


def test_no_image_is_left_to_the_role() -> None:
    assert check("", "0.1.0") == check("", "0.1.0", pinned=True)
    assert check("", "0.1.0").problem is None and check("", "0.1.0").warning is None


DIGEST = "sha256:" + "0123456789abcdef" * 4


@pytest.mark.parametrize(("image", "by_digest"), [
    ("gpukit-node-agent:0.1.0", None),
    ("localhost/gpukit-lab/node-agent:dev", None),
    ("10.244.77.1:5000/gpukit-node-agent:0.1.0", None),
    (f"10.244.77.1:5000/gpukit-node-agent@{DIGEST}", DIGEST),
    (f"registry.example.com:5000/team/gpukit-node-agent:0.1.0@{DIGEST}", DIGEST),
    ("registry.example.com/a__b/c-d.e_f", None),
])  # fmt: skip
def test_references_by_tag_or_digest(image: str, by_digest: str | None) -> None:
    assert reference_problem(image) is None
    assert digest(image) == by_digest


@pytest.mark.parametrize("image", [
    "Gpukit-Node-Agent:0.1.0",  # upper case in the repository path
    "gpukit-node-agent@sha256:abc",  # a short digest
    "gpukit-node-agent@md5:" + "a" * 32,  # not sha256
    f"gpukit-node-agent@{DIGEST.upper()}",
    "gpukit-node-agent:",
    "gpukit-node-agent:0.1.0 ",
    "reg:5000//gpukit-node-agent",
    "/gpukit-node-agent",
    "gpukit-node-agent:" + "t" * 129,  # a tag of at most 128 characters
    "r/" + "x" * 300,  # a name of at most 255
])  # fmt: skip
def test_a_malformed_reference_is_one_line_naming_the_variable_and_value(image: str) -> None:
    line = reference_problem(image)
    shown = image if len(image) <= 200 else image[:197] + "..."
    assert line == (f"gpukit_device_plugin_image: {shown!r} is not an image reference (expected"
                    " [registry[:port]/]name[:tag] or ...@sha256:<64 hex digits>)")  # fmt: skip
    # The preflight refuses it, pinned or not.
    assert check(image, "0.1.0").problem == line == check(image, "0.1.0", pinned=True).problem
