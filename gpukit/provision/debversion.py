"""Debian version strings: comparison (dpkg's algorithm) and the upstream part."""

from __future__ import annotations

import functools
import re

_VALID = re.compile(r"^(\d+:)?[0-9][A-Za-z0-9.+~:-]*$")


def split(version: str) -> tuple[int, str, str]:
    """(epoch, upstream, revision) of `[epoch:]upstream[-revision]`."""
    v = version.strip()
    if not _VALID.match(v):
        raise ValueError(f"{version!r} is not a Debian version")
    epoch = 0
    e, sep, rest = v.partition(":")
    if sep and e.isdigit():
        epoch, v = int(e), rest
    upstream, sep, revision = v.rpartition("-")
    if not sep:
        upstream, revision = v, ""
    return epoch, upstream, revision


def upstream(version: str) -> str:
    """`550.90.07-1` -> `550.90.07`; `3:550.90.07-1.el9` -> `550.90.07`."""
    return split(version)[1]


def _order(c: str) -> int:
    if c == "~":
        return -1
    if c.isdigit():
        return 0
    if c.isalpha():
        return ord(c)
    return ord(c) + 256


def _compare_part(a: str, b: str) -> int:
    i = j = 0
    while i < len(a) or j < len(b):
        first_diff = 0
        while (i < len(a) and not a[i].isdigit()) or (j < len(b) and not b[j].isdigit()):
            ac = _order(a[i]) if i < len(a) and not a[i].isdigit() else 0
            bc = _order(b[j]) if j < len(b) and not b[j].isdigit() else 0
            if ac != bc:
                return -1 if ac < bc else 1
            i += 1
            j += 1
        while i < len(a) and a[i] == "0":
            i += 1
        while j < len(b) and b[j] == "0":
            j += 1
        while i < len(a) and a[i].isdigit() and j < len(b) and b[j].isdigit():
            if not first_diff:
                first_diff = (a[i] > b[j]) - (a[i] < b[j])
            i += 1
            j += 1
        if i < len(a) and a[i].isdigit():
            return 1
        if j < len(b) and b[j].isdigit():
            return -1
        if first_diff:
            return first_diff
    return 0


def compare(a: str, b: str) -> int:
    """-1, 0 or 1, as `dpkg --compare-versions`."""
    ea, ua, ra = split(a)
    eb, ub, rb = split(b)
    if ea != eb:
        return -1 if ea < eb else 1
    return _compare_part(ua, ub) or _compare_part(ra, rb)


sort_key = functools.cmp_to_key(compare)


def in_branch(version: str, branch: str) -> bool:
    """Does `version` belong to driver branch `branch` (`550.90.07-1` is in `550`)?"""
    up = upstream(version)
    return up == branch or up.startswith(branch + ".")
