"""The node agent's run-time requirements, one per line: those of pyproject.toml's
dependencies that [tool.gpukit] agent-dependencies names, as pyproject.toml declares them.

    python3 deploy/agent_requirements.py pyproject.toml > requirements.txt

The agent's image installs these only: the command line's and the controller's dependencies
(typer and what it pulls in, tomlkit, cryptography) are no part of it. Run by the image's
Debian stage (standard library only); tests/unit/test_agent_image_build.py holds the list to
the agent's imports.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path


class RequirementsError(Exception):
    pass


def _name(requirement: str) -> str:
    """A requirement's distribution name, normalized as PEP 503 does."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if not match:
        raise RequirementsError(f"dependencies: {requirement!r} names no distribution")
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def agent_requirements(pyproject: dict[str, object]) -> list[str]:
    project = pyproject.get("project")
    tool = pyproject.get("tool")
    declared = project.get("dependencies") if isinstance(project, dict) else None
    gpukit = tool.get("gpukit") if isinstance(tool, dict) else None
    wanted = gpukit.get("agent-dependencies") if isinstance(gpukit, dict) else None
    if not isinstance(declared, list) or not isinstance(wanted, list) or not wanted:
        raise RequirementsError(
            "pyproject.toml needs [project] dependencies and [tool.gpukit] agent-dependencies")
    by_name = {_name(r): r for r in declared}
    missing = [w for w in wanted if _name(str(w)) not in by_name]
    if missing:
        raise RequirementsError(
            f"[tool.gpukit] agent-dependencies: {', '.join(map(repr, missing))} is not one of "
            f"[project] dependencies ({', '.join(sorted(by_name))})")
    return [by_name[_name(str(w))] for w in wanted]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        for line in agent_requirements(tomllib.loads(Path(argv[0]).read_text())):
            print(line)
    except (OSError, tomllib.TOMLDecodeError, RequirementsError) as e:
        print(f"agent_requirements: {argv[0]}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
