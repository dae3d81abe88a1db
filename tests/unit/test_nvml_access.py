"""NVML access in one layer: the node agent, the MIG manager and the facts module call pynvml
only through gpukit.plugin.nvml (calls, discovery, events, mig).

The lab (its mock's own tools) is outside the product and not held to it. The conformance
suite reads the driver with its own ctypes probe, an independent witness, and its workload
check ships a user's program (pynvml inside a pod's script, not an import of the suite's).
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PRODUCT = [REPO / "gpukit",
           REPO / "collections" / "ansible_collections" / "gpukit" / "gpu" / "plugins"]
LAYER = REPO / "gpukit" / "plugin" / "nvml"


def _imports_pynvml(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "pynvml"
                                                for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pynvml"):
            return True
    return False


def _sources() -> list[Path]:
    out = []
    for root in PRODUCT:
        for path in root.rglob("*.py"):
            if path.is_relative_to(REPO / "gpukit" / "lab"):
                continue  # the lab is no product (its mock and tools load NVML themselves)
            out.append(path)
    return out


def test_pynvml_only_in_the_nvml_layer() -> None:
    outside = sorted(str(p.relative_to(REPO)) for p in _sources()
                     if _imports_pynvml(p) and not p.is_relative_to(LAYER))
    assert outside == []


def test_the_layer_is_where_nvml_is_called() -> None:
    # The rule would pass on a scan that finds nothing: the layer itself must be seen.
    inside = {p.name for p in _sources() if p.is_relative_to(LAYER) and _imports_pynvml(p)}
    assert {"calls.py", "discovery.py", "events.py", "mig.py"} <= inside


def test_a_lazy_import_counts(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text("def f():\n    import pynvml as n\n    return n\n")
    assert _imports_pynvml(f)
    f.write_text("from pynvml import nvmlInit\n")
    assert _imports_pynvml(f)
    f.write_text("import json\n")
    assert not _imports_pynvml(f)
