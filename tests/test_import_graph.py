"""Dependencies point one way (magics -> run -> services/actors/rl -> runtime); imports have no side effects."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "forge_nb"

# layer of each top-level part of forge_nb: a module may import only from its own layer or lower ones.
LAYERS = {
    "_procs": 0, "_monarch_compat": 0, "rl": 0, "data": 0, "models": 0, "metrics": 0, "sft": 0, "exporters": 1,
    "runtime": 1, "_procinfo": 1, "_torchstore": 2, "weights": 2, "config": 2,
    "service": 3, "actors": 4, "rundir": 4, "apps": 5, "loops": 5, "run": 5, "spawning": 6, "recipes": 6,
    "widgets": 7, "magics": 8,
}
# widgets read metrics and status only: never the process machinery
FORBIDDEN = {"widgets": {"runtime", "service", "actors", "_torchstore", "weights", "_procinfo"},
             "data": {"runtime", "service", "actors", "weights", "_torchstore"},
             "rl": {"runtime", "service", "actors", "weights", "_torchstore"},
             "exporters": {"runtime", "service", "actors", "_torchstore", "weights", "_procinfo"}}


def _part(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "forge_nb" and len(parts) > 1 else None


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names if node.module == "forge_nb"}
    return found


def _modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).with_suffix("")
        if rel.parts == ("__init__",):
            continue
        out.append((rel.parts[0], path))
    return out


@pytest.mark.parametrize(("part", "path"), _modules(), ids=lambda x: str(x) if isinstance(x, str) else x.name)
def test_dependencies_point_one_way(part, path):
    assert part in LAYERS, f"new top-level module {part!r}: give it a layer in this test"
    for module in _imports(path):
        target = _part(module)
        if target is None or target == part or target not in LAYERS:
            continue
        assert LAYERS[target] <= LAYERS[part], f"{path.name} ({part}) imports {module} from a higher layer"
        assert target not in FORBIDDEN.get(part, set()), f"{path.name} ({part}) must not import {module}"


def _fresh_import(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys; print(' '.join(sorted(sys.modules)))"],
                         capture_output=True, text=True, check=True, timeout=120)
    return set(out.stdout.split())


def test_importing_forge_nb_loads_nothing_heavy_and_changes_no_environment():
    loaded = _fresh_import("import os; before = dict(os.environ); import forge_nb; assert dict(os.environ) == before")
    assert not {"monarch", "torch", "vllm", "torchstore", "IPython"} & loaded


def test_rl_imports_neither_monarch_nor_ipython():
    loaded = _fresh_import("import forge_nb.rl")
    assert not {"monarch", "IPython", "vllm"} & loaded
