"""The DRA plugin's tests; stand-ins live in dra_testlib.py."""

import os
import sys

# --import-mode=importlib does not put test dirs on sys.path; dra_testlib.py needs it.
sys.path.insert(0, os.path.dirname(__file__))


import pytest


@pytest.fixture(autouse=True)
def _no_host_sysfs(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
                   ) -> None:
    """The plugin reads the PCIe root from GPUKIT_SYSFS_ROOT: an empty tree here, never the
    test machine's /sys (its PCI devices are not the test's GPUs)."""
    monkeypatch.setenv("GPUKIT_SYSFS_ROOT", str(tmp_path_factory.mktemp("no-sysfs")))
