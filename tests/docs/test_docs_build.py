"""The docs site builds with warnings as errors, its internal links and images resolve, and its references cover
every public name, every magic and every example notebook (with outputs)."""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import jupytext
import pytest

import forge_nb
from tests.docs.conftest import ROOT, Build

pytestmark = pytest.mark.timeout(600)

NOTEBOOKS = sorted((ROOT / "example_notebooks").glob("[0-9][0-9]_*.py"))
EXECUTED = ROOT / "docs" / "notebooks"


class Page(HTMLParser):
    """The ids of one HTML page and the links and sources it refers to."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.refs: list[tuple[str, str]] = []  # (tag, url)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        for key in ("id", "name"):
            if a.get(key):
                self.ids.add(a[key])
        url = a.get("href") if tag in ("a", "link") else a.get("src") if tag in ("img", "script") else None
        if url:
            self.refs.append((tag, url))


def parse(path: Path) -> Page:
    page = Page()
    page.feed(path.read_text(errors="replace"))
    return page


def broken_refs(html: Path) -> list[str]:
    """``page: tag url (why)`` for every relative link, image or script of the site that does not resolve."""
    pages = {p: parse(p) for p in html.rglob("*.html") if "_static" not in p.relative_to(html).parts}  # theme parts
    broken = []
    for path, page in pages.items():
        for tag, url in page.refs:
            parts = urlsplit(url)
            if parts.scheme or parts.netloc or url.startswith("javascript:"):
                continue
            target = path if not parts.path else (path.parent / unquote(parts.path)).resolve()
            if target.is_dir():
                target = target / "index.html"
            where = f"{path.relative_to(html)}: <{tag}> {url}"
            if not target.exists():
                broken.append(f"{where} (no such file)")
            elif parts.fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else parse(target).ids
                if unquote(parts.fragment) not in ids:
                    broken.append(f"{where} (no id {parts.fragment!r} there)")
    return broken


def test_the_docs_build_with_warnings_as_errors_in_under_two_minutes(docs_build: Build):
    assert docs_build.returncode == 0, f"sphinx-build -W failed:\n{docs_build.output[-6000:]}"
    assert (docs_build.html / "index.html").exists()
    assert docs_build.seconds < 120, f"the docs build took {docs_build.seconds:.0f} s; keep it well under 2 minutes"


def test_every_internal_link_and_image_of_the_site_resolves(docs_build: Build):
    broken = broken_refs(docs_build.html)
    assert not broken, f"{len(broken)} broken reference(s):\n" + "\n".join(broken[:40])


def test_every_public_name_has_an_api_entry(docs_build: Build):
    ids = parse(docs_build.html / "api.html").ids
    missing = [name for name in forge_nb.__all__ if f"forge_nb.{name}" not in ids]
    assert not missing, f"forge_nb.__all__ names without an entry in docs/api.md's reference: {missing}"


def test_every_magic_has_a_reference_entry(docs_build: Build):
    from IPython.core.magic import Magics

    import forge_nb.magics

    classes = set()
    for info in pkgutil.iter_modules(forge_nb.magics.__path__):
        module = importlib.import_module(f"forge_nb.magics.{info.name}")
        classes |= {c for c in vars(module).values()
                    if inspect.isclass(c) and issubclass(c, Magics) and c is not Magics}
    magics = {name for cls in classes for table in cls.magics.values() for name in table}
    assert {"forge_spawn", "forge_run", "forge_serve", "forge_cluster", "forge_config"} <= magics
    page = parse(docs_build.html / "magics.html")
    missing = sorted(m for m in magics if m.replace("_", "-") not in page.ids)
    assert not missing, f"magics without a section in the magics reference: {missing}"


def _cells(nb: dict | object) -> list[tuple[str, str]]:
    cells = nb["cells"] if isinstance(nb, dict) else nb.cells
    return [(c["cell_type"], "".join(c["source"]).strip()) for c in cells]


@pytest.mark.parametrize("source", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_each_notebook_s_executed_copy_is_of_its_current_source(source: Path):
    executed = EXECUTED / f"{source.stem}.ipynb"
    fix = f"run `.venv/bin/python scripts/docs_notebooks.py {source.stem}` to execute it and save it for the docs"
    assert executed.exists(), f"docs/notebooks/{executed.name} is missing: {fix}"
    saved = json.loads(executed.read_text())
    assert _cells(saved) == _cells(jupytext.reads(source.read_text(), fmt="py:percent")), \
        f"example_notebooks/{source.name} changed since docs/notebooks/{executed.name} was executed: {fix}"
    assert "forge_nb" in saved["metadata"], f"docs/notebooks/{executed.name} has no record of its run: {fix}"
    text = executed.read_text()
    assert not re.search(r"(?<![\w.])/(?:work|home|root|tmp)/", text), f"a machine path in {executed.name}"


@pytest.mark.parametrize("source", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_each_notebook_page_carries_its_outputs(docs_build: Build, source: Path):
    page = docs_build.html / "notebooks" / f"{source.stem}.html"
    assert page.exists(), f"no page for {source.name}"
    html = page.read_text()
    outputs = html.count('class="cell_output')
    saved = json.loads((EXECUTED / f"{source.stem}.ipynb").read_text())
    with_output = sum(1 for c in saved["cells"] if c["cell_type"] == "code" and c.get("outputs"))
    assert with_output and outputs >= with_output, (source.stem, outputs, with_output)
    assert 'class="output traceback' not in html and "Traceback (most recent call last)" not in html


def test_the_readme_is_short_and_the_results_open_with_today_s_table():
    readme = (ROOT / "README.md").read_text().splitlines()
    assert len(readme) <= 250, f"README.md has {len(readme)} lines; the details belong in docs/"
    targets = re.findall(r"\]\(([^)#\s]+)[^)]*\)", "\n".join(readme))
    missing = [t for t in targets if "://" not in t and not (ROOT / t).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"
    results = (ROOT / "bench" / "RESULTS.md").read_text().splitlines()
    end = results.index("<!-- current-table-end -->")
    assert end < 150, "bench/RESULTS.md's current table must fit in its first 150 lines"
    rows = [line for line in results[:end] if line.startswith("| `")]
    benches = {p.name for p in (ROOT / "bench").glob("*.py") if not p.name.startswith("_")}
    named = {re.match(r"\| `([\w.]+)", row).group(1) for row in rows}
    assert named <= benches, f"rows of bench/RESULTS.md name no script: {sorted(named - benches)}"
