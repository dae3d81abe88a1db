"""Human-readable renderings of plans and apply results (the JSON forms are ``to_json``)."""

from __future__ import annotations

from collections.abc import Sequence

from gpukit.mig.planner import Plan, describe_current

from .applier import ApplyResult


def plan_text(p: Plan) -> str:
    changed = p.changed_gpus
    lines = [
        f"MIG config {p.config!r} on {len(p.gpus)} GPU(s): "
        + (f"{len(changed)} to change, {len(p.gpus) - len(changed)} unchanged"
           if changed else "no change")
    ]
    for gp in p.gpus:
        g = gp.gpu
        head = f"GPU {g.index} {g.product} {g.uuid}"
        if gp.target is None:
            lines.append(f"{head}: not selected by the config ({describe_current(g)})")
            continue
        if not gp.changed:
            lines.append(f"{head}: unchanged ({gp.note or describe_current(g)})")
            continue
        lines.append(f"{head} ({gp.entry})")
        lines.append(f"  now:    {describe_current(g)}")
        lines.append(f"  target: {gp.target.describe()}")
        if gp.kept:
            lines.append(f"  keeps:  {' '.join(s.describe() for s in gp.kept)}")
        if gp.blocking_processes:
            pids = ", ".join(str(x.pid) for x in gp.blocking_processes)
            lines.append(f"  processes running: pid {pids} (apply refuses unless forced)")
        lines.extend(f"  - {a.text().split(': ', 1)[1]}" for a in gp.actions)
    return "\n".join(lines)


def apply_text(r: ApplyResult) -> str:
    if not r.changed and not r.skipped:
        return f"MIG config {r.plan.config!r}: already applied, nothing to do"
    lines = [f"MIG config {r.plan.config!r}: applied {len(r.executed)} change(s) on "
             f"{len(r.plan.changed_gpus)} GPU(s), verified"]
    lines.extend(f"  {a.text()}" for a in r.executed)
    lines.extend(f"  skipped (not needed): {a.text()}" for a in r.skipped)
    return "\n".join(lines)


def problems_text(title: str, problems: Sequence[str]) -> str:
    if len(problems) == 1:
        return f"{title}: {problems[0]}"
    return title + ":\n" + "\n".join(f"  - {x}" for x in problems)
