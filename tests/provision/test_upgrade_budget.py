"""The failure budget bounds a rollout's failed nodes, whatever the batch sizes: the plan caps
batches at budget + 1 and a batch starts only while all of its nodes failing would not take
the rollout past its stop point (budget + 1 failed)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from gpukit.provision import upgrade
from gpukit.provision.upgrade import NodeState


def fleet(n: int, serial: Any, group: str = "fleet") -> list[NodeState]:
    return [NodeState(f"n{i}", f"n{i}", group, serial, changes=("MIG: x",)) for i in range(1, n + 1)]


def roll(batches: list[list[str]], budget: int, failing: set[str]) -> tuple[list[str], bool]:
    """What upgrade.yml does: before each batch the budget check, then the batch's nodes roll
    together (those in `failing` fail). The nodes that failed, and whether it stopped early."""
    failed: list[str] = []
    for batch in batches:
        if not upgrade.batch_may_start(len(failed), len(batch), budget):
            return failed, True
        failed += [h for h in batch if h in failing]
    return failed, False


def test_serial_50_percent_with_a_budget_of_one_rolls_two_batches_of_two() -> None:
    p = upgrade.plan(fleet(4, "50%"), max_failed=1)
    assert p.batches == [["n1", "n2"], ["n3", "n4"]]
    assert "batch 1 (group fleet, serial 2): n1, n2" in p.lines
    assert not any("capped" in line for line in p.lines)


def test_a_batch_larger_than_the_budget_allows_is_capped_and_the_plan_says_so() -> None:
    p = upgrade.plan(fleet(4, "50%"), max_failed=0)
    assert p.batches == [["n1"], ["n2"], ["n3"], ["n4"]]
    assert "batch 1 (group fleet, serial 1, 2 capped by the failure budget): n1" in p.lines
    assert ("batches of fleet hold at most 1 node(s): a batch never holds more nodes than may"
            " fail (gpukit_upgrade_max_failed 0 -> 0)") in p.lines
    assert p.lines[-1] == "4 node(s) in 4 batch(es); the rollout stops after 1 failed node(s)"


def test_a_percent_budget_caps_percent_batches() -> None:
    # 25% of 40 = 10 at a time, but 10% of the 40 targets = 4 tolerated: batches of 5.
    p = upgrade.plan(fleet(40, "25%"), max_failed="10%")
    assert p.max_failed == 4 and set(p.sizes) == {5} and len(p.batches) == 8
    assert "batch 1 (group fleet, serial 5, 10 capped by the failure budget): n1, n2, n3, n4, n5" \
        in p.lines
    assert "(gpukit_upgrade_max_failed 10% -> 4)" in p.lines[-2]


def test_only_groups_whose_serial_exceeds_the_cap_are_capped() -> None:
    nodes = fleet(2, 1, "a100") + [NodeState(f"t{i}", f"t{i}", "t4", 3, changes=("x",))
                                   for i in range(3)]  # fmt: skip
    p = upgrade.plan(nodes, max_failed=1)
    assert p.sizes == [1, 1, 2, 1]
    assert "batch 1 (group a100, serial 1): n1" in p.lines
    assert "batch 3 (group t4, serial 2, 3 capped by the failure budget): t0, t1" in p.lines
    assert p.lines[-2].startswith("batches of t4 hold at most 2 node(s)")


@pytest.mark.parametrize(("failed", "batch", "budget", "ok"), [
    (0, 1, 0, True), (0, 2, 0, False), (0, 2, 1, True), (1, 1, 1, True), (1, 2, 1, False),
    (2, 1, 1, False), (3, 5, 10, True), (7, 5, 10, False),
])  # fmt: skip
def test_a_batch_starts_only_while_it_cannot_pass_the_stop_point(
        failed: int, batch: int, budget: int, ok: bool) -> None:
    assert upgrade.batch_may_start(failed, batch, budget) is ok


@pytest.mark.parametrize("serial", [1, 2, 3, "50%", "100%"])
@pytest.mark.parametrize("max_failed", [0, 1, 2, "34%"])
def test_no_failure_pattern_takes_a_rollout_past_its_budget(serial: Any, max_failed: Any) -> None:
    p = upgrade.plan(fleet(6, serial), max_failed=max_failed)
    hosts = p.order
    assert roll(p.batches, p.max_failed, set()) == ([], False)  # no failure: no stop
    for k in range(len(hosts) + 1):
        for failing in itertools.combinations(hosts, k):
            failed, _ = roll(p.batches, p.max_failed, set(failing))
            assert len(failed) <= p.max_failed + 1, (p.batches, failing, failed)
            if k <= p.max_failed and set(p.sizes) == {1}:  # one at a time: all tolerated
                assert failed == list(failing)


def test_uncapped_batches_overshot_the_budget() -> None:
    """What the cap prevents: batches of 3 checked only at their start (failed > budget),
    a budget of 0 and a whole batch failing left 3 nodes failed."""
    failed: list[str] = []
    for batch in [["n1", "n2", "n3"], ["n4", "n5", "n6"]]:
        if len(failed) > 0:
            break
        failed += batch
    assert len(failed) == 3
    capped = upgrade.plan(fleet(6, 3), max_failed=0)
    assert roll(capped.batches, 0, {"n1", "n2", "n3"}) == (["n1"], True)


def test_the_report_says_why_the_rollout_stopped() -> None:
    planned = upgrade.plan(fleet(4, "50%"), max_failed=1).as_dict()
    # n1 failed in batch 1; batch 2's two nodes could make it 3 failed, past the stop at 2.
    r = upgrade.report(planned, {"n1": "failed", "n2": "done"}, {"n1": "Validate the node"})
    assert r.summary == "rollout STOPPED: 1 upgraded, 1 failed, 2 not reached"
    assert "n3: not touched (the rollout stopped before its batch)" in r.lines
    assert ("the rollout stopped before batch 2: 1 node(s) failed, its 2 node(s) could take the"
            " rollout past its stop point (2 failed)") in r.lines
    both = upgrade.report(planned, {"n1": "failed", "n2": "failed"})
    assert ("the rollout stopped before batch 2: 2 node(s) failed, more than"
            " gpukit_upgrade_max_failed allows (1)") in both.lines
