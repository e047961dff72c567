"""A run's states: the transitions ``forge_nb.controller.state`` allows, and the ones it refuses."""

from __future__ import annotations

import json

import pytest

from forge_nb.controller.state import TRANSITIONS, RunState, transition


def test_every_state_says_where_it_may_go_and_shut_down_is_final() -> None:
    assert set(TRANSITIONS) == set(RunState)
    assert TRANSITIONS[RunState.SHUT_DOWN] == frozenset()
    for state in RunState:
        if state is not RunState.SHUT_DOWN:
            assert RunState.SHUT_DOWN in TRANSITIONS[state], state  # a run can always be shut down
    # a failed run starts again once its cause is fixed, or shuts down; nothing else
    assert TRANSITIONS[RunState.FAILED] == {RunState.RUNNING, RunState.SHUT_DOWN}


def test_a_move_the_table_lacks_is_refused_with_the_moves_there_are() -> None:
    assert transition(RunState.READY, "running") is RunState.RUNNING
    assert transition(RunState.PAUSED, RunState.PAUSED) is RunState.PAUSED  # staying is no move
    with pytest.raises(RuntimeError, match="a run cannot go from 'shut down' to 'running' .*none: it is final"):
        transition(RunState.SHUT_DOWN, RunState.RUNNING)
    with pytest.raises(RuntimeError, match="from 'failed' to 'paused' \\(from 'failed': running, shut down\\)"):
        transition(RunState.FAILED, RunState.PAUSED)
    with pytest.raises(ValueError, match="'stopping' is not a valid RunState"):
        transition(RunState.RUNNING, "stopping")


def test_a_state_reads_and_serialises_as_its_text() -> None:
    assert RunState.SHUT_DOWN == "shut down" and f"{RunState.PAUSED}" == "paused"
    assert json.dumps({"state": RunState.RUNNING}) == '{"state": "running"}'
    assert {RunState.READY: 1}.get("ready") == 1  # the widgets' colour table, looked up by a run's text
