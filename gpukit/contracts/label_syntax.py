"""Kubernetes label syntax, checked in one place for the inventory model and the roles."""

from __future__ import annotations

import re

LABEL_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)$")
LABEL_PREFIX = re.compile(
    r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*$"
)
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def key_problem(key: str) -> str | None:
    """Why `key` is not a valid label (or taint) key; None when it is."""
    prefix, sep, name = key.rpartition("/")
    if sep and (not prefix or len(prefix) > 253 or not LABEL_PREFIX.match(prefix)):
        return f"the prefix {prefix!r} is not a DNS subdomain"
    if not LABEL_NAME.match(name):
        return "the name must be 1-63 characters of [A-Za-z0-9-_.], alphanumeric at both ends"
    return None


def value_ok(value: str) -> bool:
    return len(value) <= 63 and bool(LABEL_VALUE.match(value))
