"""Fixtures only the suite's own tests see (the plugin's are installed for every pytest run)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpukit.conformance.checks import Check
from gpukit.conformance.plugin import CHECK_KEY, area_of
from gpukit.conformance.report import ALL_NODES


@pytest.fixture
def check(request: pytest.FixtureRequest) -> Iterator[Check]:
    """Records expected vs observed; `check.verify()` fails with every mismatch."""
    callspec = getattr(request.node, "callspec", None)
    node = callspec.params.get("node", ALL_NODES) if callspec else ALL_NODES
    c = Check(str(node), area_of(request.node))
    request.node.stash[CHECK_KEY] = c
    yield c
    if c.failed() and not c.verified:
        c.verify()
