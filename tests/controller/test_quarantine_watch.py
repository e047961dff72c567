"""QuarantineWatch on its own: the pause names the reasons of its window (not an earlier one) and the fix for who
quarantined them, with the exception behind the commonest as the pause's cause."""

from __future__ import annotations

from forge_nb.controller.intake.quarantine import QuarantineWatch

AGENT = "the agent raised ZeroDivisionError: division by zero (cell In[7], line 3: return 1 / len(calls))"
STALE = "the agent raised BadRequestError: 400 the prompt has 30 tokens and a trained prompt at most 4"
REWARD = "reward function 'grade' raised KeyError: 'answer'"
ENV = "environment step failed at turn 2: the board has no square e9"


def test_the_pause_names_the_reasons_in_its_window_not_an_earlier_one() -> None:
    watch = QuarantineWatch(window=32)
    for _ in range(500):  # an earlier problem, long fixed: far more episodes than the window
        watch.note(STALE)
    for _ in range(100):
        watch.note(None)
    error = ZeroDivisionError("division by zero")
    for _ in range(28):
        watch.note(AGENT, error)
    assert watch.overwhelmed() is None  # 28 of 32: under the 90% that pauses
    for _ in range(4):
        watch.note(AGENT, error)
    why = watch.overwhelmed()
    assert why is not None and "BadRequestError" not in why.message, why
    assert why.message.startswith("32 of the last 32 episodes were quarantined, so the run paused: 32 x " + AGENT)
    assert "Fix the agent (run.episode_fn = agent_episode(your_agent))" in why.message
    assert "reward_fns" not in why.message
    raised = why.error()
    assert isinstance(raised, RuntimeError) and raised.__cause__ is error and str(raised) == why.message


def test_each_kind_of_reason_gets_its_own_fix_and_mixed_windows_count_each() -> None:
    watch = QuarantineWatch(window=40)
    for reason in [REWARD] * 20 + [ENV] * 12 + [AGENT] * 8:
        watch.note(reason)
    why = watch.overwhelmed()
    assert why is not None and why.cause is None  # no exception was kept for the commonest reason
    assert "20 x " + REWARD in why.message and "12 x " + ENV in why.message and "8 x " + AGENT in why.message
    assert why.message.index(REWARD) < why.message.index(ENV) < why.message.index(AGENT)  # commonest first
    for fix in ("Fix the reward function (run.reward_fns)", "Fix the environment", "Fix the agent"):
        assert fix in why.message


def test_reset_forgets_the_window_and_reports_stay_counts() -> None:
    watch = QuarantineWatch(window=4, interval_s=0.0)
    for _ in range(4):
        watch.note(REWARD)
    assert watch.overwhelmed() is not None
    watch.reset()
    assert watch.overwhelmed() is None
    assert watch.flush() == {"episodes": 4, "reasons": {"reward function 'grade' raised KeyError": 4},
                             "last": {"reward function 'grade' raised KeyError": REWARD}}
    assert watch.flush() is None
