"""The conformance suite's own tests: helpers live next to them (labprovision.py)."""

from __future__ import annotations

import os
import sys

# --import-mode=importlib does not put test dirs on sys.path; labprovision.py needs it.
sys.path.insert(0, os.path.dirname(__file__))
