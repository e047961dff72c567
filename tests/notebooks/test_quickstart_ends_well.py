"""The quickstart notebook, executed as written (its own 250 steps), ends well and keeps its cells quiet.

Issue 20's targets: the mean reward of the last 50 steps is at least 0.9, no letter of the toy task is left
unsolved, and all its cells together hold at most 40 lines of stream output (vLLM, monarch and torch write
to the run directory's logs, not to the cells). The executed notebook's HTML, opened in chromium with every
request off the machine refused, shows the dashboard's curves and the run's final step (its snapshot).
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from tests.notebooks.test_notebooks import ROOT, _runner, assert_left_in_outputs

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(1200),
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM (the cpu or gpu extra)")]

MAX_STREAM_LINES = 40


def stream_lines(nb: dict) -> list[str]:
    """Every line the code cells wrote to stdout or stderr, prefixed by the cell's number."""
    lines = []
    for i, cell in enumerate(nb["cells"]):
        for out in cell.get("outputs", []) if cell["cell_type"] == "code" else []:
            if out.get("output_type") == "stream":
                text = "".join(out["text"]) if isinstance(out["text"], list) else out["text"]
                lines += [f"[{i}] {line}" for line in text.splitlines()]
    return lines


def run_as_written(name: str, tmp_path: Path) -> tuple[dict, dict, list[str]]:
    """Execute ``example_notebooks/<name>`` with its own parameters; assert that no cell raised, that the
    cells stayed quiet and that what it wrote is under ``tmp_path`` (as the short runs of the others are
    checked); return the runner's result, the executed notebook and the lines the cells wrote."""
    before = set((ROOT / "example_notebooks").iterdir())
    result = _runner().execute(ROOT / "example_notebooks" / name, tmp_path / "outputs", steps=None, timeout=900)
    assert_left_in_outputs(result, tmp_path, before)
    nb = json.loads(Path(result["notebook"]).read_text())
    errors = [o for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors, errors[0]
    lines = stream_lines(nb)
    assert len(lines) <= MAX_STREAM_LINES, "\n".join(lines)
    return result, nb, lines


def test_the_quickstart_notebook_ends_well_with_quiet_cells(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    result, nb, lines = run_as_written("01_quickstart.py", tmp_path)
    rows = [json.loads(line) for line in (Path(result["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    steps = len([r for r in rows if "reward/mean" in r])
    assert steps >= 250
    # the processes' logs hold what is worth reading, not a line for every step (vLLM logged each cache reset)
    for log in (Path(result["run_dir"]) / "logs").glob("*.log"):
        assert len(log.read_text().splitlines()) < steps // 2, log.name
    assert result["final_reward"] >= 0.9, result["final_reward"]  # the mean of the last 50 steps
    report = "\n".join(lines)
    assert "letters not learned yet: none" in report, report
    assert_draws_offline(Path(result["html"]), steps)


def assert_draws_offline(page_path: Path, steps: int) -> None:
    """The executed notebook's HTML, with the network off: the last dashboard snapshot shows the run shut down
    at ``steps``, and its reward chart draws a point per step."""
    from tests.notebooks.test_open_in_jupyterlab import CHROMIUM, FLAGS

    if not os.path.exists(CHROMIUM) or importlib.util.find_spec("playwright") is None:
        return  # the page's HTML is still checked by the rest of the test
    from playwright.sync_api import sync_playwright

    refused: list[str] = []

    def local_only(route) -> None:
        if route.request.url.startswith("file:"):
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort("internetdisconnected")

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.route("**/*", local_only)
            page.goto(page_path.as_uri(), wait_until="load")
            snapshot = page.locator(".forge-dashboard-static").last
            snapshot.scroll_into_view_if_needed()
            status = snapshot.locator(".forge-run-status")
            assert status.is_visible() and status.get_attribute("data-state") == "shut down", status.inner_text()
            assert f"step {steps}" in status.inner_text(), status.inner_text()
            reward = snapshot.locator("svg[data-title='reward'] polyline[data-key='reward/mean']")
            drawn = reward.evaluate("el => el.points.numberOfItems")  # the points the browser drew
            assert drawn == int(reward.get_attribute("data-points")) >= steps, drawn
            assert reward.bounding_box()["width"] > 100
            snapshot.screenshot(path=str(ROOT / "test-artifacts" / "notebooks" / "quickstart-html-offline.png"))
        finally:
            browser.close()
    assert refused, "the page asked for nothing off the machine: was the network check a check?"
