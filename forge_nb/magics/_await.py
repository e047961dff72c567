"""Make ``%forge_spawn``, ``%forge_step`` and the other awaited magics block their cell without blocking the loop.

A line magic is a plain function call (``%forge_step 5`` becomes
``get_ipython().run_line_magic('forge_step', '5')``), run *inside* the kernel's event loop, which
the Run's background loops share. It cannot wait for a coroutine: ``loop.run_until_complete``
raises "This event loop is already running" in ipykernel (measured), and re-entering the loop
(nest_asyncio) is not an option. So an awaited magic parses and validates at once (misuse raises
``UsageError`` right there) and returns a coroutine, and this input transformer writes ``await``
in front of the call. IPython then sees top-level ``await`` and runs the cell as a task on the
kernel's loop: the cell blocks, the loops keep running, and an interrupt cancels only the cell.

Only calls that are whole statements (``%forge_step 5``, ``x = %forge_step 5``) at module level,
in top-level blocks (``for``, ``if``, ``with``, ``try``) or in an ``async def`` are rewritten; in
a plain ``def`` ``await`` is a syntax error, so there the magic returns its coroutine unawaited.
"""

from __future__ import annotations

import ast

#: Magics that return a coroutine (they need the kernel's event loop); every other one is synchronous.
AWAITED = frozenset({"forge_spawn", "forge_attach", "forge_run", "forge_resume", "forge_step", "forge_stop",
                     "forge_set", "forge_shutdown", "forge_cluster", "forge_serve", "forge_eval"})


def await_forge_magics(lines: list[str]) -> list[str]:
    """``input_transformers_post`` hook: prefix awaited ``run_line_magic`` calls with ``await``."""
    source = "".join(lines)
    if "run_line_magic('forge_" not in source:
        return lines
    try:  # a cell may await at top level itself (`run = await forge_nb.spawn(...)`), as IPython allows
        tree = compile(source, "<cell>", "exec", flags=ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    except SyntaxError:  # IPython reports it when it compiles the cell
        return lines
    spots = sorted(_calls_to_await(tree.body), reverse=True)
    if not spots:
        return lines
    out = source.splitlines(keepends=True)
    for lineno, col in spots:
        raw = out[lineno - 1].encode()  # ast offsets count UTF-8 bytes
        out[lineno - 1] = (raw[:col] + b"await " + raw[col:]).decode()
    return out


def _calls_to_await(body: list[ast.stmt]) -> list[tuple[int, int]]:
    found: list[tuple[int, int]] = []
    for stmt in body:
        if isinstance(stmt, ast.FunctionDef | ast.ClassDef):
            continue  # await is not allowed there
        value = stmt.value if isinstance(stmt, ast.Expr | ast.Assign | ast.AnnAssign) else None
        if value is not None and _is_awaited_magic(value):
            found.append((value.lineno, value.col_offset))
        for field in ("body", "orelse", "finalbody"):
            found += _calls_to_await(getattr(stmt, field, None) or [])
        for handler in getattr(stmt, "handlers", None) or []:
            found += _calls_to_await(handler.body)
    return found


def _is_awaited_magic(node: ast.expr) -> bool:
    """``get_ipython().run_line_magic('forge_<awaited>', ...)``."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "run_line_magic" and isinstance(node.func.value, ast.Call)
            and isinstance(node.func.value.func, ast.Name) and node.func.value.func.id == "get_ipython"
            and bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value in AWAITED)
