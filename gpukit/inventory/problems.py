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
    # Every host with this same problem (`merged`), when more than one: a group's or the
    # cluster's value is one problem, said once.
    hosts: tuple[str, ...] = ()

    def __str__(self) -> str:
        where = f"host {self.host}: " if self.host else ""
        if len(self.hosts) > 1:
            named = ", ".join(self.hosts[:MAX_HOSTS_NAMED])
            more = len(self.hosts) - MAX_HOSTS_NAMED
            where = f"hosts {named}{f' and {more} more' if more > 0 else ''}: "
        shown = short(self.value)
        return f"{where}{self.variable}: {shown} {self.message}" if shown else (
            f"{where}{self.variable}: {self.message}"
        )


MAX_HOSTS_NAMED = 5


def merged(problems: Sequence[Problem]) -> list[Problem]:
    """The problems with those that differ only by host said once, naming the hosts (a value
    from group_vars shared by a hundred hosts is one problem, not a hundred lines)."""
    def key(p: Problem) -> tuple[bool, str, str, str]:
        return p.host is None, p.variable, short(p.value), p.message

    by_key: dict[tuple[bool, str, str, str], list[Problem]] = {}
    for p in problems:
        by_key.setdefault(key(p), []).append(p)
    out: list[Problem] = []
    for p in problems:
        same = by_key[key(p)]
        if same[0] is not p:
            continue
        hosts = tuple(dict.fromkeys(h for q in same for h in (q.hosts or (q.host,)) if h))
        if len(hosts) > 1:
            p = Problem(p.host, p.variable, p.value, p.message, hosts)
        out.append(p)
    return out


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
        self.problems = merged(problems)
        self.source = source
        where = f"{source}: " if source else ""
        if len(self.problems) == 1:
            text = f"{where}{self.problems[0]}"
        else:
            text = f"{where}{len(self.problems)} problems:\n  " + "\n  ".join(
                str(p) for p in self.problems
            )
        super().__init__(text)

