"""The example notebooks open as notebooks in a real JupyterLab, and the quickstart runs there end to end.

A JupyterLab server (127.0.0.1, free port, no token) serves a copy of example_notebooks/. Its contents API
must hand out ``01_quickstart.py`` as a notebook with the source's cells, its settings must name jupytext's
"Jupytext Notebook" the default viewer of Python files (jupyter-config/, installed by scripts/setup.sh),
and, where chromium is installed, a double-click in the file browser must open the notebook editor
(not the text editor). Opening must leave the source file as it was.

The heavy test then does what a user does: double-click the quickstart, type a budget of 150 steps into
its parameters cell, Run > Run All Cells, and watch the dashboard that ``%forge_dashboard --side`` docked
beside the notebook (the sidecar extension) stay in view while the later cells run and after the last one
(``%forge_shutdown``): at the width it opens with, no button, input, label, table column or panel title is
cut; the cells print no stderr and at most 60 lines in all; after the dashboard is made narrower, a drag
across one chart zooms every panel, with no error in the browser console. It spawns the real quickstart
(two vLLM CPU engines) in the lab's kernel. Screenshots go to test-artifacts/notebooks/.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from forge_nb.system.processes.procs import same_start, started
from tests.procs import descendants
from tests.waiting import until_sync

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "notebooks"
CHROMIUM = "/usr/bin/chromium"
NOTEBOOK = "01_quickstart.py"
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run", "--disable-quic"]

pytestmark = pytest.mark.timeout(300)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


@contextlib.contextmanager
def serve(app: str = "lab", extra: tuple[str, ...] = (
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",)) -> Iterator[tuple[str, Path, int]]:
    """(url, root, pid): ``jupyter <app>`` (JupyterLab, or Notebook 7: "notebook") serving a copy of
    example_notebooks/ (the user's settings left aside)."""
    tmp = Path(tempfile.mkdtemp(prefix="forge-nb-open-"))
    root = tmp / "root"
    shutil.copytree(ROOT / "example_notebooks", root, ignore=shutil.ignore_patterns("runs", ".ipynb_checkpoints"))
    news = tmp / "settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    news.parent.mkdir(parents=True)
    news.write_text('{"fetchNews": "false"}')  # no "official Jupyter news?" toast over the screenshot
    port = _free_port()
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"), "JUPYTER_CONFIG_DIR": str(tmp / "config"),
           "JUPYTERLAB_SETTINGS_DIR": str(tmp / "settings"), "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "ws")}
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    log = open(ARTIFACTS / f"jupyter{app}.log", "w")  # noqa: SIM115 - closed below
    # the README's command (`jupyter lab --no-browser --allow-root`), pinned to a port and a root
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "jupyter"), app, "--no-browser", "--allow-root", "--ip=127.0.0.1",
         f"--port={port}", "--ServerApp.port_retries=0", "--IdentityProvider.token=", "--ServerApp.password=",
         f"--ServerApp.root_dir={root}", *extra,
         "--ServerApp.disable_check_xsrf=True"],  # the tests' own REST calls (DELETE a kernel) carry no cookie
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"{url}/api/status", timeout=2).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"jupyter {app} did not start; see {ARTIFACTS / f'jupyter{app}.log'}") from None
                time.sleep(0.5)
        yield url, root, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def lab() -> Iterator[tuple[str, Path, int]]:
    with serve("lab") as served:
        yield served


def test_the_contents_api_serves_every_example_source_as_a_notebook(lab) -> None:
    url, root, _ = lab
    for path in sorted(root.glob("[0-9][0-9]_*.py")):
        model = _get(f"{url}/api/contents/{path.name}?type=notebook&content=1")
        assert model["type"] == "notebook", (path.name, model["type"])
        cells = model["content"]["cells"]
        assert cells[0]["cell_type"] == "markdown" and cells[0]["source"].startswith("# "), path.name
        assert any(c["cell_type"] == "code" for c in cells), path.name
        assert all(not c["source"].startswith("# %%") for c in cells), path.name
    quickstart = _get(f"{url}/api/contents/{NOTEBOOK}?type=notebook&content=1")["content"]["cells"]
    assert any(c["source"].startswith("%forge_spawn quickstart") for c in quickstart)  # magics are not commented
    params = [c for c in quickstart if "parameters" in c["metadata"].get("tags", [])]
    assert len(params) == 1 and params[0]["source"].startswith("STEPS = ")


def test_jupytext_is_the_default_viewer_of_python_files(lab) -> None:
    url, _, _ = lab
    settings = _get(f"{url}/lab/api/settings/@jupyterlab/docmanager-extension:plugin")
    # JupyterLab folds overrides.d/ into the schema's defaults; the user's own settings come on top
    viewers = {**settings["schema"]["properties"]["defaultViewers"]["default"],
               **settings["settings"].get("defaultViewers", {})}
    assert viewers.get("python") == "Jupytext Notebook", (
        f"defaultViewers={viewers}: JupyterLab would open .py notebooks as text. Is "
        "jupyter-config/lab/settings/overrides.d/forge-nb.json in <venv>/share/jupyter/lab/settings/overrides.d/? "
        "(scripts/setup.sh copies it)")
    assert "markdown" not in viewers  # only Python files: READMEs still open as Markdown


def _dismiss_dialogs(page: Any) -> None:
    """The kernel / news dialogs of a first start (the last button: "Select" the default kernel, "OK")."""
    for _ in range(3):
        dialog = page.locator(".jp-Dialog")
        if not dialog.count():
            return
        dialog.locator("button").last.click()
        time.sleep(0.3)


def _open_by_double_click(page: Any, url: str, *, dismiss: bool = True) -> None:
    page.goto(f"{url}/lab")
    item = page.locator(".jp-DirListing-item", has_text=NOTEBOOK)
    item.wait_for(timeout=120_000)
    item.dblclick()
    page.wait_for_selector(".jp-NotebookPanel .jp-MarkdownCell", timeout=120_000)
    time.sleep(1)
    if dismiss:
        _dismiss_dialogs(page)


needs_chromium = pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                    reason=f"no chromium at {CHROMIUM} (apt-get install chromium)")


@needs_chromium
def test_a_double_click_in_the_file_browser_opens_the_quickstart_as_a_notebook(lab) -> None:
    pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    from playwright.sync_api import sync_playwright

    url, root, _ = lab
    before = (root / NOTEBOOK).read_text()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            _open_by_double_click(page, url, dismiss=False)
            time.sleep(2)  # a kernel dialog comes up once the notebook's model is read
            page.screenshot(path=str(ARTIFACTS / "quickstart-opened.png"))
            # the source's jupytext header names the kernel: no "Select Kernel" dialog (issue 36)
            assert page.locator(".jp-Dialog", has_text="Select Kernel").count() == 0
            _dismiss_dialogs(page)
            tab = page.locator("#jp-main-dock-panel .lm-TabBar-tab.lm-mod-current .lm-TabBar-tabLabel").inner_text()
            assert tab == NOTEBOOK
            assert page.locator(".jp-FileEditor").count() == 0  # not the text editor
            code = page.locator(".jp-NotebookPanel .jp-CodeCell").count()
            assert code >= 5, f"{code} code cells"
            assert "forge_nb quickstart" in page.locator(".jp-NotebookPanel .jp-MarkdownCell").first.inner_text()
        finally:
            browser.close()
    assert (root / NOTEBOOK).read_text() == before  # opening does not rewrite the source


SIDE = "#jp-main-dock-panel .jupyterlab-sidecar"  # the sidecar's tab, split beside the notebook
STATUS = f"{SIDE} .forge-run-status"  # the dashboard's first line: run name, state badge, step, version
POINTS = "el => el.forgeCurves ? el.forgeCurves.points('reward/mean') : -1"  # drawn by the dashboard's curves
CELLS = """() => [...document.querySelectorAll('.jp-NotebookPanel .jp-CodeCell')].map(c => [
  c.querySelector('.cm-content').textContent, c.querySelector('.jp-InputPrompt').textContent.trim()])"""
# (source, prompt) of each code cell; textContent, as cells scrolled out of view have no innerText
ERRORS = ".jp-NotebookPanel .jp-OutputArea-output[data-mime-type='application/vnd.jupyter.error']"
STDERR = ".jp-NotebookPanel .jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']"
STEPS = 150  # the budget a newcomer types; the "at most 60 output lines" is for a 150-step run
MAX_LINES = 60
CUT = """root => {
  // what of the dashboard a user cannot read whole at this width: text wider than its box (an ellipsis,
  // a clipped title) or a box reaching past the panel's edges
  const panel = root.getBoundingClientRect(), cut = [];
  const look = (el, what) => {
    const r = el.getBoundingClientRect();
    if (!r.width) return;  // not shown (a folded section)
    const name = `${what} '${(el.value || el.textContent || el.placeholder || '').trim().slice(0, 30)}'`;
    if (r.left < panel.left - 1 || r.right > panel.right + 1) cut.push(`${name} reaches past the panel`);
    else if (el.scrollWidth > el.clientWidth + 1) cut.push(`${name} is cut (${el.scrollWidth} > ${el.clientWidth} px)`);
  };
  for (const [sel, what] of [['button', 'button'], ['input', 'input'], ['.widget-label', 'label'],
                             ['th', 'column'], ['td', 'cell'], ['.forge-curves-title', 'panel title']])
    root.querySelectorAll(`.forge-dashboard ${sel}`).forEach(el => look(el, what));
  return cut;
}"""
OUTPUT_LINES = """async () => {
  // [source, lines] per code cell: every non-empty line of its outputs as the page shows them (streams,
  // tables row by row, widgets); each cell is scrolled into view first, as off-screen ones have no innerText
  const counted = [];
  for (const cell of document.querySelectorAll('.jp-NotebookPanel .jp-CodeCell')) {
    cell.scrollIntoView();
    await new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)));
    const text = [...cell.querySelectorAll('.jp-OutputArea-output')].map(o => o.innerText).join('\\n');
    counted.push([cell.querySelector('.cm-content').textContent.slice(0, 40),
                  text.split('\\n').filter(line => line.trim()).length]);
  }
  return counted;
}"""


def _resize_dashboard(page: Any, by: int) -> None:
    """Drag the handle between the notebook and the dashboard ``by`` px (negative: to the left), as a user does."""
    panel = page.locator(SIDE).bounding_box()
    handles = [h.bounding_box() for h in page.locator("#jp-main-dock-panel > .lm-DockPanel-handle").all()]
    handle = min((h for h in handles if h and h["width"] and h["height"] > 100),
                 key=lambda h: abs(h["x"] - panel["x"]))
    x, y = handle["x"] + handle["width"] / 2, handle["y"] + handle["height"] / 2
    page.mouse.move(x, y)
    page.mouse.down()
    page.mouse.move(x + by, y, steps=10)
    page.mouse.up()


def _in_view(page: Any, selector: str) -> bool:
    box, view = page.locator(selector).bounding_box(), page.viewport_size
    return bool(box) and box["x"] >= 0 and box["y"] >= 0 and box["x"] + box["width"] <= view["width"] + 1 \
        and box["y"] + box["height"] <= view["height"] + 1


def _zoom_every_panel_after_a_resize(page: Any, console: list[str]) -> None:
    """Make the dashboard wider (its panels go from one column to two), then drag across the reward panel:
    every panel shows the steps chosen (within a few seconds: a loaded machine may draw late)."""
    curves = page.locator(f"{SIDE} .forge-curves").first

    def xrange() -> list[list[float]]:  # each panel's [first, last] step shown
        return curves.evaluate("el => el.forgeCurves.xrange()")

    full = xrange()
    width = page.locator(SIDE).bounding_box()["width"]
    _resize_dashboard(page, by=-200)
    assert page.locator(SIDE).bounding_box()["width"] > width + 150, "the handle drag did not resize the dashboard"
    time.sleep(1)  # the resize is drawn in the next frame
    over = page.locator(f"{SIDE} .forge-curves-panel[data-title='reward'] .u-over")
    over.scroll_into_view_if_needed()
    box = over.bounding_box()
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + 0.3 * box["width"], y)
    page.mouse.down()
    page.mouse.move(box["x"] + 0.6 * box["width"], y, steps=8)
    page.mouse.up()
    until_sync(lambda: bool(r := xrange()) and r[0] != full[0] and all(x == r[0] for x in r), timeout=10, interval=0.5)
    zoomed = xrange()
    assert len(zoomed) == len(full) >= 9, (full, zoomed)
    lo, hi = zoomed[0]
    assert full[0][0] < lo < hi < full[0][1], f"the drag did not zoom the reward panel: {full[0]} -> {zoomed[0]}"
    assert all(r == [lo, hi] for r in zoomed), \
        f"not every panel shows the zoomed steps: {zoomed}; the browser console's errors: {console}"
    assert curves.evaluate("el => el.forgeCurves.stats.errors") == [], console


def _run_all(page: Any, url: str, seen: dict[tuple[int, float | None], str], lab_pid: int) -> None:
    """Open, set STEPS, Run All Cells, wait for the last cell; check the dashboard beside the notebook during
    and after, then the cells' output, then a zoom after a resize."""
    console: list[str] = []
    page.on("console", lambda m: console.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: console.append(f"uncaught: {e}\n{e.stack}"))
    _open_by_double_click(page, url)
    # the budget, typed into the parameters cell as a user would
    params = page.locator(".jp-NotebookPanel .jp-CodeCell", has_text="STEPS = ").first
    params.locator(".cm-content").click()
    page.keyboard.press("Control+a")
    page.keyboard.type(f"STEPS = {STEPS}")
    assert params.locator(".cm-content").inner_text().strip() == f"STEPS = {STEPS}"
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
    page.locator(".lm-Menu-item[data-command='runmenu:run-all']").click()  # Run All Cells
    _dismiss_dialogs(page)

    in_view_while_running = False
    looked: tuple[int, bool, bool] | None = None  # (reward points, visible, in view) while %forge_step ran
    cut: list[str] | None = None  # what the dashboard cut at its opening width
    deadline = time.monotonic() + 1200
    while True:
        seen.update({(pid, started(pid)): cmd for pid, cmd in descendants(lab_pid).items()})
        cells = page.evaluate(CELLS)
        prompts = [prompt for _, prompt in cells]
        if all(p[1:-2].strip().isdigit() for p in prompts):  # "[12]:" everywhere: the last cell ran
            break
        assert page.locator(ERRORS).count() == 0, "a cell failed: " + page.locator(ERRORS).first.inner_text()
        assert time.monotonic() < deadline, f"the notebook did not finish; prompts {prompts}"
        # the dashboard's cell has run, a %forge_step cell is running or queued: the dashboard shows beside
        # the notebook at the width it opened with, with the run's first steps on its curves
        dashboard_ran = any(source.startswith("%forge_dashboard") and p[1:-2].isdigit() for source, p in cells)
        stepping = any("%forge_step" in source and p == "[*]:" for source, p in cells)
        if not in_view_while_running and dashboard_ran and stepping:
            curves = page.locator(f"{SIDE} .forge-curves").first
            looked = (curves.evaluate(POINTS) if curves.count() else -1,
                      page.locator(f"{SIDE} .forge-dashboard").is_visible(), _in_view(page, STATUS))
            in_view_while_running = looked[0] >= 3 and all(looked[1:])
            if in_view_while_running:
                time.sleep(2.5)  # the curves redraw at most every 2 s: the screenshot shows the points
                cut = page.locator(SIDE).evaluate(CUT)
                page.screenshot(path=str(ARTIFACTS / "quickstart-running-side-panel.png"))
        time.sleep(0.1 if dashboard_ran and not in_view_while_running else 0.5)  # the window is short: look often
    page.screenshot(path=str(ARTIFACTS / "quickstart-finished-side-panel.png"))

    assert page.locator(ERRORS).count() == 0, page.locator(ERRORS).first.inner_text()
    assert page.locator(STDERR).count() == 0, "stderr in a cell: " + page.locator(STDERR).first.inner_text()
    assert in_view_while_running, f"the dashboard was not beside the notebook while %forge_step ran: {looked}"
    width = page.locator(SIDE).bounding_box()["width"]
    assert cut == [], f"at its opening width ({width:.0f} px) the dashboard cuts: {cut}"
    # every cell's output, as the page shows it: a few lines each, whatever STEPS is
    lines = page.evaluate(OUTPUT_LINES)
    print("output lines per cell:", lines)
    assert sum(n for _, n in lines) <= MAX_LINES, f"{sum(n for _, n in lines)} output lines: {lines}"
    # after the last cell: still beside the notebook, not in a cell, and showing the run's end
    tab = page.locator("#jp-main-dock-panel .lm-TabBar-tab", has_text="dashboard: quickstart")
    assert tab.count() == 1, "no 'dashboard: quickstart' tab in the main area"
    board = page.locator(f"{SIDE} .forge-dashboard")
    assert board.is_visible() and _in_view(page, STATUS)
    assert page.locator(".jp-NotebookPanel .forge-dashboard").count() == 0
    # the cell's one line says so, as the page saw the panel render (forge_nb.widgets.placement)
    note = page.locator(".jp-NotebookPanel .forge-side-note[data-where='side']")
    assert note.count() == 1 and "is beside the notebook" in note.text_content(), note.all_text_contents()
    assert not page.locator(".jp-NotebookPanel .forge-dashboard-static").first.is_visible()  # the snapshot: hidden
    status = board.locator(".forge-run-status")
    page.wait_for_selector(f"{SIDE} .forge-run-status[data-state='shut down']", timeout=30_000)
    assert status.inner_text().startswith("quickstart"), status.inner_text()
    assert board.locator(".forge-state-badge").is_visible()
    for replica in ("policy[0]", "trainer[0]"):
        assert board.locator(f"tr[data-replica='{replica}']").is_visible(), replica
    assert board.locator(".forge-curves canvas").first.is_visible()
    points = board.locator(".forge-curves").first.evaluate(POINTS)
    assert points >= STEPS + 25, f"{points} reward points for {STEPS} + 25 steps"
    page.locator(SIDE).screenshot(path=str(ARTIFACTS / "quickstart-dashboard-side-panel.png"))
    _zoom_every_panel_after_a_resize(page, console)
    page.locator(SIDE).screenshot(path=str(ARTIFACTS / "quickstart-dashboard-zoomed.png"))
    assert not console, f"errors in the browser console: {console}"


@needs_chromium
@pytest.mark.heavy
@pytest.mark.timeout(1500)
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM (the cpu or gpu extra)")
@pytest.mark.skipif(importlib.util.find_spec("sidecar") is None, reason="needs sidecar (the notebook extra)")
def test_the_quickstart_runs_from_the_file_browser_with_its_dashboard_beside_the_notebook(lab) -> None:
    pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    from playwright.sync_api import sync_playwright

    url, root, lab_pid = lab
    seen: dict[tuple[int, float | None], str] = {}  # (pid, start) -> command: what ran under the lab
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            try:
                _run_all(browser.new_page(viewport={"width": 1400, "height": 900}), url, seen, lab_pid)
            finally:
                browser.close()
    finally:
        for kernel in _get(f"{url}/api/kernels"):  # as File > Shut Down would, also when a check failed
            request = urllib.request.Request(f"{url}/api/kernels/{kernel['id']}", method="DELETE")
            urllib.request.urlopen(request, timeout=60).close()

    # the run directory is the lab's copy's, beside the notebook, not the repository's example_notebooks/
    (run_dir,) = (root / "runs").glob("quickstart-*")
    assert (run_dir / "config.json").exists()
    assert not (ROOT / "example_notebooks" / "runs" / run_dir.name).exists()
    # %forge_shutdown and the kernel's shutdown leave nothing running
    assert any("vllm" in cmd.lower() or "monarch" in cmd.lower() for cmd in seen.values()), seen
    deadline = time.monotonic() + 60
    while (left := {pid: cmd for (pid, start), cmd in seen.items() if start and same_start(started(pid), start)}) \
            and time.monotonic() < deadline:
        time.sleep(1)
    assert not left, f"processes left running: {left}"
