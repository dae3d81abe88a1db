"""ansible-playbook with the declaration model's entries counted: how often a play parses a
device plugin config and validates a host, read back by tests (not a timing).

    python tests/roles/counted_playbook.py CALLS_FILE -i INV site.yml ...

Each call of a counted function appends one line `<function> <host or source>` to CALLS_FILE.
Ansible's workers are forked from this process (ansible.utils.multiprocessing uses fork), so
the wrappers installed here count the preflight's action, every filter and every lookup.
"""

from __future__ import annotations

import functools
import os
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

# (module, function, which argument names the host or config): the entries counted.
COUNTED = (
    ("gpukit.contracts.plugin_config", "parse_config", "source"),
    ("gpukit.inventory.validate", "node_from_vars", "host"),
    ("gpukit.inventory.validate", "sharing", None),
)


def _counting(func: Callable[..., Any], name: str, arg: str | None, out: Path
              ) -> Callable[..., Any]:
    @functools.wraps(func)
    def run(*args: Any, **kwargs: Any) -> Any:
        what = kwargs.get(arg, args[0] if arg == "host" and args else "") if arg else ""
        with out.open("a") as f:  # O_APPEND: one short line per call, from any worker
            f.write(f"{name} {what}\n")
        return func(*args, **kwargs)

    return run


def install(out: Path) -> None:
    """Replace each counted function wherever gpukit bound it (`from m import f` copies)."""
    import importlib

    importlib.import_module("gpukit.inventory")  # the model and everything it binds
    importlib.import_module("gpukit.provision.agent")
    for module, name, arg in COUNTED:
        original = getattr(importlib.import_module(module), name)
        wrapped = _counting(original, name, arg, out)
        for mod in list(sys.modules.values()):
            if getattr(mod, "__name__", "").startswith("gpukit") and (
                    getattr(mod, name, None) is original):
                setattr(mod, name, wrapped)


def counts(path: Path) -> Counter[str]:
    """Calls per function name."""
    lines = path.read_text().splitlines() if path.exists() else []
    return Counter(line.split(" ", 1)[0] for line in lines)


def main() -> int:
    out = Path(sys.argv[1])
    install(out)
    from ansible.cli.playbook import main as playbook

    sys.argv = [str(Path(sys.executable).parent / "ansible-playbook"), *sys.argv[2:]]
    os.environ.setdefault("ANSIBLE_FORCE_COLOR", "0")
    return int(playbook() or 0)


if __name__ == "__main__":
    sys.exit(main())
