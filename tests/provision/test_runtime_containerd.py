"""gpukit's containerd configs judged by real containerd: 2.2.9 for config version 3, 1.7.35
for version 2 (the fixtures in tests/provision/conftest.py build them when missing). Every assertion on the
outcome reads `containerd config dump` of the files on disk, run here directly (not through
gpukit's staging), not the files' text."""

from __future__ import annotations

import re
import subprocess
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpukit.provision import containerd, runtime_plan
from gpukit.provision.runtime import CRI_RUNTIME_V3, CRI_V2, RuntimeConfigError, RuntimeSettings
from gpukit.provision.runtime_plan import ContainerdPlan

NVIDIA = "/usr/bin/nvidia-container-runtime"
MODES = list(runtime_plan.CONTAINERD_MODES)

# What a cluster installer writes: runc with the systemd cgroup driver, settings of its own.
MAIN = {
    2: """\
# Written by the cluster installer.
version = 2

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "localhost/pause:3.10"
  # sandboxes fail without this here
  restrict_oom_score_adj = true

  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = true
""",
    3: """\
# Written by the cluster installer.
version = 3

[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = "localhost/pause:3.10"

[plugins."io.containerd.cri.v1.runtime"]
  # sandboxes fail without this here
  restrict_oom_score_adj = true

  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"

    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        SystemdCgroup = true
""",
}
CRI = {2: CRI_V2, 3: CRI_RUNTIME_V3}


def foreign_dropin(version: int) -> str:
    """Another tool's drop-in: a kata runtime (under containerd 1.7 its CRI table replaces
    the main file's whole table, so it repeats the installer's settings it needs)."""
    if version == 3:
        return ('# kata-deploy\nversion = 3\n[plugins."io.containerd.cri.v1.runtime"'
                '.containerd.runtimes.kata]\n  runtime_type = "io.containerd.kata.v2"\n')  # fmt: skip
    return MAIN[2].replace("# Written by the cluster installer.", "# kata-deploy").replace(
        'default_runtime_name = "runc"\n',
        'default_runtime_name = "runc"\n    [plugins."io.containerd.grpc.v1.cri".containerd'
        '.runtimes.kata]\n      runtime_type = "io.containerd.kata.v2"\n',
    )


def dump(binary: Path, main: Path) -> dict[str, Any]:
    """containerd's effective config of the files on disk, from containerd itself."""
    r = subprocess.run([str(binary), "--config", str(main), "config", "dump"],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stderr
    return tomllib.loads(r.stdout)


def cri(d: dict[str, Any]) -> dict[str, Any]:
    """The CRI runtime table of a dump (containerd 2 prints version 3, 1.7 version 2)."""
    table: dict[str, Any] = d["plugins"][CRI[int(d["version"])]]
    return table


def sandbox(d: dict[str, Any]) -> str:
    if d["version"] == 3:
        return str(d["plugins"]["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"])
    return str(cri(d)["sandbox_image"])


@dataclass
class Node:
    """A node's /etc/containerd in a temporary directory."""

    root: Path
    binary: Path | None

    @property
    def main(self) -> Path:
        return self.root / "config.toml"

    @property
    def dropin(self) -> Path:
        return self.root / "conf.d" / "99-gpukit-nvidia.toml"

    def plan(self, mode: str = "in_place", **settings: Any) -> ContainerdPlan:
        return runtime_plan.plan_containerd(
            RuntimeSettings(**settings), mode=mode, main_path=str(self.main),
            dropin_path=str(self.dropin), import_pattern=str(self.root / "conf.d/*.toml"),
            binary=str(self.binary) if self.binary else None,
        )  # fmt: skip

    def apply(self, mode: str = "in_place", **settings: Any) -> ContainerdPlan:
        """Plan, then write as the module does."""
        plan = self.plan(mode, **settings)
        for e in plan.changed:
            if e.after is None:
                Path(e.path).unlink()
            else:
                Path(e.path).parent.mkdir(parents=True, exist_ok=True)
                Path(e.path).write_text(e.after)
        return plan

    def dump(self) -> dict[str, Any]:
        assert self.binary
        return dump(self.binary, self.main)

    def files(self) -> dict[str, bytes]:
        return {str(p.relative_to(self.root)): p.read_bytes()
                for p in sorted(self.root.rglob("*")) if p.is_file()}  # fmt: skip


@pytest.fixture
def node(tmp_path: Path, config_version: int, containerd_bin: Path) -> Node:
    (tmp_path / "conf.d").mkdir()
    n = Node(tmp_path, containerd_bin)
    n.main.write_text(MAIN[config_version])
    return n


@pytest.mark.parametrize("mode", MODES)
def test_the_dump_has_the_runtime_after_and_not_before(node: Node, mode: str,
                                                       config_version: int) -> None:  # fmt: skip
    before = node.dump()
    assert "nvidia" not in cri(before)["containerd"]["runtimes"]
    plan = node.apply(mode)
    assert plan.restart_needed and plan.judge.startswith(f"containerd config dump ({node.binary}")
    assert f"plugins.{CRI[config_version]}.containerd.runtimes.nvidia: added" in plan.effective_changes
    after = node.dump()
    assert after["version"] == config_version
    c = cri(after)
    nvidia = c["containerd"]["runtimes"]["nvidia"]
    assert nvidia["runtime_type"] == "io.containerd.runc.v2"
    assert nvidia["options"]["BinaryName"] == NVIDIA
    assert nvidia["options"]["SystemdCgroup"] is True  # runc's, copied
    assert c["containerd"]["default_runtime_name"] == "runc"
    # The installer's settings still hold.
    assert c["restrict_oom_score_adj"] is True and sandbox(after) == "localhost/pause:3.10"
    assert c["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is True
    if mode == "drop_in":
        # The installer's file gains the import and nothing else; the drop-in has its version.
        added = f'imports = ["{node.root}/conf.d/*.toml"]\n'
        lines = MAIN[config_version].splitlines(keepends=True)
        assert node.main.read_text() == "".join([*lines[:2], added, *lines[2:]])
        assert tomllib.loads(node.dropin.read_text())["version"] == config_version
    else:
        assert "# sandboxes fail without this here" in node.main.read_text()
        assert not node.dropin.exists()
    # A second run: nothing to write, nothing to restart.
    again = node.plan(mode)
    assert not again.changed and not again.restart_needed and again.effective_changes == ()


@pytest.mark.parametrize("mode", MODES)
def test_default_runtime_switch_is_seen_in_the_dump(node: Node, mode: str) -> None:
    on = node.apply(mode, set_as_default=True)
    assert on.restart_needed
    assert cri(node.dump())["containerd"]["default_runtime_name"] == "nvidia"
    off = node.apply(mode, set_as_default=False)
    assert off.restart_needed and any("default_runtime_name: 'nvidia' -> 'runc'" in c
                                      for c in off.effective_changes)  # fmt: skip
    d = node.dump()
    assert cri(d)["containerd"]["default_runtime_name"] == "runc"
    assert "nvidia" in cri(d)["containerd"]["runtimes"]


@pytest.mark.parametrize("mode", MODES)
def test_cdi_is_on_with_the_spec_dirs_added_to_the_configured_ones(
    node: Node, mode: str, config_version: int
) -> None:
    text = node.main.read_text().replace(
        "  restrict_oom_score_adj = true\n",
        '  restrict_oom_score_adj = true\n  enable_cdi = false\n  cdi_spec_dirs = ["/opt/cdi"]\n',
    )
    node.main.write_text(text)
    assert cri(node.dump())["enable_cdi"] is False
    node.apply(mode, cdi_spec_dirs=("/etc/cdi", "/var/run/cdi", "/srv/cdi"))
    c = cri(node.dump())
    assert c["enable_cdi"] is True
    assert c["cdi_spec_dirs"] == ["/opt/cdi", "/etc/cdi", "/var/run/cdi", "/srv/cdi"]


def test_a_foreign_dropin_is_kept_and_the_dump_has_both(node: Node, config_version: int) -> None:
    foreign = node.root / "conf.d" / "50-kata.toml"
    foreign.write_text(foreign_dropin(config_version))
    node.main.write_text(
        node.main.read_text().replace("\n\n", f'\nimports = ["{node.root}/conf.d/*.toml"]\n\n', 1)
    )
    kept = foreign.read_bytes()
    assert "kata" in cri(node.dump())["containerd"]["runtimes"]
    node.apply("drop_in")
    assert foreign.read_bytes() == kept
    c = cri(node.dump())
    assert {"kata", "nvidia", "runc"} <= set(c["containerd"]["runtimes"])
    assert c["restrict_oom_score_adj"] is True
    assert c["containerd"]["runtimes"]["nvidia"]["options"]["SystemdCgroup"] is True
    assert not node.plan("drop_in").changed
    if config_version == 2:
        # containerd 1.7 would replace the kata table: the drop-in carries it (and says whose).
        assert f"this is {foreign}'s" in node.dropin.read_text()


def nvidia_dropin(version: int, default: bool = True) -> str:
    """A drop-in as NVIDIA's toolkit writes one (conf.d/99-nvidia.toml, which containerd loads
    after gpukit's 99-gpukit-nvidia.toml): the runtime and its CDI variant, the default."""
    root = CRI[version]
    text = f'version = {version}\n\n[plugins."{root}"]\n  enable_cdi = true\n'
    if default:
        text += f'\n[plugins."{root}".containerd]\n  default_runtime_name = "nvidia"\n'
    for name, binary in (("nvidia", NVIDIA), ("nvidia-cdi", NVIDIA + ".cdi")):
        text += (f'\n[plugins."{root}".containerd.runtimes.{name}]\n'
                 '  runtime_type = "io.containerd.runc.v2"\n'
                 f'[plugins."{root}".containerd.runtimes.{name}.options]\n'
                 f'  BinaryName = "{binary}"\n  SystemdCgroup = true\n')  # fmt: skip
    return text


def importing(node: Node) -> None:
    node.main.write_text(
        node.main.read_text().replace("\n\n", f'\nimports = ["{node.root}/conf.d/*.toml"]\n\n', 1)
    )


def test_nvidias_own_dropin_is_replaced_in_drop_in_mode(node: Node, config_version: int) -> None:
    """NVIDIA's drop-in sorts after gpukit's and would win (here: nvidia as the default the
    inventory does not declare). gpukit takes its place and keeps its text aside, where the
    import does not read it."""
    replaced_and_kept_aside(node, config_version)


def test_a_version_2_nvidia_dropin_under_containerd_2_is_replaced(
    tmp_path: Path, containerd_for: Callable[[int], Path]
) -> None:
    """Written for containerd 1.7: containerd 2 would drop its runtimes (mixed versions).
    In place that is refused by name; as a drop-in, gpukit's version-3 one replaces it."""
    (tmp_path / "conf.d").mkdir()
    n = Node(tmp_path, containerd_for(3))
    n.main.write_text(MAIN[3])
    (tmp_path / "conf.d" / "99-nvidia.toml").write_text(nvidia_dropin(2))
    importing(n)
    with pytest.raises(RuntimeConfigError, match=r"99-nvidia\.toml \(imported\) has version = 2"):
        n.plan("in_place")
    replaced_and_kept_aside(n, 2)


def replaced_and_kept_aside(node: Node, written_for: int) -> None:
    theirs = node.root / "conf.d" / "99-nvidia.toml"
    if not theirs.exists():
        theirs.write_text(nvidia_dropin(written_for))
        importing(node)
    plan = node.apply("drop_in")
    assert not theirs.exists()
    aside = Path(str(theirs) + ".replaced-by-gpukit")
    assert aside.read_text() == nvidia_dropin(written_for)
    assert any(c.startswith(f"{theirs} defines the `nvidia` runtime too") and
               f"replaced by {node.dropin}" in c for e in plan.edits for c in e.changes)  # fmt: skip
    c = cri(node.dump())
    assert c["containerd"]["default_runtime_name"] == "runc"
    assert c["containerd"]["runtimes"]["nvidia"]["options"]["BinaryName"] == NVIDIA
    assert c["restrict_oom_score_adj"] is True and "runc" in c["containerd"]["runtimes"]
    assert not node.plan("drop_in").changed


def test_a_dropin_with_the_runtime_and_other_settings_is_refused_by_name(node: Node,
                                                                         config_version: int) -> None:  # fmt: skip
    theirs = node.root / "conf.d" / "99-nvidia.toml"
    root = CRI[config_version]
    theirs.write_text(nvidia_dropin(config_version) +
                      f'\n[plugins."{root}".containerd.runtimes.kata]\n'
                      '  runtime_type = "io.containerd.kata.v2"\n')  # fmt: skip
    importing(node)
    before = node.files()
    with pytest.raises(RuntimeConfigError) as e:
        node.plan("drop_in")
    msg = str(e.value)
    assert msg.startswith(f"{theirs} defines the `nvidia` runtime too")
    assert f"plugins.{root}.containerd.runtimes.kata" in msg and "Nothing was changed" in msg
    assert node.files() == before


def test_in_place_a_second_definition_is_reported(node: Node, config_version: int) -> None:
    theirs = node.root / "conf.d" / "99-nvidia.toml"
    theirs.write_text(nvidia_dropin(config_version, default=False))
    importing(node)
    if config_version == 2:
        # containerd 1.7: its CRI table replaces the main file's whole (runc's options gone).
        with pytest.raises(RuntimeConfigError, match=re.escape(
                f"{theirs} sets plugins.{CRI_V2}.enable_cdi, ")):  # fmt: skip
            node.plan("in_place")
        return
    plan = node.apply("in_place")
    assert [w.split(":")[0] for w in plan.warnings] == [
        f"{theirs} defines the `nvidia` runtime too (plugins.{CRI[config_version]}.enable_cdi, "
        f"plugins.{CRI[config_version]}.containerd.runtimes.nvidia, "
        f"plugins.{CRI[config_version]}.containerd.runtimes.nvidia-cdi), loaded after {node.main}"
    ]
    assert "container_toolkit_containerd_mode: drop_in" in plan.warnings[0]
    assert theirs.read_text() == nvidia_dropin(config_version, default=False)


def test_an_edit_that_containerd_does_not_see_needs_no_restart(node: Node) -> None:
    """A drop-in whose text differs from gpukit's only in comments and layout is rewritten,
    and containerd is not restarted for it."""
    node.apply("drop_in")
    rendered = node.dropin.read_text()
    node.dropin.write_text("# an older gpukit's header\n" + rendered.replace(" = ", "="))
    plan = node.plan("drop_in")
    assert [e.path for e in plan.changed] == [str(node.dropin)]
    assert not plan.restart_needed and plan.effective_changes == ()
    node.apply("drop_in")
    assert node.dropin.read_text() == rendered


def test_containerd_2_defaults_need_no_restart(tmp_path: Path, containerd_for: Callable[[int], Path]) -> None:
    """containerd 2 has CDI on by default, with these spec dirs: writing them down changes
    the file but not the effective config."""
    n = Node(tmp_path, containerd_for(3))
    n.main.write_text(MAIN[3])
    n.apply()
    text = n.main.read_text().replace("enable_cdi = true\n", "")
    n.main.write_text(text.replace('cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]\n', ""))
    plan = n.plan()
    assert plan.changed and not plan.restart_needed, plan


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("version = 3\n[plugins\n", "not valid TOML"),
        ('[crio.runtime]\ndefault_runtime = "runc"\n', "not a containerd config (a CRI-O config?)"),
        ("version = 4\n[plugins]\n", "version = 4 is not a containerd config version"),
        ('[plugins.cri]\n  sandbox_image = "x"\n', "config version 1 (no `version` key)"),
        ('version = 2\ndisabled_plugins = ["io.containerd.grpc.v1.cri"]\n', "turns off the CRI"),
    ],
    ids=["malformed", "crio", "version-4", "version-1", "cri-disabled"],
)  # fmt: skip
def test_a_file_gpukit_cannot_edit_is_refused_and_left_as_it_was(
    node: Node, mode: str, text: str, needle: str
) -> None:
    node.main.write_text(text)
    before = node.files()
    with pytest.raises(RuntimeConfigError, match=re.escape(needle)) as e:
        node.plan(mode)
    assert str(e.value).startswith(str(node.main))
    assert node.files() == before


def test_files_of_mixed_versions_are_refused(tmp_path: Path, containerd_for: Callable[[int], Path]) -> None:
    n = Node(tmp_path, containerd_for(3))
    n.main.write_text(MAIN[3].replace("\n\n", f'\nimports = ["{tmp_path}/conf.d/*.toml"]\n\n', 1))
    other = tmp_path / "conf.d" / "50-other.toml"
    other.parent.mkdir()
    other.write_text(foreign_dropin(2))
    before = n.files()
    with pytest.raises(RuntimeConfigError, match=r"version = 2 but .* has version = 3"):
        n.plan("drop_in")
    assert n.files() == before


def test_containerd_2_merges_mixed_versions_wrongly(tmp_path: Path, containerd_for: Callable[[int], Path]) -> None:
    """Why a drop-in has the main file's version: real containerd 2 drops the runtimes of a
    version-2 drop-in under a version-3 main file, and the CRI settings of a version-2 main
    file under a version-3 drop-in."""
    binary = containerd_for(3)
    d = tmp_path / "conf.d"
    d.mkdir()
    nvidia_v2 = ('version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]\n'
                 '  runtime_type = "io.containerd.runc.v2"\n')  # fmt: skip
    (d / "99.toml").write_text(nvidia_v2)
    main = tmp_path / "config.toml"
    main.write_text(MAIN[3].replace("\n\n", f'\nimports = ["{d}/*.toml"]\n\n', 1))
    assert "nvidia" not in cri(dump(binary, main))["containerd"]["runtimes"]
    (d / "99.toml").write_text(nvidia_v2.replace("version = 2", "version = 3")
                               .replace("io.containerd.grpc.v1.cri", CRI_RUNTIME_V3))  # fmt: skip
    main.write_text(MAIN[2].replace("\n\n", f'\nimports = ["{d}/*.toml"]\n\n', 1))
    c = cri(dump(binary, main))
    assert "nvidia" in c["containerd"]["runtimes"] and c["restrict_oom_score_adj"] is False


@pytest.mark.parametrize("version", [2, 3])
def test_how_each_containerd_merges_an_import(
    tmp_path: Path, version: int, containerd_for: Callable[[int], Path]
) -> None:
    """gpukit.provision.containerd's claims: containerd 1.7 replaces a plugin's whole table
    with an imported one, containerd 2 merges them key by key (arrays replaced), also for
    version-2 files, which it migrates."""
    (tmp_path / "d").mkdir()
    root = CRI[version]
    (tmp_path / "d/x.toml").write_text(
        f'version = {version}\n[plugins."{root}"]\n  cdi_spec_dirs = ["/x"]\n'
    )  # fmt: skip
    main = tmp_path / "config.toml"
    main.write_text(MAIN[version].replace("\n\n", f'\nimports = ["{tmp_path}/d/*.toml"]\n\n', 1))
    for reader in sorted({version, 3}):  # containerd 1.7 reads version 2 only
        d = dump(containerd_for(reader), main)
        c = cri(d)
        assert c["cdi_spec_dirs"] == ["/x"]
        merged = reader == 3
        assert (c["restrict_oom_score_adj"] is True) is merged, reader
        assert (sandbox(d) == "localhost/pause:3.10") is merged, reader


@pytest.mark.parametrize("mode", MODES)
def test_containerd_2_migrates_a_version_2_file(tmp_path: Path, mode: str, containerd_for: Callable[[int], Path]) -> None:
    n = Node(tmp_path, containerd_for(3))
    (tmp_path / "conf.d").mkdir()
    n.main.write_text(MAIN[2])
    plan = n.apply(mode)
    assert f"plugins.{CRI_RUNTIME_V3}.containerd.runtimes.nvidia: added" in plan.effective_changes
    d = n.dump()
    assert d["version"] == 3 and sandbox(d) == "localhost/pause:3.10"
    assert cri(d)["containerd"]["runtimes"]["nvidia"]["options"]["BinaryName"] == NVIDIA
    assert tomllib.loads(n.main.read_text())["version"] == 2  # the file stays version 2


def test_a_new_file_takes_the_version_of_the_nodes_containerd(node: Node,
                                                              config_version: int) -> None:  # fmt: skip
    node.main.unlink()
    plan = node.apply()
    assert plan.restart_needed
    assert tomllib.loads(node.main.read_text())["version"] == config_version
    assert "nvidia" in cri(node.dump())["containerd"]["runtimes"]


def test_a_file_loaded_later_that_overrides_the_runtime_is_refused(node: Node,
                                                                   config_version: int) -> None:  # fmt: skip
    """In place, the main file's settings lose to an import: the dump shows it, so nothing
    is written and the error says which files containerd loads."""
    later = node.root / "conf.d" / "50-kata.toml"
    # containerd 1.7: the whole CRI table is replaced; containerd 2: the default is.
    later.write_text(foreign_dropin(2) if config_version == 2 else
                     f'version = 3\n[plugins."{CRI_RUNTIME_V3}".containerd]\n'
                     '  default_runtime_name = "runc"\n')  # fmt: skip
    node.main.write_text(
        node.main.read_text().replace("\n\n", f'\nimports = ["{node.root}/conf.d/*.toml"]\n\n', 1)
    )
    before = node.files()
    with pytest.raises(RuntimeConfigError, match="default_runtime_name is 'runc'") as e:
        node.plan(set_as_default=True)
    assert f"{later} sets plugins.{CRI[config_version]}" in str(e.value)
    assert "Nothing was changed" in str(e.value)
    assert node.files() == before


def test_the_dropin_must_be_read_by_the_import(node: Node) -> None:
    with pytest.raises(RuntimeConfigError, match="is not matched by import"):
        runtime_plan.plan_containerd(RuntimeSettings(), mode="drop_in", main_path=str(node.main),
                                     dropin_path=str(node.root / "elsewhere.toml"),
                                     import_pattern=str(node.root / "conf.d/*.toml"),
                                     binary=str(node.binary))  # fmt: skip


def test_switching_back_to_in_place_removes_gpukits_dropin(node: Node) -> None:
    node.apply("drop_in", set_as_default=True)
    plan = node.apply("in_place")
    assert not node.dropin.exists() and str(node.dropin) in [e.path for e in plan.changed]
    c = cri(node.dump())
    assert c["containerd"]["default_runtime_name"] == "runc" and "nvidia" in c["containerd"]["runtimes"]


def test_without_a_binary_gpukit_reads_the_files(tmp_path: Path) -> None:
    """No containerd on the node: a restart whenever a loaded file parses differently, and
    gpukit's own merge catches an override."""
    n = Node(tmp_path, None)
    (tmp_path / "conf.d").mkdir()
    n.main.write_text(MAIN[3])
    first = n.apply("drop_in")
    assert first.restart_needed and first.judge.startswith("gpukit's reading")
    n.dropin.write_text("# reformatted\n" + n.dropin.read_text().replace(" = ", "="))
    plan = n.plan("drop_in")
    assert plan.changed and not plan.restart_needed
    (tmp_path / "conf.d/zz-later.toml").write_text(
        f'version = 3\n[plugins."{CRI_RUNTIME_V3}".containerd]\n  default_runtime_name = "runc"\n'
    )
    with pytest.raises(RuntimeConfigError, match=r"zz-later\.toml"):
        n.plan("drop_in", set_as_default=True)


def test_staging_keeps_containerds_order_and_globs(tmp_path: Path) -> None:
    """The private copy containerd judges loads the same files in the same order."""
    (tmp_path / "d").mkdir()
    (tmp_path / "d/.hidden.toml").write_text("version = 3\n")
    (tmp_path / "d/b.toml").write_text('version = 3\nimports = ["../e.toml", "a.toml"]\n')
    (tmp_path / "e.toml").write_text("version = 3\n")
    main = tmp_path / "config.toml"
    main.write_text('version = 3\nimports = ["d/*.toml"]\n')
    files = {str(tmp_path / "d/a.toml"): "version = 3\n", str(tmp_path / "d/b.toml"): None}
    order = [Path(p).relative_to(tmp_path).as_posix()
             for p, _ in containerd.load_order(str(main), files)]  # fmt: skip
    assert order == ["config.toml", "d/.hidden.toml", "d/a.toml"]
    files = {str(tmp_path / "d/a.toml"): "version = 3\n"}
    order = [Path(p).relative_to(tmp_path).as_posix()
             for p, _ in containerd.load_order(str(main), files)]  # fmt: skip
    assert order == ["config.toml", "d/.hidden.toml", "d/a.toml", "d/b.toml", "e.toml"]
    (tmp_path / "stage").mkdir()
    staged, real = containerd.stage(str(main), files, tmp_path / "stage")
    assert sorted(real.values()) == sorted(str(tmp_path / p) for p in order)
    assert real[str(staged)] == str(main)
    copied_b = tomllib.loads(Path(next(k for k, v in real.items() if v.endswith("b.toml")))
                             .read_text())  # fmt: skip
    assert [real[p] for p in copied_b["imports"]] == [str(tmp_path / "e.toml"),
                                                      str(tmp_path / "d/a.toml")]  # fmt: skip


def test_an_unknown_mode_is_refused_naming_the_modes(node: Node) -> None:
    with pytest.raises(RuntimeConfigError, match=r"mode: 'dropin' is not one of in_place, drop_in"):
        node.plan("dropin")
