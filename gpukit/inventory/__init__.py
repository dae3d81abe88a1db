"""The inventory model: what an Ansible inventory declares about each GPU node.

One package reads the inventory (`inventories/README.md` is the variable schema) for the roles,
the CLI and the conformance suite, and validates each host's declaration in one place:

* ``model``     the declarations (NodeDecl, GpuDecl, Taint, GpuInventory) and the choices
* ``problems``  Problem and InventoryError: host, variable (dotted path), value
* ``validate``  ``node_from_vars``: one host's merged variables -> NodeDecl, every problem
* ``load``      ``load``: an Ansible inventory (Ansible's own precedence and templating)
* ``check``     ``check``: the whole inventory and what it implies, for the preflight

    from gpukit import inventory

    inv = inventory.load("inventories/lab")
    node = inv.node("gpu-t4")
    node.gpu, node.mig_gpus, node.plugin_config

What a node must then serve is the conformance suite's oracle, gpukit.conformance.expect
(`expected_resources` and `expected_labels` here hand over to it).
"""

from .check import (
    CheckResult,
    check,
    expected_dra_devices,
    expected_labels,
    expected_resources,
)
from .load import DECLARED_VARIABLES, declared_vars, load, plain
from .model import (
    DEVICE_PLUGIN_CONFIG_LABEL,
    GPU_GROUP,
    GPU_RESOURCE,
    KERNEL_MODULES,
    MIG_CONFIG_LABEL,
    RUNTIMES,
    TAINT_EFFECTS,
    GpuDecl,
    GpuInventory,
    GpuMig,
    NodeDecl,
    Taint,
)
from .problems import InventoryError, Problem
from .validate import node_from_vars

__all__ = [
    "DECLARED_VARIABLES", "DEVICE_PLUGIN_CONFIG_LABEL", "GPU_GROUP", "GPU_RESOURCE",
    "KERNEL_MODULES", "MIG_CONFIG_LABEL", "RUNTIMES", "TAINT_EFFECTS", "CheckResult",
    "GpuDecl", "GpuInventory", "GpuMig", "InventoryError", "NodeDecl", "Problem", "Taint",
    "check", "declared_vars", "expected_dra_devices", "expected_labels", "expected_resources",
    "load", "node_from_vars", "plain",
]
