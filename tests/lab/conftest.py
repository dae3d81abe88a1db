"""Lab tests: the shared helpers of labtools.py."""

import os
import sys

# --import-mode=importlib does not put test dirs on sys.path; labtools.py needs it.
sys.path.insert(0, os.path.dirname(__file__))
