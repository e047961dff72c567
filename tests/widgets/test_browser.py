"""The dashboards in a real browser: JupyterLab running the CPU quickstart, and the served panel app.

One JupyterLab (127.0.0.1, free port, no token, a temp root dir) opens a notebook that spawns the
quickstart run, starts it, displays ``dashboard(run)`` and serves ``serve(run)``; Playwright drives
Debian's chromium. The first two tests share that session (spawning the run takes minutes on 2 cores).
The curves' controls (uPlot: smoothing, legend click, zoom) are checked on known values in a real kernel's
MetricsStore, in a JupyterLab of their own (no run, seconds), and under panel's host served alone.
Screenshots go to test-artifacts/widgets/. Skipped cleanly without /usr/bin/chromium or playwright.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from forge_nb.widgets._shared.series import PANELS

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run", "--disable-quic"]
ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "widgets"

pytestmark = [
    pytest.mark.heavy,
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"no chromium at {CHROMIUM} (apt-get install chromium)"),
]

CELLS = [
    "from forge_nb.system.runtime import lifecycle\nlifecycle.ensure_started()\nimport forge_nb\n"
    "from forge_nb.widgets import dashboard, serve\n"
    "run = await forge_nb.spawn(forge_nb.quickstart(run_dir='run'), progress=False)\n"  # beside the notebook
    "run.start()",
    "dashboard(run)",
    "server = serve(run)\nprint('PANEL-URL', server.url)",
]
REWARD_POINTS = """sel => {
  const view = document.querySelector(sel);
  return view && view.forgeCurves ? view.forgeCurves.points('reward/mean') : -1;
}"""
CURVES = ".forge-dashboard .forge-curves"
EVAL_PANEL = PANELS[-1].title  # the evaluations' panel
KERNEL_POINTS = "from forge_nb.widgets import dashboard\nprint(len(dashboard(run).curves.trace('reward/mean').x))"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_pw: list[Any] = []


def _playwright() -> Any:
    """The module's one Playwright: a second sync_playwright() while one runs refuses to start ("Sync API
    inside the asyncio loop"), and the module-scoped ``lab`` fixture keeps its own alive across tests."""
    if not _pw:
        from playwright.sync_api import sync_playwright

        _pw.append(sync_playwright().start())
    return _pw[0]


@pytest.fixture(scope="module", autouse=True)
def _stop_playwright() -> Iterator[None]:
    yield
    while _pw:
        _pw.pop().stop()


class Lab:
    """JupyterLab + chromium + a side channel to the notebook's kernel (jupyter_client)."""

    def __init__(self, tmp: Path, cells: list[str] = CELLS, shutdown: str = "server.stop()\nawait run.shutdown()"):
        import nbformat

        self.tmp = tmp
        root = tmp / "root"
        root.mkdir()
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nbformat.write(nb, root / "dashboard.ipynb")
        # no "receive official Jupyter news?" toast over the screenshots
        news = tmp / "settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
        news.parent.mkdir(parents=True)
        news.write_text('{"fetchNews": "false"}')
        self.port = _free_port()
        env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"), "JUPYTER_CONFIG_DIR": str(tmp / "config"),
               "JUPYTERLAB_SETTINGS_DIR": str(tmp / "settings"), "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "ws"),
               "VLLM_LOGGING_LEVEL": "WARNING", "PYTHONPATH": str(ROOT)}
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        self.log = open(ARTIFACTS / "jupyterlab.log", "w")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
             f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0", "--IdentityProvider.token=",
             "--ServerApp.password=", "--ServerApp.allow_root=True", f"--ServerApp.root_dir={root}",
             "--LabApp.expose_app_in_browser=True",
             "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
            env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"{self.url}/api/status", timeout=2).close()
                break
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"JupyterLab did not start; see {ARTIFACTS / 'jupyterlab.log'}") from None
                time.sleep(0.5)
        self.pw = _playwright()
        self.browser = self.pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        self.page = self.browser.new_page(viewport={"width": 1400, "height": 1000})
        self.kc: Any = None
        self.shutdown = shutdown  # run in the kernel by close()

    def open_and_run_all(self) -> None:
        """Open the notebook in the page and run all its cells (returns once they are queued)."""
        page = self.page
        page.goto(f"{self.url}/lab/tree/dashboard.ipynb")
        page.wait_for_selector(".jp-Notebook", timeout=120_000)
        page.wait_for_function("window.jupyterapp && window.jupyterapp.serviceManager", timeout=60_000)
        time.sleep(2)
        self.dismiss_dialogs()
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120_000)
        # Not awaited: the command's promise settles only once every cell has run (never, with a kernel that
        # died); the tests wait for what the cells draw instead, with their own timeouts.
        page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")

    def dismiss_dialogs(self) -> None:
        for _ in range(3):
            dialog = self.page.locator(".jp-Dialog")
            if not dialog.count():
                return
            dialog.locator("button").last.click()
            time.sleep(0.3)

    def kernel(self) -> Any:
        """A second client of the notebook's kernel, for reading the run's state and shutting it down."""
        if self.kc is None:
            from jupyter_client import BlockingKernelClient

            (kernel,) = json.loads(urllib.request.urlopen(f"{self.url}/api/kernels", timeout=10).read())
            self.kc = BlockingKernelClient(connection_file=str(self.tmp / "runtime" / f"kernel-{kernel['id']}.json"))
            self.kc.load_connection_file()
            self.kc.start_channels()
        return self.kc

    def kernel_eval(self, code: str, timeout: float = 60) -> str:
        out: list[str] = []

        def hook(msg: dict) -> None:
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])

        reply = self.kernel().execute_interactive(code, timeout=timeout, output_hook=hook)
        assert reply["content"]["status"] == "ok", reply["content"]
        return "".join(out)

    def shot(self, name: str, page: Any = None, selector: str | None = None) -> None:
        """A screenshot for test-artifacts/ (the element, else the viewport); failing to take one only warns."""
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page = page or self.page
        path = str(ARTIFACTS / f"{name}.png")
        try:
            if selector is not None:
                page.locator(selector).first.screenshot(path=path, timeout=90_000, animations="disabled")
            else:
                page.screenshot(path=path, timeout=90_000, animations="disabled")
        except Exception as e:  # a loaded 2-core machine can be slow to paint: the checks matter, not this
            warnings.warn(f"screenshot {name} not taken: {e}", stacklevel=2)

    def close(self) -> None:
        try:
            if self.kc is not None or self.proc.poll() is None:
                self.kernel_eval(self.shutdown, timeout=180)
        finally:
            if self.kc is not None:
                self.kc.stop_channels()
            try:
                self.browser.close()
            finally:  # a browser or driver that died must not leave the Jupyter server running
                self.proc.terminate()
                try:
                    self.proc.wait(30)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                self.log.close()


# The tests that open their own small notebook run first, before the module's ``lab`` fixture starts the
# quickstart (pytest runs a module's tests in file order): a training run beside them would only load
# the 2 cores they share.

# A gradient norm clipped to 1.0, as float32 rounds it: uPlot ranged such a panel to [1, 1] and its tick loop
# threw "Invalid array length" (leeoniya/uPlot#1084), which stopped the panels after it from drawing.
GRAD_NORM = (0.9999997615814209, 1.000000238418579)
CONTROL_CELLS = [
    "import math\nfrom forge_nb.metrics import MetricsStore\nfrom forge_nb.widgets.curves import Curves\n"
    "store, curves = MetricsStore(), Curves()\nstore.subscribe(curves.observe)\n"
    f"GRAD_NORM = {GRAD_NORM!r}\n"
    "for s in range(1, 61):\n"
    "    r = 0.5 + 0.4 * math.sin(s) \n"
    "    store.record(s, {'reward/mean': r, 'reward/min': r - 0.2, 'reward/max': r + 0.2,\n"
    "                     'reward/PatternReward': r, 'loss': 1.0 / s, 'entropy': 2.0 - 0.01 * s,\n"
    "                     'grad_norm': GRAD_NORM[s % 2]})\n"
    "store.event('set', step=30, changes={'lr': 3e-6})\n"
    "curves.flush()\ncurves.widget",
]
VIEW = ".forge-curves"


def _ema(ys: list[float], weight: float) -> list[float]:
    """TensorBoard's debiased EMA, as the smoothing control draws it."""
    out, last = [], 0.0
    for n, v in enumerate(ys, 1):
        last = last * weight + (1 - weight) * v
        out.append(last / (1 - weight**n))
    return out


def _curves(page: Any, call: str) -> Any:
    return page.evaluate(f"() => document.querySelector('{VIEW}').forgeCurves.{call}")


@pytest.mark.timeout(600)
def test_curves_controls_smoothing_legend_click_and_zoom() -> None:
    """Known values in a real kernel's MetricsStore, drawn by uPlot in JupyterLab: the smoothing slider changes
    the drawn values to the EMA of the recorded ones (and the kernel's trait), a legend click hides a trace,
    dragging zooms every panel to the same steps and a double-click shows all steps again."""
    pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    tmp = Path(tempfile.mkdtemp(prefix="forge-nb-lab-"))
    lab = Lab(tmp, CONTROL_CELLS, shutdown="curves.close()")
    errors: list[str] = []
    lab.page.on("pageerror", lambda e: errors.append(f"{e}\n{e.stack}"))
    try:
        lab.open_and_run_all()
        page = lab.page
        page.wait_for_function(f"() => {{ const v = document.querySelector('{VIEW}');"
                               " return v && v.forgeCurves && v.forgeCurves.points('reward/mean') === 60; }",
                               timeout=180_000)
        lab.dismiss_dialogs()
        page.locator(VIEW).scroll_into_view_if_needed()
        raw = [0.5 + 0.4 * math.sin(s) for s in range(1, 61)]
        page.wait_for_function(f"() => document.querySelector('{VIEW}').forgeCurves.drawn('reward/mean').y.length"
                               " === 60", timeout=30_000)
        drawn = _curves(page, "drawn('reward/mean')")
        assert drawn["x"] == list(range(1, 61))
        assert drawn["y"] == pytest.approx(_ema(raw, 0.6))  # smoothed by default, as TensorBoard does
        assert _curves(page, "drawn('loss')")["y"] == pytest.approx(_ema([1.0 / s for s in range(1, 61)], 0.6))
        grad_norm = _curves(page, "drawn('grad_norm')")["y"]  # flat up to float32 rounding, and drawn
        assert grad_norm == pytest.approx(_ema([GRAD_NORM[s % 2] for s in range(1, 61)], 0.6), rel=1e-12)
        assert _curves(page, "stats.errors") == []
        titles = page.locator(f"{VIEW} .forge-curves-panel").evaluate_all("els => els.map(e => e.dataset.title)")
        assert titles[:3] == ["reward", "reward per function", "KL"]
        lab.shot("curves-smoothed", selector=VIEW)

        slider = page.locator(f"{VIEW} input.forge-smoothing")
        slider.fill("0")
        page.wait_for_function(f"() => document.querySelector('{VIEW}').forgeCurves.drawn('reward/mean').y[1]"
                               f" === {raw[1]!r}", timeout=10_000)
        assert _curves(page, "drawn('reward/mean')")["y"] == pytest.approx(raw)
        slider.fill("0.9")
        page.wait_for_function(f"() => Math.abs(document.querySelector('{VIEW}').forgeCurves.drawn('reward/mean')"
                               f".y[59] - {_ema(raw, 0.9)[-1]!r}) < 1e-9", timeout=10_000)
        deadline = time.monotonic() + 10
        while lab.kernel_eval("print(curves.widget.smoothing)").strip() != "0.9" and time.monotonic() < deadline:
            time.sleep(0.3)
        assert lab.kernel_eval("print(curves.widget.smoothing)").strip() == "0.9"  # the slider is a synced trait

        reward = f"{VIEW} .forge-curves-panel[data-title='reward']"
        legend = page.locator(f"{reward} .u-legend .u-series:not(.forge-nolegend)", has_text="reward mean")
        assert _curves(page, "hidden('reward/mean')") is False
        legend.locator("th").click()
        assert _curves(page, "hidden('reward/mean')") is True
        lab.shot("curves-reward-mean-hidden", selector=VIEW)
        legend.locator("th").click()
        assert _curves(page, "hidden('reward/mean')") is False

        full = _curves(page, "xrange()")
        assert all(r == pytest.approx([1, 60]) for r in full), full
        over = page.locator(f"{VIEW} .forge-curves-panel[data-title='reward'] .u-over").bounding_box()
        y = over["y"] + over["height"] / 2
        page.mouse.move(over["x"] + over["width"] * 0.25, y)
        page.mouse.down()
        page.mouse.move(over["x"] + over["width"] * 0.5, y, steps=8)
        page.mouse.up()
        page.wait_for_function(f"() => document.querySelector('{VIEW}').forgeCurves.xrange()[0][1] < 50",
                               timeout=10_000)
        zoomed = _curves(page, "xrange()")
        lo, hi = zoomed[0]
        assert 10 < lo < hi < 35, zoomed  # about the second quarter of steps 1..60
        assert all(r == pytest.approx([lo, hi]) for r in zoomed), zoomed  # every panel shows the same steps
        lab.shot("curves-zoomed", selector=VIEW)
        page.mouse.dblclick(over["x"] + over["width"] / 2, y)
        page.wait_for_function(f"() => document.querySelector('{VIEW}').forgeCurves.xrange()[0][1] === 60",
                               timeout=10_000)
        assert all(r == pytest.approx([1, 60]) for r in _curves(page, "xrange()"))
        assert _curves(page, "stats.errors") == []
        assert not errors, errors
    finally:
        lab.close()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.timeout(300)
def test_panel_host_draws_uplot_in_its_shadow_root_and_the_slider_reaches_the_kernel() -> None:
    """curves.js under panel's JSComponent (the panel app's host): served by panel on 127.0.0.1, the curves
    get their history through one sync, uPlot's styles reach the shadow root, and the slider sets the param."""
    pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    import panel as pn

    from forge_nb.metrics import MetricsStore
    from forge_nb.widgets.curves import Curves, panel_curves_view

    store, views = MetricsStore(), []
    for s in range(1, 31):
        store.record(s, {"reward/mean": 0.02 * s, "loss": 1.0 / s})

    def app() -> Any:  # a session's curves, fed from the store's history as the panel app does
        curves = Curves(view=panel_curves_view()(height=700, sizing_mode="stretch_width"))
        for row in store.rows:
            curves.observe("step", row)
        views.append(curves)
        return curves.widget

    port = _free_port()
    server = pn.serve(app, port=port, address="127.0.0.1", show=False, threaded=True)
    browser = _playwright().chromium.launch(executable_path=CHROMIUM, args=FLAGS)
    try:
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        deadline = time.monotonic() + 60
        while True:
            try:
                page.goto(f"http://127.0.0.1:{port}/")
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        view = page.locator(".forge-curves").first  # pierces the shadow root
        view.wait_for(timeout=60_000)
        drawn = "el => el.forgeCurves && el.forgeCurves.drawn('loss') ? el.forgeCurves.drawn('loss').y.length : -1"
        deadline = time.monotonic() + 30
        while view.evaluate(drawn) != 30 and time.monotonic() < deadline:
            time.sleep(0.3)
        assert view.evaluate(drawn) == 30
        assert view.evaluate("el => el.forgeCurves.stats.syncs") == 1
        # uPlot's stylesheet applies inside the shadow root: its legend is laid out inline
        assert view.locator(".u-legend").first.evaluate("e => getComputedStyle(e).textAlign") == "left"
        view.locator("input.forge-smoothing").fill("0")
        deadline = time.monotonic() + 10
        while views[-1].widget.smoothing != 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert views[-1].widget.smoothing == 0
        assert view.evaluate("el => el.forgeCurves.drawn('loss').y") == pytest.approx([1.0 / s for s in range(1, 31)])
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        view.screenshot(path=str(ARTIFACTS / "panel-curves.png"))
        assert not errors, errors
    finally:
        browser.close()
        server.stop()


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    # Not tmp_path: pytest sessions running beside this one prune the shared base temp dir.
    tmp = Path(tempfile.mkdtemp(prefix="forge-nb-lab-"))
    session = Lab(tmp)
    try:
        session.open_and_run_all()
        yield session
    finally:
        session.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _points(page: Any, selector: str) -> int:
    return page.evaluate(REWARD_POINTS, selector)


def _wait_growth(lab: Lab, selector: str, timeout: float = 180) -> tuple[int, int]:
    """Points of the reward curve before and after it grew (a first point, then one more)."""
    first = _points(lab.page, selector)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(1)
        now = _points(lab.page, selector)
        if first > 0 and now > first:
            return first, now
        first = first if first > 0 else now
    run = lab.kernel_eval("print(run.state, run.current_step, run.error, len(run.metrics.rows))")
    raise AssertionError(f"the reward curve did not grow in {timeout}s (points: {first}; run: {run})")


@pytest.mark.timeout(1500)
def test_jupyterlab_dashboard_renders_lists_replicas_grows_and_pauses(lab: Lab) -> None:
    page = lab.page
    try:
        page.wait_for_selector(f"{CURVES} canvas", timeout=900_000)  # spawn: minutes
    except Exception:
        lab.shot("lab-no-dashboard")
        raise
    lab.dismiss_dialogs()
    for replica in ("policy[0]", "trainer[0]"):  # the generator may still start: the trainer samples meanwhile
        page.wait_for_selector(f".forge-dashboard tr[data-replica='{replica}'][data-state='healthy']",
                               timeout=180_000)
    first, later = _wait_growth(lab, CURVES)
    lab.shot("lab-dashboard-running", selector=".forge-dashboard")

    page.locator(".forge-dashboard button.forge-pause").click()
    page.wait_for_selector(".forge-dashboard .forge-run-status[data-state='paused']", timeout=60_000)
    assert lab.kernel_eval("print(run.state)").strip() == "paused"  # the real run paused, not only the label
    time.sleep(3)  # the step in flight when pausing may still land
    settled = _points(page, CURVES)
    time.sleep(4)
    assert _points(page, CURVES) == settled, "the curve grew while paused"
    assert settled == int(lab.kernel_eval(KERNEL_POINTS)), "the page lost or added points"
    reward_value = page.locator(f"{CURVES} .forge-curves-panel[data-title='reward'] .u-legend "
                                ".u-series:not(.forge-nolegend)", has_text="reward mean").locator(".u-value")
    assert not reward_value.is_visible(), "the legend shows values only while the cursor is over a panel"
    over = page.locator(f"{CURVES} .forge-curves-panel[data-title='loss'] .u-over").bounding_box()
    page.mouse.move(over["x"] + over["width"] / 2, over["y"] + 30)  # the shared cursor: every legend reads its step
    reward_value.wait_for(state="visible", timeout=10_000)
    assert 0.0 <= float(reward_value.inner_text()) <= 1.0
    lab.shot("lab-dashboard-paused", selector=".forge-dashboard")
    assert later > first > 0

    # A reopened page (saved, reloaded) asks the kernel for the history once and shows all of it.
    page.evaluate("window.jupyterapp.commands.execute('docmanager:save')")
    time.sleep(3)
    page.reload()
    page.wait_for_selector(f"{CURVES} canvas", timeout=120_000)
    lab.dismiss_dialogs()
    deadline = time.monotonic() + 60
    while _points(page, CURVES) != settled and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _points(page, CURVES) == settled, "the reopened page did not get the whole history"
    stats = page.evaluate(f"() => document.querySelector('{CURVES}').forgeCurves.stats")
    assert stats["syncs"] == 1 and stats["draws"] >= 1, stats
    # once the history is drawn, only KL, the multi-turn panels and the evaluations' are empty, and say why: the
    # quickstart has no reference model, its episodes are single turns without tools, and nothing evaluated
    empty = f"() => document.querySelector('{CURVES}').forgeCurves.stats.empty.join()"
    try:
        page.wait_for_function(f"{empty} === 'KL,turns per episode,tool-call success,{EVAL_PANEL}'", timeout=10_000)
    except Exception:
        raise AssertionError(f"empty panels: {page.evaluate(empty)}") from None


@pytest.mark.timeout(600)
def test_panel_app_shows_the_grid_and_a_growing_curve(lab: Lab) -> None:
    page = lab.page
    # the cell's source holds 'PANEL-URL' too: wait for its output, the printed address
    page.wait_for_function(r"/PANEL-URL http:\/\/127\.0\.0\.1:\d+/.test(document.body.innerText)", timeout=300_000)
    url = re.search(r"PANEL-URL (http://127\.0\.0\.1:\d+/\S*)", page.inner_text("body")).group(1)
    app = lab.browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        app.goto(url)
        for replica in ("policy[0]", "trainer[0]"):
            app.wait_for_selector(f"tr[data-replica='{replica}']", timeout=120_000)  # pierces shadow roots
        app.get_by_role("button", name="resume").click()  # the lab test paused the run
        app.wait_for_selector(".forge-run-status[data-state='running']", timeout=60_000)
        curves = app.locator(".forge-curves").first  # the notebook's curves, in panel's shadow DOM
        curves.wait_for(timeout=60_000)

        def count() -> int:
            return curves.evaluate("el => el.forgeCurves ? el.forgeCurves.points('reward/mean') : -1")

        # Sampled every 0.5 s: the curve must hold the history from before the page opened (one sync),
        # then grow and never go back.
        seen = [count()]
        deadline = time.monotonic() + 90
        while (len(seen) < 20 or seen[-1] <= max(seen[0], 0)) and time.monotonic() < deadline:
            time.sleep(0.5)
            seen.append(count())
        lab.shot("panel-app", app)
        assert seen[-1] > max(seen[0], 0), f"the panel curve did not grow (points: {seen})"
        assert seen == sorted(seen), f"the panel curve went backwards (points: {seen})"
        stats = curves.evaluate("el => el.forgeCurves.stats")
        assert stats["syncs"] == 1 and stats["messages"] > 1 and stats["draws"] >= 1, stats
    finally:
        app.close()
