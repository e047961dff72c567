"""The agents notebook, executed as written (its own 300 steps): agent code written against the OpenAI client
trains through the run's endpoint, and its reward rises: the mean of the first 10 steps at most 0.3, of the last
25 at least 0.6 (trial runs ended at 0.71-0.99, see forge_nb/recipes/agents.py; an untrained policy earns ~0.1,
one that calls the tool and answers any letter ~0.4); the turn-by-turn view shows the tool calls, and the trained
policy calls the tool through a plain client."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.notebooks.test_notebooks import ROOT
from tests.notebooks.test_quickstart_ends_well import run_as_written

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(1200),
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM (the cpu or gpu extra)")]


def test_the_agents_notebook_learns_to_call_its_tool(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    result, nb, lines = run_as_written("09_agents.py", tmp_path)
    rows = [json.loads(line) for line in (Path(result["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    rewards = [r["reward/mean"] for r in rows if "reward/mean" in r]
    assert len(rewards) >= 300
    first, last = sum(rewards[:10]) / 10, sum(rewards[-25:]) / 25
    assert first <= 0.3 and last >= 0.6, (first, last)
    html = "".join("".join(o.get("data", {}).get("text/html", "")) for c in nb["cells"] if c["cell_type"] == "code"
                   for o in c.get("outputs", []))
    assert html.count("<th>observation</th>") == 3 and "k ok" in html  # 3 episodes; the tool k answered
    printed = [line.split("] ", 1)[1] for line in lines]  # without the cell-number prefix
    assert any(line.startswith("run 'agent' serves the OpenAI API at http://127.0.0.1:") for line in printed)
    assert "tool_calls [('k', '{\"input\": \"\"}')] forge_nb-v300" in printed, printed
