"""Problems of a declaration: where (host), which variable (dotted path inside it), which value.

Every error of the inventory model names them:
`inventories/lab: host gpu-t4: gpukit_gpu.count: 'two' is not an integer >= 0`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Problem:
    """One invalid declaration: where, which variable (dotted path inside it), which value."""

    host: str | None
    variable: str
    value: object
    message: str

    def __str__(self) -> str:
        where = f"host {self.host}: " if self.host else ""
        shown = short(self.value)
        return f"{where}{self.variable}: {shown} {self.message}" if shown else (
            f"{where}{self.variable}: {self.message}"
        )


def short(value: object) -> str:
    if value is MISSING:
        return ""
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


MISSING: Any = _Missing()


class InventoryError(ValueError):
    """The inventory cannot be read or declares something invalid; lists every problem."""

    def __init__(self, problems: Sequence[Problem], source: str = "") -> None:
        self.problems = list(problems)
        self.source = source
        where = f"{source}: " if source else ""
        if len(self.problems) == 1:
            text = f"{where}{self.problems[0]}"
        else:
            text = f"{where}{len(self.problems)} problems:\n  " + "\n  ".join(
                str(p) for p in self.problems
            )
        super().__init__(text)

