"""forge_nb's Sphinx directives: the magics reference and the example notebooks' table, written from the code.

``forge-magics-table`` renders the table of ``forge_nb.magics`` (what ``%forge_help`` prints), ``forge-magics`` one
section per magic, titled ``%forge_NAME`` (its anchor ``forge-NAME``), holding the magic's docstring: the usage and
options that ``MAGIC?`` shows in a notebook (IPython's ``magic_arguments`` write them into the docstring). A
magic added to one of the Magics classes appears here without an edit to the docs.

``forge-notebooks`` lists the executed notebooks under ``docs/notebooks/``: each one's title and first sentence
(from its first markdown cell), and when, where and in how long ``scripts/docs_notebooks.py`` executed it (the
metadata that script records).
"""

from __future__ import annotations

import inspect
import json
import re
import textwrap
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles


def magic_classes() -> list[type]:
    """Every IPython ``Magics`` class of ``forge_nb.magics``'s modules that declares magics, in module order."""
    import importlib
    import pkgutil

    from IPython.core.magic import Magics

    import forge_nb.magics

    found = []
    for info in pkgutil.iter_modules(forge_nb.magics.__path__):
        module = importlib.import_module(f"forge_nb.magics.{info.name}")
        found += [cls for _, cls in inspect.getmembers(module, inspect.isclass)
                  if issubclass(cls, Magics) and cls.__module__ == module.__name__ and any(cls.magics.values())]
    return found


def magic_docs() -> list[tuple[str, str, str]]:
    """``(kind, name, docstring)`` of every %forge_* magic, in the order of ``%forge_help``'s table (one it does not
    list goes last)."""
    from forge_nb.magics import help_text

    table = help_text()
    found = [(kind, name, inspect.cleandoc(getattr(cls, method).__doc__ or ""))
             for cls in magic_classes() for kind, magics in cls.magics.items() for name, method in magics.items()]
    return sorted(found, key=lambda m: table.find(f"%{m[1]} ") % (len(table) + 1))


def magic_markdown(doc: str) -> list[str]:
    """A magic's docstring as MyST: its usage (the ``::`` block) and argparse's argument lists as text blocks,
    the prose between them as it is."""
    out: list[str] = []
    lines = doc.splitlines()
    i = 0
    while i < len(lines):
        head = lines[i].strip()
        if head != "::" and head not in ("positional arguments:", "options:", "optional arguments:"):
            out.append(lines[i])
            i += 1
            continue
        i += 1
        block = []
        while i < len(lines) and (not lines[i].strip() or lines[i].startswith(" ")):
            block.append(lines[i])
            i += 1
        text = textwrap.dedent("\n".join(block)).strip("\n")
        out += ([] if head == "::" else [f"**{head}**", ""]) + ["```text", *text.splitlines(), "```", ""]
    return out


class ForgeMagics(SphinxDirective):
    """``forge-magics``: the magics' table, then a section per magic."""

    def run(self) -> list[nodes.Node]:
        lines = []
        for kind, name, doc in magic_docs():
            lines += [f"## `{'%%' if kind == 'cell' else '%'}{name}`", ""] + magic_markdown(doc) + [""]
        return _parse(self, lines, "forge_nb.magics")


class ForgeMagicsTable(SphinxDirective):
    """``forge-magics-table``: the table ``%forge_help`` prints. (A directive of its own: MyST files the headings
    of ``forge-magics`` straight into the page, ahead of anything else that directive returns.)"""

    def run(self) -> list[nodes.Node]:
        from forge_nb.magics import help_text

        return _parse(self, ["```text", *help_text().splitlines(), "```"], "forge_nb.magics")


def _parse(directive: SphinxDirective, lines: list[str], source: str) -> list[nodes.Node]:
    """``lines`` of MyST parsed in place of the directive (headings become sections of the page)."""
    container = nodes.section()
    container.document = directive.state.document
    nested_parse_with_titles(directive.state, StringList(lines, source=source), container)
    return list(container.children)


def notebook_rows(folder: Path) -> list[tuple[str, str, str, str]]:
    """``(name, title, first sentence, how it ran)`` of each executed notebook in ``folder``."""
    rows = []
    for path in sorted(folder.glob("[0-9][0-9]_*.ipynb")):
        nb = json.loads(path.read_text())
        text = "".join(nb["cells"][0]["source"]) if nb["cells"] else ""
        title = next((line.lstrip("# ").strip() for line in text.splitlines() if line.startswith("#")), path.stem)
        body = " ".join(line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#"))
        sentence = re.split(r"(?<=\.)\s", body, maxsplit=1)[0].replace("|", "\\|") if body else ""
        ran = nb["metadata"].get("forge_nb", {})
        seconds = ran.get("seconds", 0)
        took = f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"
        how = f"{took}, {ran['executed'][:10]}, {ran['commit']}" if ran else "not executed yet"
        rows.append((path.stem, title, sentence, how))
    return rows


class ForgeNotebooks(SphinxDirective):
    """``forge-notebooks``: a table of the executed example notebooks."""

    def run(self) -> list[nodes.Node]:
        folder = Path(self.env.srcdir) / "notebooks"
        lines = ["| notebook | what it shows | executed: time, date, commit |", "|---|---|---|"]
        for name, title, sentence, how in notebook_rows(folder):
            lines.append(f"| [{name}]({name}.ipynb) | **{title}**. {sentence} | {how} |")
        for path in folder.glob("[0-9][0-9]_*.ipynb"):
            self.env.note_dependency(str(path))
        return _parse(self, lines, "docs/notebooks")


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("forge-magics-table", ForgeMagicsTable)
    app.add_directive("forge-magics", ForgeMagics)
    app.add_directive("forge-notebooks", ForgeNotebooks)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
