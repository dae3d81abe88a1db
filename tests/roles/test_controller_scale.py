"""The controller's work per site.yml run does not grow per host where it need not: counted,
not timed, through the preflight every playbook imports, on the lab's generated inventories of
2, 4 and 8 mixed nodes (no cluster: the preflight opens no connection). One host validation
per host (each host's variables differ); one parse per distinct device plugin config (the
configs come from group_vars, shared by every host), not one per host and config."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from counted_playbook import counts
from labplay import REPO

from gpukit.lab.config import LabSpec, parse_nodes

PROFILES = ("a100-sxm4-40gb-x8", "t4-x2")


def preflight_counts(n: int, root: Path, monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    from gpukit.lab import inventory

    monkeypatch.setenv("GPUKIT_LAB_DIR", str(root / f"lab{n}"))
    spec = LabSpec(nodes=parse_nodes(",".join(f"n{i}={PROFILES[i % 2]}" for i in range(n))),
                   instance=9)  # fmt: skip
    path = inventory.for_instance(spec)
    calls = root / f"calls{n}.txt"
    r = subprocess.run([sys.executable, str(REPO / "tests/roles/counted_playbook.py"), str(calls),
                        "-i", str(path), "gpukit.gpu.preflight"],
                       cwd=REPO, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    return counts(calls)


def test_validations_grow_with_the_hosts_and_parses_do_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = {n: preflight_counts(n, tmp_path, monkeypatch) for n in (2, 4, 8)}
    print({n: dict(c) for n, c in seen.items()})
    assert {n: c["node_from_vars"] for n, c in seen.items()} == {2: 2, 4: 4, 8: 8}
    # The lab's group_vars declare 3 named configs for every host.
    assert {n: c["parse_config"] for n, c in seen.items()} == {2: 3, 4: 3, 8: 3}
    assert all(c["sharing"] == 0 for c in seen.values())


def test_the_free_strategy_does_not_multiply_the_preflight(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under the free strategy Ansible runs a run_once task on every host: the preflight
    validated every host once per host (16 validations for 4 hosts, 250000 for 500). Its
    play pins the linear strategy, as site.yml's and upgrade.yml's plays do."""
    monkeypatch.setenv("ANSIBLE_STRATEGY", "free")
    seen = preflight_counts(4, tmp_path, monkeypatch)
    assert (seen["node_from_vars"], seen["parse_config"]) == (4, 3)
