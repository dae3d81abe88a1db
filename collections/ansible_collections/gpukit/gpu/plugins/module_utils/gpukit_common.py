"""Shared helpers for gpukit.gpu modules: importing gpukit, writing files with diff/check."""

from __future__ import annotations

import os
import sys
import tempfile

GPUKIT_MISSING = (
    "gpukit is not importable by {python}: run the gpukit_node role first (it installs gpukit"
    " into a venv on the node) and run this task with ansible_python_interpreter set to that"
    " venv's python (gpukit_node_python). Import error: {error}"
)


def ansible_module(argument_spec):
    """The AnsibleModule of a gpukit.gpu module (check mode supported: every module plans
    before it changes anything), failed with GPUKIT_MISSING when gpukit is not importable."""
    from ansible.module_utils.basic import AnsibleModule

    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True)
    require_gpukit(module)
    return module


def require_gpukit(module):
    """Fail the module with a message that says what to do when gpukit is missing."""
    try:
        import gpukit  # noqa: F401
    except ImportError as e:
        module.fail_json(msg=GPUKIT_MISSING.format(python=sys.executable, error=e))


def read_text(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        return None


def write_text(module, path, text, mode=0o644):
    """Write `text` to `path` atomically (same directory, then rename); keeps an existing
    file's mode and ownership (module.atomic_move), gives a new file `mode`."""
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        os.makedirs(directory, mode=0o755)
    existed = os.path.exists(path)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".gpukit-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        if not existed:
            os.chmod(tmp, mode)
        module.atomic_move(tmp, path, unsafe_writes=False)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def edit_result(edit):
    """An Edit as module return values."""
    return {
        "path": edit.path,
        "changed": edit.changed,
        "changes": list(edit.changes),
    }
