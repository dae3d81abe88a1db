"""Soft assertions that record expected vs observed per node, area and resource.

A test records every comparison it makes (`check.equal(...)`), then `check.verify()` fails
once with all mismatches. Each line names the node, the resource, what was compared, the
expected and the observed value; the rows also feed the HTML grid and the JUnit properties.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import pytest

from gpukit.contracts.cncf_ai_conformance import (
    ACCELERATOR_METRICS,
    DRA_SUPPORT,
    DRIVER_RUNTIME_MANAGEMENT,
    GPU_SHARING,
    SECURE_ACCELERATOR_ACCESS,
)

AREAS = (
    "discovery", "labels", "host", "isolation", "mig", "timeslicing", "mps", "workload",
    "dra", "metrics", "tenancy", "restarts",
)

# CNCF Kubernetes AI Conformance requirement ids (gpukit.contracts.cncf_ai_conformance).
CNCF_BY_AREA = {
    "isolation": SECURE_ACCELERATOR_ACCESS,
    "workload": SECURE_ACCELERATOR_ACCESS,
    "mig": GPU_SHARING,
    "timeslicing": GPU_SHARING,
    "mps": GPU_SHARING,
    "host": DRIVER_RUNTIME_MANAGEMENT,
    "dra": DRA_SUPPORT,
    "metrics": ACCELERATOR_METRICS,
}


def fmt(value: object) -> str:
    """A compact, stable rendering for messages and reports."""
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}={fmt(v)}" for k, v in sorted(value.items(), key=str)) + "}"
    if isinstance(value, set | frozenset):
        return "{" + ", ".join(sorted(fmt(v) for v in value)) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(fmt(v) for v in value) + "]"
    if value is None:
        return "none"
    return str(value)


@dataclass(frozen=True)
class Row:
    node: str
    area: str
    resource: str
    what: str
    expected: str
    observed: str
    ok: bool

    def message(self) -> str:
        res = f"{self.resource}: " if self.resource else ""
        return (f"node {self.node}: {res}{self.what}: expected {self.expected}, "
                f"observed {self.observed}")

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @staticmethod
    def from_json(text: str) -> Row:
        data: dict[str, Any] = json.loads(text)
        return Row(**data)


class Check:
    """Comparisons of one test on one node."""

    def __init__(self, node: str, area: str) -> None:
        self.node = node
        self.area = area
        self.rows: list[Row] = []
        self.verified = False

    def record(self, what: str, expected: object, observed: object, ok: bool,
               resource: str = "") -> bool:
        self.rows.append(Row(self.node, self.area, resource, what, fmt(expected), fmt(observed),
                             ok))
        return ok

    def equal(self, what: str, expected: object, observed: object, resource: str = "") -> bool:
        return self.record(what, expected, observed, expected == observed, resource)

    def true(self, what: str, ok: bool, expected: object, observed: object,
             resource: str = "") -> bool:
        return self.record(what, expected, observed, ok, resource)

    def subset(self, what: str, expected: Mapping[str, object], observed: Mapping[str, object],
               resource: str = "") -> bool:
        """Every expected key present with the expected value (extra keys are fine)."""
        ok = True
        for key, want in sorted(expected.items()):
            ok &= self.equal(f"{what} {key}", want, observed.get(key), resource)
        return ok

    def failed(self) -> list[Row]:
        return [r for r in self.rows if not r.ok]

    def verify(self) -> None:
        self.verified = True
        bad = self.failed()
        if bad:
            pytest.fail("\n".join(r.message() for r in bad), pytrace=False)

    def skip(self, reason: str) -> None:
        self.verified = True
        pytest.skip(f"node {self.node}: {reason}")


def messages(rows: Iterable[Row]) -> list[str]:
    return [r.message() for r in rows]
