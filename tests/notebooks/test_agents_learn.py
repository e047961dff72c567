"""The agents notebook, executed as written (its own 300 steps): agent code written against the OpenAI client
trains through the run's endpoint. Over the last 25 steps its conversations make at least 0.9 tool calls each
in the median step (the policy writes one call at most; at most 0.5 over the first 10 steps' mean), and its
reward is at least 0.15 and
0.1 above the first 10 steps' (at most 0.15: an untrained policy earns ~0.04; one that calls a tool and answers
a letter earns 0.2). The turn-by-turn view shows tool calls answered, and the trained policy calls a tool
through a plain client.

How far it rises is the recipe's, measured over seeds by ``bench/openai_endpoint.py`` (``agent_final_reward``).
Without the recipe's KL term toward the untrained policy, 4 of 14 runs of this notebook (sessions 42-43) ended
where every sample of a group earns the same and nothing more is learned: at 0.2 (another letter's tool: passes)
or at 0.0-0.06 with the tool calls lost (fails; about one suite run in ten). With it (session 44), 9 of 10 ended
at 0.74-0.97 and one locked at 0.2; none lost its tool calls (``forge_nb/recipes/agents.py``). The bars stay low:
this test is about the path, not the recipe.

The tool calls are judged by the median step, not the mean: the recipe still has falls, single steps whose
calls drop and come back at the next (0-3 a run after step 150, session 44). A fresh-clone CI run (session 46)
had four in its last 25 steps (0.53, 0.31, 0.06, 0.16 among 0.97-1.0): a mean of 0.876 for a policy that
called its tool in 0.97-0.99 of its conversations in every block of 25 steps before. Calls lost for good
(0.0-0.06 a step) fail either way."""

from __future__ import annotations

import importlib.util
import json
import re
import statistics
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
    calls = [r["tools/calls"] for r in rows if "reward/mean" in r]
    assert len(rewards) >= 300
    first, last = sum(rewards[:10]) / 10, sum(rewards[-25:]) / 25
    assert first <= 0.15 and last >= 0.15 and last - first >= 0.1, (first, last)
    assert sum(calls[:10]) / 10 <= 0.5 and statistics.median(calls[-25:]) >= 0.9, (calls[:10], calls[-25:])
    html = "".join("".join(o.get("data", {}).get("text/html", "")) for c in nb["cells"] if c["cell_type"] == "code"
                   for o in c.get("outputs", []))
    assert html.count("<th>observation</th>") == 3  # 3 episodes shown turn by turn
    assert re.search(r"<td>[a-z] ok</td>", html), html[:2000]  # a tool the policy called answered
    printed = [line.split("] ", 1)[1] for line in lines]  # without the cell-number prefix
    assert any(line.startswith("run 'agent' serves the OpenAI API at http://127.0.0.1:") for line in printed)
    assert any(re.fullmatch(r"tool_calls \[\('[a-z]', '\{\"input\": \"\"\}'\)\] forge_nb-v300", line)
               for line in printed), printed  # the trained policy (version 300) calls a tool through a plain client
