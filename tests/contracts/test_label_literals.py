"""Every `nvidia.com/` and `gpukit.io/` name gpukit's Python writes or reads is spelled once, in
gpukit.contracts.label_names (role YAML is held to it by tests/roles/test_role_contracts.py).

A string that is such a name, anywhere in the product's code outside gpukit.contracts
(docstrings aside), fails this test: use the constant instead.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PRODUCT = [REPO / "gpukit",
           REPO / "collections" / "ansible_collections" / "gpukit" / "gpu" / "plugins"]
CONTRACTS = REPO / "gpukit" / "contracts"
NAME = re.compile(r"^(nvidia\.com|gpukit\.io)/[A-Za-z0-9.\-]*$")


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def literals(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    docs = _docstrings(tree)
    return [f"{path.relative_to(REPO)}:{node.lineno}: {node.value!r}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in docs and NAME.match(node.value)]


def _sources() -> list[Path]:
    out = []
    for root in PRODUCT:
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(REPO)
            if rel.parts[:2] == ("gpukit", "lab"):
                continue  # the lab is no product: it may spell its own literals
            if path.is_relative_to(CONTRACTS) or "api" in rel.parts:
                continue
            out.append(path)
    return out


def test_no_label_name_literal_outside_the_contracts() -> None:
    assert [hit for path in _sources() for hit in literals(path)] == []


def test_the_scan_finds_a_literal_and_skips_docstrings(tmp_path: Path) -> None:
    f = REPO / "tests" / "contracts" / "_probe_literal.py"
    try:
        f.write_text('"""Sets "nvidia.com/gpu.product"."""\nX = {"nvidia.com/gpu.count": 1}\n'
                     'Y = "CDI kind nvidia.com/gpu"\n')
        assert literals(f) == ["tests/contracts/_probe_literal.py:2: 'nvidia.com/gpu.count'"]
    finally:
        f.unlink()
    assert len(_sources()) > 50
