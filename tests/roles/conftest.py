"""The role tests: counted_playbook.py (ansible-playbook with NVML and parse calls counted) is
imported by some of them; labplay.py and labtools.py are the lab tests' helpers (tests/)."""

from __future__ import annotations

import os
import sys

# --import-mode=importlib does not put test directories on sys.path; counted_playbook.py needs it.
sys.path.insert(0, os.path.dirname(__file__))
