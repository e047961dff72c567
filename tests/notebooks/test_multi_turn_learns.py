"""The multi-turn notebook, executed as written (its own 400 steps): the tiny model learns the environment
service's game from scratch (issue 22: mean reward from at most 0.2 to at least 0.8), the turn-by-turn view
shows each turn, and the sandboxed coder answers a tool call."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.notebooks.test_notebooks import ROOT
from tests.notebooks.test_quickstart_ends_well import run_as_written

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(1200),
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM (the cpu or gpu extra)")]


def test_the_multi_turn_notebook_learns_its_environment(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    result, nb, lines = run_as_written("08_multi_turn.py", tmp_path)
    rows = [json.loads(line) for line in (Path(result["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    rewards = [r["reward/mean"] for r in rows if "reward/mean" in r]
    assert len(rewards) >= 400
    # a step's mean is over 32 trajectories (four groups): the end is judged over 25 steps, 800 trajectories
    first, last = sum(rewards[:10]) / 10, sum(rewards[-25:]) / 25
    assert first <= 0.2 and last >= 0.8, (first, last)
    assert all(r["turns/mean"] == 3 for r in rows if "turns/mean" in r)  # EchoEnv's 3 turns, every episode
    html = "".join("".join(o.get("data", {}).get("text/html", "")) for c in nb["cells"] if c["cell_type"] == "code"
                   for o in c.get("outputs", []))
    assert html.count("<th>observation</th>") == 3 and "<td>3</td>" in html  # 3 episodes, turn 3 of each
    printed = [line.split("] ", 1)[1] for line in lines]  # without the cell-number prefix
    at = printed.index("<tool_response>")  # the coder's answer to the tool call, as the policy would read it
    assert printed[at:at + 3] == ["<tool_response>", "1024", "</tool_response>"], printed
