"""forge_nb.rl depends only on the standard library and torch; math_verify, datasets and numpy (what a tensor's
``.numpy()`` needs anyway) load lazily, inside the functions that use them."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import forge_nb.rl

RL_DIR = Path(forge_nb.rl.__file__).parent
ALLOWED_TOP_LEVEL = {"torch", "forge_nb"} | set(sys.stdlib_module_names)
LAZY_ONLY = {"math_verify", "datasets", "numpy"}


def imports(tree: ast.AST, *, top_level_only: bool) -> list[str]:
    nodes = tree.body if top_level_only else list(ast.walk(tree))  # type: ignore[attr-defined]
    names = []
    for node in nodes:
        if isinstance(node, ast.Import):
            names += [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module.split(".")[0])
    return names


def test_modules_import_only_stdlib_and_torch_at_top_level() -> None:
    files = sorted(RL_DIR.rglob("*.py"))
    assert len(files) >= 8
    for path in files:
        tree = ast.parse(path.read_text())
        assert ast.get_docstring(tree), f"{path.name} needs a module docstring"
        top = imports(tree, top_level_only=True)
        assert set(top) <= ALLOWED_TOP_LEVEL, f"{path}: {set(top) - ALLOWED_TOP_LEVEL}"
        anywhere = set(imports(tree, top_level_only=False))
        assert anywhere <= ALLOWED_TOP_LEVEL | LAZY_ONLY, (
            f"{path}: {anywhere - ALLOWED_TOP_LEVEL - LAZY_ONLY}"
        )
        assert not anywhere & {"monarch", "IPython"}


def test_importing_the_rl_modules_loads_no_heavy_dependency() -> None:
    # load the rl modules without forge_nb/__init__.py, which may legitimately pull in the runtime
    code = (
        "import importlib.util, sys, types\n"
        f"pkg = types.ModuleType('forge_nb'); pkg.__path__ = [{str(RL_DIR.parent)!r}]\n"
        "sys.modules['forge_nb'] = pkg\n"
        "import forge_nb.rl\n"
        "[getattr(forge_nb.rl, name) for name in forge_nb.rl.__all__]  # its names load their modules on use\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'monarch', 'IPython', 'math_verify', 'datasets', 'transformers'})\n"
        "print(bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_public_names_are_exported() -> None:
    for name in forge_nb.rl.__all__:
        assert hasattr(forge_nb.rl, name), name
    assert {"Episode", "Completion", "ReplayBuffer", "make_loss", "score", "ToyTask"} <= set(
        forge_nb.rl.__all__
    )
