"""The gpukit.gpu.runtime_config module as the role runs it (ansible-playbook, here on
localhost with temporary files), judged by real containerd: check and diff mode, writes,
idempotence, `restart_needed`, and a refusal that writes nothing."""

from __future__ import annotations

import json
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import moduletest
import pytest

MAIN = {
    2: 'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]\n'
       "  SystemdCgroup = true\n",
    3: 'version = 3\n[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]\n'
       "  SystemdCgroup = true\n",
}  # fmt: skip
CRI = {2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime"}


def run_module(tmp: Path, args: dict[str, Any], *flags: str) -> dict[str, Any]:
    return moduletest.run_module(tmp, "runtime_config", args, *flags)


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(root.rglob("*.toml"))}


def dump(binary: Path, main: Path) -> dict[str, Any]:
    r = subprocess.run([str(binary), "--config", str(main), "config", "dump"],
                       capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    return tomllib.loads(r.stdout)


@pytest.fixture
def etc(tmp_path: Path, config_version: int) -> Path:
    root = tmp_path / "etc"
    (root / "conf.d").mkdir(parents=True)
    (root / "config.toml").write_text(MAIN[config_version])
    return root


def args(etc: Path, binary: Path, mode: str, **more: Any) -> dict[str, Any]:
    return {"mode": mode, "config_path": str(etc / "config.toml"),
            "dropin_path": str(etc / "conf.d/99-gpukit-nvidia.toml"),
            "import_pattern": str(etc / "conf.d/*.toml"), "containerd_binary": str(binary),
            **more}  # fmt: skip


@pytest.mark.parametrize("mode", ["in_place", "drop_in"])
def test_check_apply_and_again(etc: Path, containerd_bin: Path, config_version: int,
                               mode: str) -> None:  # fmt: skip
    a = args(etc, containerd_bin, mode)
    before = snapshot(etc)
    check = run_module(etc.parent, a, "--check", "--diff")
    assert check["changed"] and check["restart_needed"], check
    assert "containerd.runtimes.nvidia]" in json.dumps(check["diff"])
    assert check["judge"].startswith(f"containerd config dump ({containerd_bin}")
    assert snapshot(etc) == before  # check mode wrote nothing
    done = run_module(etc.parent, a)
    assert done["changed"] and done["restart_needed"], done
    assert done["effective_changes"] == check["effective_changes"]
    runtimes = dump(containerd_bin, etc / "config.toml")["plugins"][CRI[config_version]][
        "containerd"]["runtimes"]  # fmt: skip
    assert runtimes["nvidia"]["options"]["SystemdCgroup"] is True
    again = run_module(etc.parent, a)
    assert not again["changed"] and not again["restart_needed"], again


def test_a_layout_only_rewrite_needs_no_restart(etc: Path, containerd_bin: Path) -> None:
    a = args(etc, containerd_bin, "drop_in")
    run_module(etc.parent, a)
    dropin = etc / "conf.d/99-gpukit-nvidia.toml"
    rendered = dropin.read_text()
    dropin.write_text(rendered.replace(" = ", "  =  "))
    r = run_module(etc.parent, a)
    assert r["changed"] and not r["restart_needed"] and r["effective_changes"] == [], r
    assert dropin.read_text() == rendered


@pytest.mark.parametrize("mode", ["in_place", "drop_in"])
def test_a_refused_file_is_left_as_it_was(etc: Path, containerd_bin: Path, mode: str) -> None:
    main = etc / "config.toml"
    main.write_text('[crio.runtime]\ndefault_runtime = "runc"\n')
    before = snapshot(etc)
    r = run_module(etc.parent, args(etc, containerd_bin, mode))
    assert r.get("failed") and r["msg"].startswith(f"{main}: not a containerd config"), r
    assert snapshot(etc) == before and not (etc / "conf.d/99-gpukit-nvidia.toml").exists()


def test_a_missing_containerd_binary_is_an_error(etc: Path) -> None:
    r = run_module(etc.parent, args(etc, etc / "no-containerd", "in_place"))
    assert r.get("failed") and "is not an executable file" in r["msg"], r
