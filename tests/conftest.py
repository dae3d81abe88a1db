"""Shared fixtures: the lab cluster (session-wide), brought up once when a test needs it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def lab_cluster() -> Iterator[object]:
    from gpukit.lab.pytest_provider import LabManager

    manager = LabManager()
    manager.create()
    yield manager
    manager.delete()
