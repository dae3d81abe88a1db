"""Apply a MIG config to a node: plan, check, pause the plugin, change, verify.

Crash safety does not come from a journal but from the planner: every action moves the GPUs one
step towards the target, NVML makes each step atomic, and planning from ANY intermediate state
(mode pending, GPU instances without compute instances, some instances created or destroyed)
yields exactly the remaining steps. So after a crash, running apply again converges; the stale
pause file a killed apply leaves behind is void once its process is gone (the plugin removes it
at its next tick, see mig/pause.py), and the next apply removes it too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from gpukit.contracts import mig_profiles
from gpukit.contracts.mig_parted import MigConfigEntry, MigConfigs
from gpukit.mig.planner import Action, ActionKind, GpuPlan, Plan, plan
from gpukit.mig.state import GpuState

from .backend import MigBackend
from .hooks import NoPause, NullReporter, PluginPause, ResetFn, StateReporter

log = logging.getLogger(__name__)


class ApplyError(RuntimeError):
    """Apply stopped; the message says where and why. The node may be part-way: running apply
    again continues from there."""


class ProcessesRunning(ApplyError):
    def __init__(self, blocking: dict[int, tuple[int, ...]]) -> None:
        self.blocking = blocking
        gpus = "; ".join(f"GPU {i}: pid {', '.join(map(str, pids))}"
                         for i, pids in sorted(blocking.items()))
        super().__init__(f"GPU processes are running on GPUs that must change ({gpus}); stop "
                         "them (drain the node) or apply with force")


class ClaimsHeld(ApplyError):
    """Prepared DRA claims hold GPUs that must change (gpukit.plugin.mig.dra_claims)."""

    def __init__(self, held: dict[int, tuple[str, ...]]) -> None:
        self.held = held
        gpus = "; ".join(f"GPU {i}: claim {', '.join(c)}" for i, c in sorted(held.items()))
        super().__init__(f"prepared DRA claims hold GPUs that must change ({gpus}); delete "
                         "their pods (drain the node) or apply with force")


class VerifyError(ApplyError):
    def __init__(self, mismatches: Sequence[str]) -> None:
        self.mismatches = list(mismatches)
        super().__init__("after apply the node does not match the plan: "
                         + "; ".join(self.mismatches))


@dataclass
class ApplyResult:
    plan: Plan
    executed: list[Action] = field(default_factory=list)
    skipped: list[Action] = field(default_factory=list)
    final: tuple[GpuState, ...] = ()

    @property
    def changed(self) -> bool:
        return bool(self.executed)


def verify(p: Plan, gpus: Sequence[GpuState]) -> list[str]:
    """Differences between the plan's targets and these GPUs (empty: they match)."""
    by_index = {g.index: g for g in gpus}
    out: list[str] = []
    for gp in p.gpus:
        if gp.target is None or not gp.gpu.mig_capable:
            continue
        g = by_index.get(gp.gpu.index)
        if g is None or g.uuid != gp.gpu.uuid:
            out.append(f"GPU {gp.gpu.index} ({gp.gpu.uuid}) is gone")
            continue
        want = gp.target.mig_enabled
        if g.mig_current != want or g.mig_pending != want:
            out.append(f"{g.label()}: expected MIG {'enabled' if want else 'disabled'}, "
                       f"found {g.mode_text()}")
            continue
        if not want:
            continue
        found = sorted((gi.start, gi.profile) for gi in g.gpu_instances)
        expected = sorted((s.start, s.profile) for s in gp.target.slots)
        if found != expected:
            out.append(f"{g.label()}: expected GPU instances "
                       f"{' '.join(f'{p}@{s}' for s, p in expected) or 'none'}, found "
                       f"{' '.join(f'{p}@{s}' for s, p in found) or 'none'}")
            continue
        table = g.table
        for gi in g.gpu_instances:
            assert table is not None
            prof = table.gpu_instance_profile(gi.profile_id)
            full = prof.compute_instance_profile(prof.compute_slices).profile_id
            if [ci.profile_id for ci in gi.compute_instances] != [full]:
                out.append(f"{g.label()}: GPU instance {gi.describe()} should have one full "
                           f"compute instance, has {len(gi.compute_instances)}")
    return out


class _Runner:
    def __init__(self, backend: MigBackend, reset_gpu: ResetFn) -> None:
        self.backend = backend
        self.reset_gpu = reset_gpu
        self.created: dict[tuple[int, int], int] = {}  # (gpu, start) -> GPU instance id

    def _gpu(self, index: int) -> GpuState:
        return self.backend.gpu(index)

    @staticmethod
    def _profile(g: GpuState, name: str | None) -> mig_profiles.GpuInstanceProfile:
        table = g.table
        if table is None or name is None:
            raise ApplyError(f"{g.label()}: no MIG table")
        return table.gpu_instance_profile(name)

    def run(self, a: Action, gp: GpuPlan) -> bool:
        """Execute one action; False when it turned out to be unnecessary."""
        b = self.backend
        assert gp.target is not None
        target_enabled = gp.target.mig_enabled
        match a.kind:
            case ActionKind.SET_MIG_MODE:
                assert a.enabled is not None
                b.set_mig_mode(a.gpu, a.enabled)
            case ActionKind.RESET_GPU:
                g = self._gpu(a.gpu)
                if g.mig_current == target_enabled and g.mig_pending == target_enabled:
                    log.info("GPU %d: MIG mode already applied without a reset", a.gpu)
                    return False
                self.reset_gpu(a.gpu)
                g = self._gpu(a.gpu)
                if g.mig_current != target_enabled:
                    raise ApplyError(f"{g.label()}: the reset did not apply the MIG mode "
                                     f"({g.mode_text()})")
            case ActionKind.DESTROY_COMPUTE_INSTANCE:
                assert a.gi is not None and a.ci is not None
                b.destroy_compute_instance(a.gpu, a.gi, a.ci)
            case ActionKind.DESTROY_GPU_INSTANCE:
                assert a.gi is not None
                b.destroy_gpu_instance(a.gpu, a.gi)
            case ActionKind.CREATE_GPU_INSTANCE:
                assert a.start is not None
                p = self._profile(gp.gpu, a.profile)
                self.created[(a.gpu, a.start)] = b.create_gpu_instance(
                    a.gpu, p.profile_id, a.start, p.memory_slices)
            case ActionKind.CREATE_COMPUTE_INSTANCE:
                assert a.start is not None
                p = self._profile(gp.gpu, a.profile)
                gi = a.gi if a.gi is not None else self.created.get((a.gpu, a.start))
                if gi is None:
                    g = self._gpu(a.gpu)
                    found = [x for x in g.gpu_instances if x.start == a.start
                             and x.profile == p.name]
                    if not found:
                        raise ApplyError(f"{g.label()}: no GPU instance {p.name} at slice "
                                         f"{a.start} to create a compute instance in")
                    gi = found[0].id
                full = p.compute_instance_profile(p.compute_slices).profile_id
                b.create_compute_instance(a.gpu, gi, full)
        return True


def apply(
    configs: MigConfigs | Sequence[MigConfigEntry],
    selected: str,
    backend: MigBackend,
    reset_gpu: ResetFn,
    *,
    force: bool = False,
    reporter: StateReporter | None = None,
    pauser: PluginPause | None = None,
    on_action: Callable[[Action], None] | None = None,
    claims: Mapping[int, Sequence[str]] | None = None,
    excluded: Mapping[int, str] | None = None,
) -> ApplyResult:
    """Make the node match ``selected``. Raises MigConfigError / LayoutError (nothing touched),
    ProcessesRunning or ClaimsHeld (``claims``: GPU index -> prepared DRA claims holding it;
    nothing touched), ApplyError / VerifyError / ResetError / NvmlError /
    OSError (part-way: rerun to converge). A second apply of the same config does nothing."""
    reporter = reporter or NullReporter()
    pauser = pauser or NoPause()
    try:
        the_plan = plan(configs, selected, backend.gpus(), excluded)
    except Exception as e:  # invalid config or layout, NVML trouble: nothing was touched
        reporter.report("failed", str(e))
        raise
    result = ApplyResult(plan=the_plan)
    if not the_plan.changed:
        pauser.resume()  # a pause left behind by an apply that died after its last change
        reporter.report("success", f"{selected}: no change")
        result.final = tuple(g.gpu for g in the_plan.gpus)
        return result
    blocking = the_plan.blocking_processes()
    if blocking and not force:
        err = ProcessesRunning({i: tuple(p.pid for p in ps) for i, ps in blocking.items()})
        reporter.report("failed", str(err))
        raise err
    changing = {g.gpu.index for g in the_plan.changed_gpus}
    held = {i: tuple(c) for i, c in (claims or {}).items() if i in changing and c}
    if held and not force:
        held_err = ClaimsHeld(held)
        reporter.report("failed", str(held_err))
        raise held_err
    if blocking:
        log.warning("force: changing GPUs with running processes: %s",
                    {i: [p.pid for p in ps] for i, ps in blocking.items()})
    if held:
        log.warning("force: changing GPUs that prepared DRA claims hold: %s", held)
    reporter.report("pending", f"applying {selected}")
    runner = _Runner(backend, reset_gpu)
    try:
        pauser.pause([(g.gpu.index, g.gpu.uuid) for g in the_plan.changed_gpus], selected)
        for gp in the_plan.changed_gpus:
            assert gp.target is not None
            for action in gp.actions:
                log.info("%s", action.text())
                if runner.run(action, gp):
                    result.executed.append(action)
                else:
                    result.skipped.append(action)
                if on_action is not None:
                    on_action(action)
        final = backend.gpus()
        mismatches = verify(the_plan, final)
        if mismatches:
            raise VerifyError(mismatches)
        result.final = final
    except Exception as e:
        reporter.report("failed", str(e))
        pauser.resume()
        raise
    pauser.resume()
    reporter.report("success", f"{selected}: {len(result.executed)} change(s)")
    return result
