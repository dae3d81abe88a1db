"""The entry point as a process: exit codes, failOnInitError, clean SIGTERM."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from stopping import killed_at_exit, terminate

PY = sys.executable


def run(*args: str, env: dict[str, str] | None = None, timeout: float = 60
        ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "gpukit.plugin", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})}, check=False)


def test_check_config_prints_resolved(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("flags:\n  migStrategy: mixed\n")
    proc = run("--check-config", "--config-file", str(f), "--device-id-strategy", "index")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["flags"]["mig_strategy"] == "mixed"
    assert out["flags"]["plugin"]["device_id_strategy"] == "index"


def test_invalid_config_exit_2(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("sharing:\n  timeSlicing:\n    resources:\n    - {name: gpu, replicas: 1}\n")
    proc = run("--check-config", "--config-file", str(f))
    assert proc.returncode == 2
    assert "sharing.timeSlicing.resources[0].replicas: 1 is not >= 2" in proc.stderr


def test_nvml_failure_obeys_fail_on_init_error(short_tmp: Path) -> None:
    args = ("--nvml-library", "/nonexistent/libnvidia-ml.so.1", "--kubelet-dir", str(short_tmp),
            "--metrics-address", "")
    proc = run(*args)
    assert proc.returncode == 1
    assert "NVML initialisation failed" in proc.stderr and "failOnInitError" in proc.stderr

    p = subprocess.Popen([PY, "-m", "gpukit.plugin", *args], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True,
                         env={**os.environ, "FAIL_ON_INIT_ERROR": "false"})
    with killed_at_exit(p):
        time.sleep(2.0)
        assert p.poll() is None, "must keep running without GPUs"
        out = terminate(p, timeout=20)
    assert p.returncode == 0, out
    assert "serving no devices" in out
