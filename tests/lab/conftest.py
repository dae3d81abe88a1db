"""Lab tests: test_cuda_workload.py builds on test_runtime_strategies.py's fixtures."""

import os
import sys

# --import-mode=importlib does not put test folders on sys.path; that import needs it.
sys.path.insert(0, os.path.dirname(__file__))
