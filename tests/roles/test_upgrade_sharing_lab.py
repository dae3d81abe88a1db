"""playbooks/upgrade.yml on the lab: a change of a sharing config's content rolls node by node.

The `time-sliced` config (selected by the t4 group) goes from 4 to 8 time-slicing replicas
in a copy of the lab's inventory. The config lives in one cluster-wide ConfigMap, so the
nodes' selection labels do not change; the rollout must still find gpu-t4, roll it in its
own batch (the new content under a versioned name between drain and validation) and leave
gpu-a100 alone. A Timeline watches the nodes (upgrade state, config label, allocatable GPUs)
for the whole of each run.

The tests share one lab and run in order: --check, the rollout, a rerun. The module's
fixture converges the lab to the inventory first, and at the end runs site.yml with the
lab's own inventory (replicas 4) again, so the lab is left as declared.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from kubernetes import client
from labplay import (
    ROLL,
    PlayResult,
    assert_nothing_rolled,
    plan_lines,
    report_lines,
    run_playbook,
)
from labtools import SiteLab, release_nodes, site_lab, wait_for

from gpukit.contracts import config_versions
from gpukit.lab.observe import CONFIG_LABEL, Timeline
from gpukit.provision import sharing_rollout
from gpukit.provision.upgrade import STATE_LABEL

pytestmark = pytest.mark.lab

A100, T4 = "gpu-a100", "gpu-t4"
CONFIG = "time-sliced"


@dataclass
class Lab(SiteLab):
    core: client.CoreV1Api

    def set_replicas(self, replicas: int) -> dict[str, Any]:
        path = self.inventory / "group_vars" / "gpu_nodes.yml"
        doc = yaml.safe_load(path.read_text())
        cfg = doc["gpukit_device_plugin_configs"][CONFIG]
        cfg["sharing"]["timeSlicing"]["resources"][0]["replicas"] = replicas
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return dict(cfg)

    def upgrade(self, *args: str) -> PlayResult:
        return run_playbook("playbooks/upgrade.yml", self.inventory, *args, var_files=(),
                            timeout=1200)  # fmt: skip

    def site(self, *args: str, **kwargs: Any) -> PlayResult:
        return super().site(*args, var_files=(), **kwargs)

    def configs(self) -> dict[str, Any]:
        cm = self.core.read_namespaced_config_map(sharing_rollout.CONFIG_MAP, "gpukit-system")
        return {k: yaml.safe_load(v) for k, v in (cm.data or {}).items()}

    def gpus(self, node: str) -> int:
        return int(self.core.read_node(node).status.allocatable.get("nvidia.com/gpu", "0"))

    def label(self, node: str) -> str | None:
        return (self.core.read_node(node).metadata.labels or {}).get(CONFIG_LABEL)


def replicas(cfg: dict[str, Any]) -> int:
    return int(cfg["sharing"]["timeSlicing"]["resources"][0]["replicas"])


@pytest.fixture(scope="module")
def lab(lab_cluster: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    lab = site_lab(tmp_path_factory, "upgrade-sharing").as_(Lab, core=client.CoreV1Api())
    release_nodes(lab.core, [A100, T4], STATE_LABEL)
    # Converged on the lab's inventory (replicas 4) before the edit.
    r = lab.site()
    assert r.rc == 0 and not r.failed, r.describe()
    assert replicas(lab.configs()[CONFIG]) == 4
    wait_for("gpu-t4 serving 8 GPUs (2 x 4 replicas)", lambda: lab.gpus(T4) == 8, 180, every=2)
    yield lab
    # Leave the lab as its own inventory declares it (replicas 4, plain labels).
    r = lab.site(inventory=lab.original)
    assert r.rc == 0 and not r.failed, r.describe()
    wait_for("gpu-t4 serving 8 GPUs again", lambda: lab.gpus(T4) == 8, 180, every=2)


def test_check_lists_the_sharing_change_and_changes_nothing(lab: Lab) -> None:
    lab.set_replicas(8)
    before = lab.configs()
    with Timeline(lab.core) as seen:
        r = lab.upgrade("--check")
    assert r.rc == 0 and not r.failed, r.describe()
    lines = plan_lines(r)
    assert f"{A100}: matches the inventory, not touched" in lines, lines
    assert f"batch 1 (group t4_nodes, serial 1): {T4}" in lines, lines
    assert (f"  {T4}: sharing config {CONFIG}: "
            "sharing.timeSlicing.resources[nvidia.com/gpu].replicas 4 -> 8") in lines, lines
    assert lines[-1] == "1 node(s) in 1 batch(es); the rollout stops after 1 failed node(s)"
    assert "check mode: 1 node(s) would be upgraded" in str(r.results)
    # Nothing changed: no cordon, no state, no versioned key, the old content served.
    assert all(not e.unschedulable and not e.state for e in seen.nodes), seen.nodes
    assert lab.configs() == before
    assert lab.label(T4) == CONFIG and lab.gpus(T4) == 8


@pytest.mark.timeout(1200)
def test_the_rollout_moves_gpu_t4_alone_through_the_new_content(lab: Lab) -> None:
    new = lab.set_replicas(8)
    versioned = config_versions.versioned_name(CONFIG, new)
    with Timeline(lab.core) as seen:
        r = lab.upgrade()
        # The finish step's relabel is the last change: watch a little longer for a dip.
        time.sleep(15)
    assert r.rc == 0 and not r.failed, r.describe()
    assert len(seen.errors) < 5, seen.errors
    assert report_lines(r) == [f"{T4}: upgraded and validated",
                               f"{A100}: matches the inventory"], report_lines(r)  # fmt: skip
    # gpu-t4 went through every step; gpu-a100 was never cordoned nor labelled.
    assert seen.states(T4) == ["", *ROLL]
    assert all(not e.unschedulable and not e.state for e in seen.node_events(A100))
    assert {e.config for e in seen.node_events(A100)} == {"mig-mixed"}
    # gpu-t4's label: plain -> versioned (in its batch, after the drain, before validation)
    # -> plain again (after its uncordon, by the finish step).
    events = seen.node_events(T4)
    configs = [c for i, c in enumerate(e.config for e in events)
               if i == 0 or c != events[i - 1].config]  # fmt: skip
    assert configs == [CONFIG, versioned, CONFIG], configs
    to_versioned = next(e.at for e in events if e.config == versioned)
    back = next(e.at for e in events if e.at > to_versioned and e.config == CONFIG)
    upgrading, validating = seen.first(T4, "upgrading"), seen.first(T4, "validating")
    assert upgrading is not None and validating is not None
    assert upgrading < to_versioned < validating
    periods = seen.unschedulable_periods(T4)
    assert len(periods) == 1 and periods[0][1] is not None and periods[0][1] < back
    uncordoned = periods[0][1]
    # It served 8 GPUs (2 T4 x 4) until the versioned config, 16 from then on (before it
    # was uncordoned): the move back to the plain name (identical content) never disturbed it.
    first_16 = next(e.at for e in events if e.gpus == 16)
    assert to_versioned < first_16 < uncordoned
    seen_t4 = [(round(e.at - events[0].at, 1), e.state, e.unschedulable, e.config, e.gpus)
               for e in events]  # fmt: skip
    # Never 0: the drain leaves the agent running (it has no emptyDir, which
    # kubernetes.core's k8s_drain would delete it for). Never the new content before the
    # node's batch switched it.
    assert all(e.gpus == 8 for e in events if e.at < to_versioned), seen_t4
    assert all(e.gpus == 16 for e in events if e.at >= first_16), seen_t4
    # The end state: the plain name carries the new content, no versioned key is left.
    cfgs = lab.configs()
    assert replicas(cfgs[CONFIG]) == 8
    assert not [k for k in cfgs if config_versions.is_version_of(k, CONFIG)], sorted(cfgs)
    assert lab.label(T4) == CONFIG and lab.gpus(T4) == 16
    node = lab.core.read_node(T4)
    assert not node.spec.unschedulable and node.metadata.labels[STATE_LABEL] == "done"


def test_a_rerun_changes_nothing(lab: Lab) -> None:
    lab.set_replicas(8)
    with Timeline(lab.core) as seen:
        r = lab.upgrade()
    assert_nothing_rolled(r, seen.nodes, (A100, T4))
    assert not [h for h, tasks in r.changed.items() if tasks], r.changed
