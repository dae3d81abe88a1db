"""Run one of the collection's modules as a role's task would: ansible-playbook on localhost
with this interpreter, its result read from the JSON callback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def run_module(tmp: Path, module: str, args: dict[str, Any], *flags: str) -> dict[str, Any]:
    """One `gpukit.gpu.<module>` task on localhost (its play written to `tmp`); its result."""
    play = [{"hosts": "localhost", "gather_facts": False,
             "tasks": [{"name": module, f"gpukit.gpu.{module}": args}]}]  # fmt: skip
    (tmp / "play.yml").write_text(yaml.safe_dump(play))
    env = {**os.environ, "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json", "ANSIBLE_NOCOLOR": "1",
           "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}  # fmt: skip
    r = subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local",
         "-e", f"ansible_python_interpreter={sys.executable}", str(tmp / "play.yml"), *flags],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    doc = json.loads(r.stdout[r.stdout.index("{") :])
    result: dict[str, Any] = doc["plays"][0]["tasks"][0]["hosts"]["localhost"]
    return result
