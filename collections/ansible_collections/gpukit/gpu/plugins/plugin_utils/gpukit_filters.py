"""What every gpukit.gpu filter shares: gpukit imported on the controller (a clear error in
the play when it is not), and the library's declaration errors as AnsibleFilterError.

Filters run in ansible-playbook's own process, so gpukit must be importable by the
controller's Python; module_utils/gpukit_common.py is the same for modules on the nodes."""

from __future__ import annotations

import functools
import importlib

from ansible.errors import AnsibleFilterError

GPUKIT_MISSING = (
    "gpukit is not importable on the controller ({error}): run ansible-playbook from gpukit's"
    " environment (.venv)"
)

try:
    from gpukit.inventory import InventoryError
    from gpukit.provision.agent import AgentSpecError
    from gpukit.provision.driver import DriverSpecError
    from gpukit.provision.nodes import NodeSpecError
    from gpukit.provision.upgrade import UpgradeSpecError
except ImportError as e:  # reported when a filter is used, not when Ansible lists plugins
    IMPORT_ERROR: ImportError | None = e
    DECLARATION_ERRORS: tuple[type[Exception], ...] = ()
else:
    IMPORT_ERROR = None
    # Errors that name the variable and value at fault: the play shows their message alone.
    DECLARATION_ERRORS = (DriverSpecError, NodeSpecError, AgentSpecError, UpgradeSpecError,
                          InventoryError)


def library(name):
    """gpukit's module `name`, or None when gpukit is missing (gpukit_filter reports it)."""
    if IMPORT_ERROR is not None:
        return None
    return importlib.import_module(name)


def gpukit_filter(func):
    """A filter over gpukit: fails with GPUKIT_MISSING when gpukit is not importable, and
    turns the library's declaration errors into AnsibleFilterError."""

    @functools.wraps(func)
    def run(*args, **kwargs):
        if IMPORT_ERROR is not None:
            raise AnsibleFilterError(GPUKIT_MISSING.format(error=IMPORT_ERROR))
        try:
            return func(*args, **kwargs)
        except DECLARATION_ERRORS as e:
            raise AnsibleFilterError(str(e)) from e

    return run


def filter_map(*funcs):
    """FilterModule.filters()'s mapping: each filter under its function's name."""
    return {f.__name__: f for f in funcs}
