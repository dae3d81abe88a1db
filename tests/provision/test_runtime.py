"""containerd and CRI-O config edits: the runtime, default, CDI; the rest and comments kept."""

from __future__ import annotations

import tomllib

import pytest

from gpukit.provision import runtime
from gpukit.provision.runtime import RuntimeConfigError, RuntimeSettings

# A cluster installer's containerd 1.7 config (as the lab writes one).
LAB = """\
# Written by the gpukit lab when it prepared this node (as a cluster installer would).
version = 2

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "localhost/gpukit-lab/pause:3.10"
  # The lab VM lacks CAP_SYS_RESOURCE: without this every sandbox fails.
  restrict_oom_score_adj = true
  enable_cdi = true
  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "/etc/cni/net.d"
"""
V2_RUNC = 'plugins."io.containerd.grpc.v1.cri".containerd.runtimes'
V3 = """\
version = 3
# my comment stays
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
    SystemdCgroup = true
"""


def cri(text: str, version: int = 2) -> dict:  # type: ignore[type-arg]
    key = runtime.CRI_V2 if version == 2 else runtime.CRI_RUNTIME_V3
    return tomllib.loads(text)["plugins"][key]  # type: ignore[no-any-return]


def test_v2_adds_the_runtime_and_keeps_everything_else() -> None:
    edit = runtime.configure_containerd(LAB, RuntimeSettings(), "/etc/containerd/config.toml")
    assert edit.changed
    c = cri(edit.after or "")
    nvidia = c["containerd"]["runtimes"]["nvidia"]
    assert nvidia["runtime_type"] == "io.containerd.runc.v2"
    assert nvidia["options"] == {"BinaryName": "/usr/bin/nvidia-container-runtime",
                                 "SystemdCgroup": False}  # fmt: skip
    assert c["containerd"]["default_runtime_name"] == "runc"
    assert c["sandbox_image"] == "localhost/gpukit-lab/pause:3.10"
    assert c["restrict_oom_score_adj"] is True
    assert "# The lab VM lacks CAP_SYS_RESOURCE: without this every sandbox fails." in edit.after  # type: ignore[operator]
    # Only additions: every original line is still there, in order.
    before = LAB.splitlines()
    after = (edit.after or "").splitlines()
    it = iter(after)
    assert all(line in it for line in before)
    assert edit.changes == (f"{V2_RUNC}.nvidia: added (runc v2 shim, BinaryName "
                            "/usr/bin/nvidia-container-runtime)",)  # fmt: skip


def test_v2_edit_is_idempotent_byte_for_byte() -> None:
    once = runtime.configure_containerd(LAB, RuntimeSettings(), "c").after or ""
    twice = runtime.configure_containerd(once, RuntimeSettings(), "c")
    assert not twice.changed and twice.after == once and twice.changes == ()


def test_default_runtime_on_and_back_off() -> None:
    on = runtime.configure_containerd(LAB, RuntimeSettings(set_as_default=True), "c")
    assert cri(on.after or "")["containerd"]["default_runtime_name"] == "nvidia"
    off = runtime.configure_containerd(on.after, RuntimeSettings(set_as_default=False), "c")
    assert cri(off.after or "")["containerd"]["default_runtime_name"] == "runc"
    assert off.changes == (
        "plugins.\"io.containerd.grpc.v1.cri\".containerd.default_runtime_name: 'nvidia' -> 'runc'",
    )


def test_cdi_is_enabled_and_spec_dirs_are_added_not_replaced() -> None:
    text = 'version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n  cdi_spec_dirs = ["/opt/cdi"]\n'
    edit = runtime.configure_containerd(text, RuntimeSettings(), "c")
    c = cri(edit.after or "")
    assert c["enable_cdi"] is True
    assert c["cdi_spec_dirs"] == ["/opt/cdi", "/etc/cdi", "/var/run/cdi"]


def test_drifted_runtime_options_are_repaired() -> None:
    once = runtime.configure_containerd(LAB, RuntimeSettings(), "c").after or ""
    drifted = once.replace('BinaryName = "/usr/bin/nvidia-container-runtime"',
                           'BinaryName = "/usr/local/bin/other"')  # fmt: skip
    edit = runtime.configure_containerd(drifted, RuntimeSettings(), "c")
    assert edit.after == once
    assert edit.changes == (
        f"{V2_RUNC}.nvidia.options.BinaryName: '/usr/local/bin/other' -> "
        "'/usr/bin/nvidia-container-runtime'",
    )


def test_v3_uses_the_cri_runtime_plugin_and_keeps_comments() -> None:
    edit = runtime.configure_containerd(V3, RuntimeSettings(set_as_default=True), "c")
    c = cri(edit.after or "", 3)
    assert c["enable_cdi"] is True
    assert c["containerd"]["default_runtime_name"] == "nvidia"
    assert c["containerd"]["runtimes"]["nvidia"]["options"]["SystemdCgroup"] is True
    assert "# my comment stays" in (edit.after or "")
    assert tomllib.loads(edit.after or "")["plugins"]["io.containerd.cri.v1.images"] == {
        "snapshotter": "overlayfs"
    }


def test_missing_file_starts_as_version_2() -> None:
    edit = runtime.configure_containerd(None, RuntimeSettings(), "c")
    assert edit.before is None
    assert tomllib.loads(edit.after or "")["version"] == 2


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[plugins.cri]\n", "config version 1"),
        ("version = 9\n", "version = 9 is not a containerd config version"),
        ("version = true\n", "version = True is not a containerd config version"),
        ("version = [\n", "not valid TOML"),
        ("[crio.runtime]\n", r"not a containerd config \(a CRI-O config\?\): unknown top-level keys crio"),
        ("version = 2\nplugins = 1\n", "`plugins` is not a table"),
        ('version = 3\ndisabled_plugins = ["io.containerd.cri.v1.runtime"]\n', "turns off the CRI"),
    ],
)  # fmt: skip
def test_unsupported_files_are_refused_with_what_to_do(text: str, needle: str) -> None:
    with pytest.raises(RuntimeConfigError, match=needle):
        runtime.configure_containerd(text, RuntimeSettings(), "/etc/containerd/config.toml")


def test_v2_dropin_carries_the_whole_cri_table() -> None:
    d = runtime.containerd_dropin(LAB, RuntimeSettings(), "/etc/containerd/config.toml", "d")
    c = cri(d.after or "")
    assert tomllib.loads(d.after or "")["version"] == 2
    assert c["sandbox_image"] == "localhost/gpukit-lab/pause:3.10"
    assert c["cni"]["bin_dir"] == "/usr/lib/cni"
    assert "nvidia" in c["containerd"]["runtimes"]


def test_v3_dropin_holds_only_the_edits() -> None:
    d = runtime.containerd_dropin(V3, RuntimeSettings(), "m", "d")
    doc = tomllib.loads(d.after or "")
    assert doc["version"] == 3 and set(doc["plugins"]) == {runtime.CRI_RUNTIME_V3}
    c = cri(d.after or "", 3)
    assert c["containerd"] == {"runtimes": {"nvidia": {
        "runtime_type": "io.containerd.runc.v2",
        "options": {"SystemdCgroup": True, "BinaryName": "/usr/bin/nvidia-container-runtime"}}}}
    assert c["enable_cdi"] is True and c["cdi_spec_dirs"] == ["/etc/cdi", "/var/run/cdi"]


def test_a_dropin_builds_on_the_files_loaded_before_it() -> None:
    """containerd 2 replaces arrays: the drop-in keeps the spec dirs configured before it; a
    default runtime set before it to `nvidia` is put back to runc (set_as_default false)."""
    other = (f'version = 3\n[plugins."{runtime.CRI_RUNTIME_V3}"]\n  cdi_spec_dirs = ["/opt/cdi"]\n'
             f'[plugins."{runtime.CRI_RUNTIME_V3}".containerd]\n  default_runtime_name = "nvidia"\n')
    d = runtime.containerd_dropin(V3, RuntimeSettings(), "m", "d", [("o", other)])
    c = cri(d.after or "", 3)
    assert c["cdi_spec_dirs"] == ["/opt/cdi", "/etc/cdi", "/var/run/cdi"]
    assert c["containerd"]["default_runtime_name"] == "runc"
    # containerd 1.7: the CRI table of the last file before the drop-in is the one it replaces.
    v2 = runtime.containerd_dropin(LAB, RuntimeSettings(), "m", "d", [("o", LAB.replace(
        "pause:3.10", "pause:9"))])
    assert cri(v2.after or "")["sandbox_image"] == "localhost/gpukit-lab/pause:9"
    assert "this is o's" in (v2.after or "")


def test_ensure_import_adds_the_pattern_after_version_once() -> None:
    e = runtime.ensure_import(LAB, "/etc/containerd/conf.d/*.toml", "m")
    assert tomllib.loads(e.after or "")["imports"] == ["/etc/containerd/conf.d/*.toml"]
    assert (e.after or "").splitlines()[2] == 'imports = ["/etc/containerd/conf.d/*.toml"]'
    again = runtime.ensure_import(e.after or "", "/etc/containerd/conf.d/*.toml", "m")
    assert not again.changed
    other = runtime.ensure_import('version = 2\nimports = ["/a.toml"]\n', "/b/*.toml", "m")
    assert tomllib.loads(other.after or "")["imports"] == ["/a.toml", "/b/*.toml"]


def test_crio_dropin() -> None:
    d = runtime.crio_dropin(RuntimeSettings(set_as_default=True), "/etc/crio/crio.conf.d/x.conf")
    doc = tomllib.loads(d.after or "")["crio"]["runtime"]
    assert doc["default_runtime"] == "nvidia"
    assert doc["runtimes"]["nvidia"]["runtime_path"] == "/usr/bin/nvidia-container-runtime"
    assert doc["cdi_spec_dirs"] == ["/etc/cdi", "/var/run/cdi"]
    same = runtime.with_current(d, d.after)
    assert not same.changed and same.changes == ()
    new = runtime.with_current(d, None)
    assert new.changes[0] == "/etc/crio/crio.conf.d/x.conf: created"


def test_diff_output() -> None:
    edit = runtime.configure_containerd(LAB, RuntimeSettings(), "/etc/containerd/config.toml")
    diff = edit.unified_diff()
    assert diff.startswith("--- /etc/containerd/config.toml\n+++ /etc/containerd/config.toml\n")
    assert '+    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]' in diff
    assert edit.ansible_diff()["before"] == LAB
