"""forge_nb.widgets reads metrics and status only: it never imports monarch or the layers below the Run."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import forge_nb.widgets

pytestmark = pytest.mark.timeout(120)

WIDGETS = Path(forge_nb.widgets.__file__).parent
FORBIDDEN = ("monarch", "forge_nb.service", "forge_nb.system.runtime", "forge_nb.weights", "forge_nb.actors",
             "forge_nb.run", "forge_nb.controller", "torch", "vllm")
# the words of a run's public ``state`` (a StrEnum, no code of the controller's): the badge and buttons read them
ALLOWED = {"forge_nb.controller.state"}


def _imported(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_no_widget_module_imports_monarch_or_the_service_layer() -> None:
    files = sorted(WIDGETS.rglob("*.py"))
    assert len(files) >= 8
    for path in files:
        source = path.read_text()
        tree = ast.parse(source)
        assert ast.get_docstring(tree), f"{path.name} needs a module docstring"
        assert len(source.splitlines()) < 300, f"{path.name} is over 300 lines"
        bad = {n for n in _imported(tree) for f in FORBIDDEN if n == f or n.startswith(f + ".")} - ALLOWED
        assert not bad, f"{path.name} imports {bad}"


def test_importing_the_widgets_loads_neither_monarch_nor_panel() -> None:
    code = ("import sys, forge_nb.widgets as w; w.Dashboard; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('monarch', 'panel', 'torch', 'vllm')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=100, check=True)
    assert out.stdout.strip() == "[]", out.stdout
