"""Seeing multi-turn episodes: their rows, the explorer's and ``%forge_episodes --turns``' turn-by-turn views,
the per-step turn and tool metrics, and the dashboard's panels for them (pure: built from real Trajectories)."""

from __future__ import annotations

import pytest

from forge_nb.controller.episodes import episode_metrics, episode_row, turn_metrics
from forge_nb.magics._display import episodes_table, turns_report
from forge_nb.rl import Completion, Episode
from forge_nb.rl.trajectory import Trajectory
from forge_nb.widgets._shared.series import PANELS, CurveData
from forge_nb.widgets.explorer import render_episodes


def _with_a_tool_call(tool_ok: bool = True) -> Episode:
    t = Trajectory(prompt="a", prompt_ids=[2], max_tokens=12)
    t.act("@py x", [9, 9], [-0.5, -0.5], version=1)
    t.observe("<out>", [7, 7, 7], reward=0.0, done=False, info={"tool": "py", "tool_ok": tool_ok})
    t.act("aa", [2, 2], [-0.1, -0.1], version=1)
    t.observe("", [], reward=1.0, done=True, info={"right": 2})
    return t.to_episode(pad_id=0, request_len=4)


def _single_turn() -> Episode:
    ep = Episode(episode_id="s", pad_id=0, request_len=4, response_len=4, target="a",
                 completion=Completion(text="ab", token_ids=[2, 3], logprobs=[-1.0, -1.0], prompt="a",
                                       prompt_ids=[2], generator_version=1))
    ep.reward = 0.5
    return ep


def test_rows_and_both_views_show_each_turn_with_its_tool() -> None:
    row = episode_row(_with_a_tool_call())
    assert [t["action"] for t in row["turns"]] == ["@py x", "aa"] and row["reward"] == 1.0
    assert "turns" not in episode_row(_single_turn())
    page = render_episodes([row, episode_row(_single_turn())])
    assert page.count("class='forge-turn'") == 2
    assert "tool py ok" in page and "&lt;out&gt;" in page and "env: " in page and "r=1" in page
    assert "tool py failed" in render_episodes([episode_row(_with_a_tool_call(tool_ok=False))])
    report = turns_report([row, episode_row(_single_turn())])
    text = repr(report)
    assert "episode " in text and "(single turn: ab)" in text
    (table,) = [p for p in report.parts if not isinstance(p, str)]
    assert [(r["turn"], r["action"], r["tool"], r["reward"]) for r in table.rows] == [
        (1, "@py x", "py ok", 0.0), (2, "aa", None, 1.0)]
    listed = episodes_table([row, episode_row(_single_turn())])
    assert "turns" in listed.columns and [r["turns"] for r in listed.rows] == [2, None]
    assert "turns" not in episodes_table([episode_row(_single_turn())]).columns


def test_step_metrics_count_turns_tool_success_and_the_policy_s_tokens_only() -> None:
    batch = [_with_a_tool_call(), _with_a_tool_call(tool_ok=False), _with_a_tool_call()]
    metrics = episode_metrics(batch, version=1)
    assert metrics["turns/mean"] == 2 and metrics["tools/calls"] == 1
    assert metrics["tools/success"] == pytest.approx(2 / 3)
    assert metrics["response_len/mean"] == 4  # 2 + 2 action tokens; the 3 tool-output tokens are not the policy's
    assert turn_metrics([_single_turn()]) == {}
    assert "turns/mean" not in episode_metrics([_single_turn()], version=1)


def test_the_dashboard_plots_turns_per_episode_and_tool_success() -> None:
    titles = {p.title: p.metrics for p in PANELS}
    assert titles["turns per episode"] == ("turns/mean",) and titles["tool-call success"] == ("tools/success",)
    data = CurveData()
    data.add_row({"step": 1, "reward/mean": 0.5, "turns/mean": 2.5, "tools/success": 0.75})
    data.add_row({"step": 2, "reward/mean": 0.6, "turns/mean": 3.0})
    values = data.last_values()
    assert values["turns/mean"] == (2.0, 3.0) and values["tools/success"] == (1.0, 0.75)
