"""A node's declared labels and taints (`gpukit_node_labels`, `gpukit_node_taints`): the one set
of rules, used by the model's validation of a host and by the node_labels role's library
(gpukit.provision.nodes), so that the preflight refuses exactly what the role would."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpukit.contracts import label_syntax

from .model import TAINT_EFFECTS, Taint
from .problems import MISSING, Problem

_TAINT_FIELDS = ("key", "value", "effect")


def label_text(value: Any) -> str | None:
    """A label value as declared in YAML, as the node carries it (None: not a scalar)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | str):
        return str(value)
    return "" if value is None else None


def value_problem(variable: str, value: object, text: str) -> Problem | None:
    if label_syntax.value_ok(text):
        return None
    return Problem(None, variable, value, "is not a valid label value (<= 63 of [A-Za-z0-9_.-], "
                   "alphanumeric at both ends)")


def key_problem(variable: str, key: object, what: str = "label key") -> Problem | None:
    reason = label_syntax.key_problem(key) if isinstance(key, str) else "not a string"
    if reason is None:
        return None
    return Problem(None, variable, key if key is not None else MISSING,
                   f"is not a valid {what} ([prefix/]name: {reason})")


def parse_labels(raw: Any, variable: str = "gpukit_node_labels"
                 ) -> tuple[dict[str, str], list[Problem]]:
    """`gpukit_node_labels` (a mapping; None: no labels) as name -> value, and every problem."""
    if raw is None or raw is MISSING:
        return {}, []
    if not isinstance(raw, Mapping):
        return {}, [Problem(None, variable, raw, f"is not a mapping (got {type(raw).__name__})")]
    out: dict[str, str] = {}
    problems: list[Problem] = []
    for key, value in raw.items():
        if p := key_problem(variable, key):
            problems.append(p)
            continue
        var = f"{variable}.{key}"
        text = label_text(value)
        if text is None:
            problems.append(Problem(None, var, value, "is not a label value (a string)"))
        elif p := value_problem(var, value, text):
            problems.append(p)
        else:
            out[str(key)] = text
    return out, problems


def parse_taints(raw: Any, variable: str = "gpukit_node_taints"
                 ) -> tuple[tuple[Taint, ...], list[Problem]]:
    """`gpukit_node_taints` (a list of {key, value, effect}; None: none) and every problem."""
    if raw is None or raw is MISSING:
        return (), []
    if not isinstance(raw, list):
        return (), [Problem(None, variable, raw, "is not a list of {key, value, effect}")]
    out: list[Taint] = []
    problems: list[Problem] = []
    for i, item in enumerate(raw):
        where = f"{variable}[{i}]"
        if not isinstance(item, Mapping):
            problems.append(Problem(None, where, item, "is not a mapping {key, value, effect}"))
            continue
        before = len(problems)
        problems += [Problem(None, f"{where}.{k}", item[k], "is not a known field (key, value, "
                             "effect)") for k in item if k not in _TAINT_FIELDS]
        if p := key_problem(f"{where}.key", item.get("key"), "taint key"):
            problems.append(p)
        raw_value = item.get("value")
        value = "" if raw_value is None else str(raw_value)
        if value and (p := value_problem(f"{where}.value", raw_value, value)):
            problems.append(p)
        effect = item.get("effect")
        if effect not in TAINT_EFFECTS:
            problems.append(Problem(None, f"{where}.effect", effect if "effect" in item
                                    else MISSING, f"is not one of {', '.join(TAINT_EFFECTS)}"))
        if len(problems) > before:
            continue
        taint = Taint(key=str(item["key"]), effect=str(effect), value=value)
        if any(t.ident == taint.ident for t in out):
            problems.append(Problem(None, where, taint.ident, "is declared twice (key and effect "
                                    "name one taint)"))
            continue
        out.append(taint)
    return tuple(out), problems
