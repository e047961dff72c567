"""The quickstart in Jupyter Notebook 7 (chromium): it opens as a notebook, runs, and ``%forge_dashboard --side``
shows the dashboard in the cell with its one-line reason, as Notebook 7's shell has no place for sidecar's panel.

The server is the one test_open_in_jupyterlab.py starts, as ``jupyter notebook``. The run is the real
quickstart (two vLLM CPU engines) at a small budget typed into its parameters cell; a screenshot goes to
test-artifacts/notebooks/.
"""

from __future__ import annotations

import importlib.util
import time
import urllib.request
from typing import Any

import pytest

from tests.notebooks.test_open_in_jupyterlab import (
    ARTIFACTS,
    CELLS,
    CHROMIUM,
    ERRORS,
    FLAGS,
    NOTEBOOK,
    POINTS,
    _get,
    needs_chromium,
    serve,
)

STEPS = 20
CELL = ".jp-NotebookPanel .jp-CodeCell"


def _run_all(page: Any, url: str, console: list[str]) -> None:
    page.goto(f"{url}/notebooks/{NOTEBOOK}")
    page.wait_for_selector(".jp-NotebookPanel .jp-MarkdownCell", timeout=120_000)
    time.sleep(1)
    assert page.locator(".jp-Dialog", has_text="Select Kernel").count() == 0  # the jupytext header names it
    params = page.locator(CELL, has_text="STEPS = ").first
    params.locator(".cm-content").click()
    page.keyboard.press("Control+a")
    page.keyboard.type(f"STEPS = {STEPS}")
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
    page.locator(".lm-Menu-item", has_text="Run All Cells").first.click()
    deadline = time.monotonic() + 900
    while not all(p[1:-2].strip().isdigit() for _, p in page.evaluate(CELLS)):
        assert page.locator(ERRORS).count() == 0, "a cell failed"
        assert time.monotonic() < deadline, "the notebook did not finish"
        time.sleep(1)


@needs_chromium
@pytest.mark.heavy
@pytest.mark.timeout(1200)
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM (the cpu or gpu extra)")
@pytest.mark.skipif(importlib.util.find_spec("sidecar") is None, reason="needs sidecar (the notebook extra)")
@pytest.mark.skipif(importlib.util.find_spec("notebook") is None, reason="needs notebook 7 (the notebook extra)")
def test_the_quickstart_runs_in_notebook_7_with_its_side_dashboard_in_the_cell_saying_why() -> None:
    pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    from playwright.sync_api import sync_playwright

    with serve("notebook", extra=()) as (url, _, _):
        try:
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
                try:
                    page = browser.new_page(viewport={"width": 1400, "height": 900})
                    console: list[str] = []
                    page.on("pageerror", lambda e: console.append(f"uncaught: {e}"))
                    page.on("console", lambda m: console.append(m.text) if m.type == "error" else None)
                    try:
                        _run_all(page, url, console)
                    finally:
                        page.screenshot(path=str(ARTIFACTS / "quickstart-notebook7.png"))
                    cell = page.locator(CELL, has_text="%forge_dashboard --side")
                    cell.scroll_into_view_if_needed()
                    note = cell.locator(".forge-side-note[data-where='cell']")
                    try:
                        note.wait_for(timeout=30_000)
                    except Exception:
                        (ARTIFACTS / "notebook7-cell.html").write_text(cell.inner_html() + "\n".join(console))
                        raise
                    text = note.text_content()  # innerText is empty while the cell is scrolled away
                    assert text.startswith("no side panel in this front-end") and "here in the cell" in text, text
                    assert "beside the notebook" not in text
                    board = cell.locator(".forge-dashboard")
                    board.locator(".forge-run-status[data-state='shut down']").wait_for(timeout=30_000)
                    assert board.is_visible()
                    assert board.locator(".forge-run-status").text_content().startswith("quickstart")
                    assert board.locator(".forge-curves").first.evaluate(POINTS) >= STEPS
                    assert not cell.locator(".forge-dashboard-static").first.is_visible()  # the snapshot: hidden
                    cell.screenshot(path=str(ARTIFACTS / "quickstart-notebook7-dashboard-in-cell.png"))
                finally:
                    browser.close()
        finally:
            for kernel in _get(f"{url}/api/kernels"):
                request = urllib.request.Request(f"{url}/api/kernels/{kernel['id']}", method="DELETE")
                urllib.request.urlopen(request, timeout=60).close()
