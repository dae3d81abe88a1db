"""CNCF AI Conformance evidence from a suite run: the run's JUnit XML, an e2e.log and a draft
PRODUCT.yaml (gpukit.contracts.cncf_ai_conformance) whose requirements the suite covers carry
its evidence: every test case mapped to the requirement id, with node and outcome.

A requirement is drafted `Implemented` only when at least one of its tests passed and none
failed; a failure leaves the status empty with the failures in `notes` (nothing to claim until
fixed), as does a requirement whose tests were all skipped. Requirements outside the suite keep
an empty status and say so: the submitter fills them with the platform's own evidence."""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from gpukit.contracts import cncf_ai_conformance as cncf

from .report import Result

JUNIT, E2E_LOG, PRODUCT = "junit.xml", "e2e.log", "PRODUCT.yaml"


def requirement(req: cncf.Requirement, results: list[Result]) -> dict[str, Any]:
    entry: dict[str, Any] = {"id": req.id, "description": req.summary, "level": req.level,
                             "status": "", "evidence": [], "notes": ""}
    if not results:
        entry["notes"] = "not covered by the gpukit conformance suite: the platform's own evidence"
        return entry
    bad = [r for r in results if r.outcome in ("failed", "error")]
    passed = [r for r in results if r.outcome == "passed"]
    entry["evidence"] = [f"{JUNIT}: {r.nodeid} ({r.node}): {r.outcome}" for r in results
                         if r.outcome != "skipped"]  # fmt: skip
    if bad:
        entry["notes"] = (f"{len(bad)} of {len(results)} tests failed ("
                          + "; ".join(f"{r.name} on {r.node}" for r in bad[:5])
                          + "): fix before claiming")
    elif not passed:
        entry["notes"] = f"all {len(results)} tests skipped: nothing shown"
    else:
        entry["status"] = cncf.IMPLEMENTED
        entry["notes"] = (f"gpukit conformance suite: {len(passed)} tests passed on "
                          f"{', '.join(sorted({r.node for r in passed}))}")
    return entry


def product(results: Iterable[Result], metadata: Mapping[str, str]) -> dict[str, Any]:
    """The PRODUCT.yaml document: metadata (unknown fields refused) and every requirement."""
    unknown = sorted(set(metadata) - set(cncf.METADATA_FIELDS))
    if unknown:
        raise ValueError(f"metadata.{unknown[0]}: not a PRODUCT.yaml metadata field (known: "
                         f"{', '.join(cncf.METADATA_FIELDS)})")
    by_id: dict[str, list[Result]] = {}
    for r in results:
        if r.cncf:
            by_id.setdefault(r.cncf, []).append(r)
    spec: dict[str, list[dict[str, Any]]] = {}
    for req in cncf.CHECKLIST:
        spec.setdefault(req.category, []).append(requirement(req, by_id.get(req.id, [])))
    meta = {k: str(metadata.get(k, "")) for k in cncf.METADATA_FIELDS}
    return {"metadata": meta, "spec": spec}


def problems(doc: Mapping[str, Any]) -> list[str]:
    """Where `doc` departs from the checklist's shape (empty: it conforms)."""
    out: list[str] = []
    meta = doc.get("metadata")
    if not isinstance(meta, Mapping) or set(meta) != set(cncf.METADATA_FIELDS):
        out.append("metadata: not exactly the checklist's fields")
    spec = doc.get("spec")
    if not isinstance(spec, Mapping):
        return [*out, "spec: not a mapping"]
    seen: set[str] = set()
    for category, reqs in spec.items():
        for i, req in enumerate(reqs if isinstance(reqs, list) else []):
            where = f"spec.{category}[{i}]"
            if not isinstance(req, Mapping) or tuple(req) != cncf.REQUIREMENT_FIELDS:
                out.append(f"{where}: fields are not {', '.join(cncf.REQUIREMENT_FIELDS)}")
                continue
            seen.add(str(req["id"]))
            if req["level"] not in cncf.LEVELS:
                out.append(f"{where}.level: {req['level']!r}")
            if req["status"] not in ("", *cncf.STATUSES):
                out.append(f"{where}.status: {req['status']!r}")
            if not isinstance(req["evidence"], list):
                out.append(f"{where}.evidence: not a list")
    if seen != set(cncf.IDS):
        out.append(f"spec: requirement ids {sorted(seen ^ set(cncf.IDS))} differ")
    return out


def e2e_log(results: Iterable[Result]) -> str:
    """One line per test case (when the run's own output was not kept)."""
    lines = []
    for r in results:
        first = r.message.strip().splitlines()[0] if r.message.strip() else ""
        lines.append(f"{r.outcome.upper():7} {r.nodeid} [{r.area}/{r.cncf or '-'}]"
                     + (f": {first[:200]}" if first else ""))
    return "\n".join(lines) + "\n"


def write(out: Path, junit: Path, results: list[Result], metadata: Mapping[str, str],
          log: Path | None = None) -> dict[str, Any]:
    """JUNIT, E2E_LOG (a copy of `log`, else e2e_log) and PRODUCT into `out`; the document."""
    doc = product(results, metadata)
    out.mkdir(parents=True, exist_ok=True)
    _copy(junit, out / JUNIT)
    if log is not None:
        _copy(log, out / E2E_LOG)
    else:
        (out / E2E_LOG).write_text(e2e_log(results))
    (out / PRODUCT).write_text(yaml.safe_dump(doc, sort_keys=False, width=100))
    return doc


def _copy(src: Path, dst: Path) -> None:
    """`src` to `dst`, unless it is already there (make evidence writes into the output dir)."""
    if src.resolve() != dst.resolve():
        shutil.copyfile(src, dst)
