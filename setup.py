"""Build hook: the wheel carries the kubelet API's gRPC stubs, generated from
gpukit/plugin/api/*.proto while building (grpcio-tools is a build requirement, not a run-time one).

Everything else about the package is in pyproject.toml. The stubs are not committed: the
generator's version decides which grpcio and protobuf they need at run time, so the build
refuses stubs that need more than pyproject.toml's dependencies promise.
"""

from __future__ import annotations

import importlib.util
import re
import tomllib
from pathlib import Path
from types import ModuleType

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
API = "gpukit/plugin/api"


def _generator() -> ModuleType:
    # Loaded by path: importing the package would need its run-time dependencies.
    spec = importlib.util.spec_from_file_location("_gpukit_generate", HERE / API / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _floor(requirement_name: str) -> tuple[int, ...]:
    deps = tomllib.loads((HERE / "pyproject.toml").read_text())["project"]["dependencies"]
    for dep in deps:
        m = re.match(rf"^{re.escape(requirement_name)}\s*>=\s*([0-9.]+)", dep, re.I)
        if m:
            return tuple(int(x) for x in m.group(1).split("."))
    raise SystemExit(f"setup.py: pyproject.toml declares no '{requirement_name}>=' dependency")


class BuildPyWithStubs(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:  # a checkout generates its stubs on first use
            return
        out = Path(self.build_lib) / API
        generator = _generator()
        written = generator.generate(out)
        needs = generator.runtime_requirements(out)
        for name, version in needs.items():
            floor = _floor(name)
            if floor < version:
                raise SystemExit(
                    f"setup.py: the generated stubs need {name}>={'.'.join(map(str, version))} "
                    f"but pyproject.toml promises {name}>={'.'.join(map(str, floor))}: raise "
                    "the dependency or build with the grpcio-tools the build requirements pin"
                )
        self.announce(f"generated {len(written)} gRPC stub modules in {out}", level=2)


setup(cmdclass={"build_py": BuildPyWithStubs})
