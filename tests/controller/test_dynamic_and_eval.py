"""Dynamic sampling's gate, overlong handling and pass@k on real objects and tensors (no processes); the same on a
real run is in tests/run/test_mismatch_run.py."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from forge_nb.actors.training.loss import rl_loss
from forge_nb.config import RolloutConfig, from_dict
from forge_nb.controller.evaluate import check_eval_args, pass_at_k
from forge_nb.controller.intake.dynamic import GroupGate
from forge_nb.controller.intake.ledger import Ledger
from forge_nb.rl import Completion, Episode, GRPOLoss, ReplayBuffer, assign_advantages, collate
from forge_nb.rl.overlong import add_overlong_penalty, overlong_penalty

SMALL = [(n, c, k) for n in range(1, 7) for c in range(n + 1) for k in range(1, n + 1)]


@pytest.mark.parametrize(("n", "c", "k"), SMALL)
def test_pass_at_k_is_the_share_of_k_subsets_holding_a_correct_answer(n: int, c: int, k: int) -> None:
    answers = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    brute = sum(any(answers[i] for i in s) for s in subsets) / len(subsets)
    assert pass_at_k(n, c, k) == pytest.approx(brute)


def test_eval_arguments_are_refused_with_the_argument() -> None:
    with pytest.raises(ValueError, match=r"evaluate\(k=0\): .* integer >= 1"):
        check_eval_args(0, None, 5)
    with pytest.raises(ValueError, match=r"version=3\): that version is no longer stored; .* version \(5\)"):
        check_eval_args(2, 3, 5)
    with pytest.raises(ValueError, match=r"version=9\): that version is not trained yet"):
        check_eval_args(1, 9, 5)
    check_eval_args(4, 5, 5)


def test_dapo_soft_overlong_penalty() -> None:
    # budget 10, buffer 4: no penalty up to 6 tokens, then -1/4 per token down to -1 at 10
    assert [overlong_penalty(n, 10, 4) for n in (1, 6, 7, 8, 10, 11)] == [0, 0, -0.25, -0.5, -1.0, -1.0]
    assert overlong_penalty(10, 10, 4, penalty=0.5) == -0.5
    assert overlong_penalty(10, 10, 0) == 0.0
    group = [_episode([1] * n, reward=1.0) for n in (2, 9)]
    add_overlong_penalty(group, 10, 4)
    assert [e.reward for e in group] == [1.0, 0.25] and group[1].rewards["overlong"] == -0.75


def _episode(tokens: list[int], reward: float, stop: str = "stop", gid: str = "") -> Episode:
    completion = Completion(text="x" * len(tokens), token_ids=torch.tensor(tokens), prompt_ids=torch.tensor([5, 6]),
                            logprobs=torch.full((len(tokens),), -1.0), stop_reason=stop, generator_version=0)
    return Episode(pad_id=0, request_len=2, response_len=4, completion=completion, reward=reward, target=gid)


def test_the_gate_drops_flat_groups_into_the_ledger_and_the_counters_add_up() -> None:
    buffer = ReplayBuffer(batch_size=4, max_policy_age=1)
    ledger = Ledger(buffer)
    gate = GroupGate(RolloutConfig(dynamic_sampling=True), ledger)
    groups = [[_episode([1, 2], r) for r in rewards] for rewards in ([1, 1], [0, 1], [0, 0], [0.5, 0.25])]
    for group in groups:
        assign_advantages(group)
        kept = gate.admit(group)
        for episode in kept:
            ledger.accept()
            buffer.add(episode)
    books = ledger.books()
    assert books["zero_variance"] == 4 and books["accepted"] == 8 and books["buffered"] == 4 and books["balanced"]
    row = gate.row(trained_episodes=4, group_size=2)
    assert row == {"groups/generated": 4.0, "groups/dropped": 2.0, "groups/trained": 2.0, "frac_reward_zero_std": 0.5}
    assert gate.row(0, 2)["groups/generated"] == 0  # counted per step
    failing = [_episode([1, 2], 1.0), _episode([1, 2], 1.0), _episode([3], 0.0)]
    failing[2].quarantine, failing[2].reward = "reward_raised", None  # the others agree; the failure must be seen
    assert gate.admit(failing) == failing
    plain = GroupGate(RolloutConfig(), Ledger(buffer))
    assert plain.admit(groups[0]) == groups[0] and plain.row(2, 2)["frac_reward_zero_std"] == 1.0


def test_masked_truncated_episodes_get_exactly_zero_gradient() -> None:
    """Through the trainer's loss path (logits -> logprobs -> loss with KL, entropy bonus and a correction):
    the truncated episode's logits get a zero gradient, the finished one's do not."""
    gate = GroupGate(RolloutConfig(mask_truncated=True), Ledger(ReplayBuffer(batch_size=2, max_policy_age=1)))
    group = [_episode([1, 2, 3, 4], 1.0, stop="length"), _episode([3, 2], 0.0)]
    assign_advantages(group)
    gate.admit(group)
    assert group[0].policy_mask.tolist() == [False] * 4 and group[1].policy_mask is None
    for episode in group:
        episode.ref_logprobs = torch.full((4,), -1.5)
    batch = collate(group)
    logits = torch.randn(2, batch.tokens.shape[1], 8, dtype=torch.float32, requires_grad=True)
    loss_fn = GRPOLoss(beta=0.1, entropy_coef=0.01, mismatch_correction="token_truncate")
    loss, _ = rl_loss(loss_fn, logits, batch, temperature=1.0, version=0)
    loss.backward()
    assert torch.count_nonzero(logits.grad[0]) == 0
    assert torch.count_nonzero(logits.grad[1]) > 0


def test_rollout_settings_are_refused_with_the_field() -> None:
    with pytest.raises(ValueError, match=r"RolloutConfig.refill_timeout_s=0: must be a number of seconds > 0"):
        RolloutConfig(refill_timeout_s=0)
    with pytest.raises(ValueError, match=r"RolloutConfig.overlong_buffer=-1"):
        RolloutConfig(overlong_buffer=-1)
    with pytest.raises(ValueError, match=r"RolloutConfig.overlong_penalty=nan"):
        RolloutConfig(overlong_penalty=math.nan)
    with pytest.raises(ValueError, match=r"rollout.overlong_buffer=8 is not below the response budget max_tokens=8"):
        from_dict({"use_reference": True, "rollout": {"overlong_buffer": 8}})
    with pytest.raises(ValueError, match=r"LoopConfig.eval_k=0: must be an integer >= 1"):
        from_dict({"use_reference": True, "loop": {"eval_k": 0}})
    cfg = from_dict({"use_reference": True, "rollout": {"dynamic_sampling": True, "overlong_buffer": 2}})
    assert cfg.rollout.dynamic_sampling and cfg.to_dict()["rollout"]["overlong_buffer"] == 2


async def test_past_the_refill_bound_a_step_trains_on_what_the_buffer_holds_and_says_so() -> None:
    """RLBatches.take with a real buffer, ledger, gate and metrics store (the controller's parts it reads)."""
    import asyncio
    from types import SimpleNamespace

    from forge_nb.controller.loop import RLBatches
    from forge_nb.metrics import MetricsStore

    cfg = from_dict({"use_reference": True, "batch_size": 16, "group_size": 2,
                     "rollout": {"dynamic_sampling": True, "refill_timeout_s": 0.05}})
    buffer = ReplayBuffer(batch_size=16, max_policy_age=1)
    for _ in range(3):
        group = [_episode([1, 2], r) for r in (0.0, 1.0)]
        assign_advantages(group)
        for episode in group:
            buffer.add(episode)
    ctl = SimpleNamespace(config=cfg, buffer=buffer, sync=SimpleNamespace(version=0), metrics=MetricsStore(), step=0,
                          gate=GroupGate(cfg.rollout, Ledger(buffer)), training_idle=asyncio.Event(),
                          collect_allowed=asyncio.Event(), batch_ready=asyncio.Event())
    source = RLBatches(ctl)
    assert await source.take() is None  # short of a batch: it waited for more groups until the bound
    batch = await source.take()
    assert batch is not None and batch.size == 6 and len(buffer) == 0
    (event,) = ctl.metrics.events_frame("refill_timeout").to_dict("records")
    assert event["episodes"] == 6 and "trains on the 6 episodes it has of 16" in event["message"]
    assert ctl.metrics.events_frame("starved").empty  # woken by the refill bound, long before starvation's
