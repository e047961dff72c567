"""The example notebooks open as notebooks in a real JupyterLab: jupytext's contents manager and viewer.

A JupyterLab server (127.0.0.1, free port, no token) serves a copy of example_notebooks/. Its contents API
must hand out ``01_quickstart.py`` as a notebook with the source's cells, its settings must name jupytext's
"Jupytext Notebook" the default viewer of Python files (jupyter-config/, installed by scripts/setup.sh),
and, where chromium is installed, a double-click in the file browser must open the notebook editor
(not the text editor). Opening must leave the source file as it was. Screenshots go to
test-artifacts/notebooks/.
"""

from __future__ import annotations

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

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "notebooks"
CHROMIUM = "/usr/bin/chromium"
NOTEBOOK = "01_quickstart.py"

pytestmark = pytest.mark.timeout(300)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def lab() -> Iterator[tuple[str, Path]]:
    """(url, root): a JupyterLab serving a copy of example_notebooks/ (the user's settings left aside)."""
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
    log = open(ARTIFACTS / "jupyterlab.log", "w")  # noqa: SIM115 - closed below
    # the README's command (`jupyter lab --no-browser --allow-root`), pinned to a port and a root
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "jupyter"), "lab", "--no-browser", "--allow-root", "--ip=127.0.0.1",
         f"--port={port}", "--ServerApp.port_retries=0", "--IdentityProvider.token=", "--ServerApp.password=",
         f"--ServerApp.root_dir={root}", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
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
                    raise RuntimeError(f"JupyterLab did not start; see {ARTIFACTS / 'jupyterlab.log'}") from None
                time.sleep(0.5)
        yield url, root
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


def test_the_contents_api_serves_every_example_source_as_a_notebook(lab) -> None:
    url, root = lab
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
    url, _ = lab
    settings = _get(f"{url}/lab/api/settings/@jupyterlab/docmanager-extension:plugin")
    # JupyterLab folds overrides.d/ into the schema's defaults; the user's own settings come on top
    viewers = {**settings["schema"]["properties"]["defaultViewers"]["default"],
               **settings["settings"].get("defaultViewers", {})}
    assert viewers.get("python") == "Jupytext Notebook", (
        f"defaultViewers={viewers}: JupyterLab would open .py notebooks as text. Is "
        "jupyter-config/lab/settings/overrides.d/forge-nb.json in <venv>/share/jupyter/lab/settings/overrides.d/? "
        "(scripts/setup.sh copies it)")
    assert "markdown" not in viewers  # only Python files: READMEs still open as Markdown


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"no chromium at {CHROMIUM} (apt-get install chromium)")
def test_a_double_click_in_the_file_browser_opens_the_quickstart_as_a_notebook(lab) -> None:
    pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    from playwright.sync_api import sync_playwright

    url, root = lab
    before = (root / NOTEBOOK).read_text()
    flags = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", "--no-first-run", "--disable-quic"]
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=flags)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(f"{url}/lab")
            item = page.locator(".jp-DirListing-item", has_text=NOTEBOOK)
            item.wait_for(timeout=120_000)
            item.dblclick()
            page.wait_for_selector(".jp-NotebookPanel .jp-MarkdownCell", timeout=120_000)
            time.sleep(1)
            for _ in range(3):  # the kernel / news dialogs of a first start
                dialog = page.locator(".jp-Dialog")
                if not dialog.count():
                    break
                dialog.locator("button").last.click()
                time.sleep(0.3)
            page.screenshot(path=str(ARTIFACTS / "quickstart-opened.png"))
            tab = page.locator("#jp-main-dock-panel .lm-TabBar-tab.lm-mod-current .lm-TabBar-tabLabel").inner_text()
            assert tab == NOTEBOOK
            assert page.locator(".jp-FileEditor").count() == 0  # not the text editor
            code = page.locator(".jp-NotebookPanel .jp-CodeCell").count()
            assert code >= 5, f"{code} code cells"
            assert "forge_nb quickstart" in page.locator(".jp-NotebookPanel .jp-MarkdownCell").first.inner_text()
        finally:
            browser.close()
    assert (root / NOTEBOOK).read_text() == before  # opening does not rewrite the source
