"""The DRA plugin's tests; stand-ins live in dra_testlib.py."""

import os
import sys

# --import-mode=importlib does not put test dirs on sys.path; dra_testlib.py needs it.
sys.path.insert(0, os.path.dirname(__file__))
