"""Fixtures for the device plugin tests; factories live in plugin_testlib.py."""

from __future__ import annotations

import os
import sys

# --import-mode=importlib does not put test dirs on sys.path; the factories module needs it.
sys.path.insert(0, os.path.dirname(__file__))
