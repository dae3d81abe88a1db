"""Fixtures and helpers for the role tests (labplay.py: running playbooks, reading results)."""

from __future__ import annotations

import os
import sys

# --import-mode=importlib does not put test directories on sys.path; labplay.py needs it.
sys.path.insert(0, os.path.dirname(__file__))
