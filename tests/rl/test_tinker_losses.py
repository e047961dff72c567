"""The Tinker API's five built-in losses (forge_nb.rl.losses.tinker) against values and gradients worked by hand."""

from __future__ import annotations

import math

import pytest
import torch

from forge_nb.rl.losses.tinker import needed_inputs, tinker_loss


def run(loss_fn: str, lp: list[float], config: dict | None = None, **inputs: list[float]) -> tuple[float, list[float]]:
    """The loss and d loss / d lp."""
    logprobs = torch.tensor(lp, requires_grad=True)
    loss, metrics = tinker_loss(loss_fn, logprobs, {k: torch.tensor(v) for k, v in inputs.items()}, config)
    loss.backward()
    assert metrics == {"loss:sum": pytest.approx(float(loss.detach()))}
    return float(loss.detach()), logprobs.grad.tolist()


def test_cross_entropy_is_the_weighted_sum_of_negative_logprobs():
    loss, grad = run("cross_entropy", [-1.0, -2.0, -0.5], weights=[0.0, 1.0, 1.0])
    assert loss == pytest.approx(2.5) and grad == pytest.approx([0.0, -1.0, -1.0])


def test_importance_sampling_weighs_each_advantage_by_the_ratio():
    # r = 0.5 / 0.25 = 2: loss -r A, gradient -r A (d r / d lp = r)
    loss, grad = run("importance_sampling", [math.log(0.5), 0.0], logprobs=[math.log(0.25), 0.0],
                     advantages=[1.5, 0.0])
    assert loss == pytest.approx(-3.0) and grad == pytest.approx([-3.0, 0.0])


def test_ppo_clips_the_ratio_on_the_side_the_advantage_favours():
    lp, q = [math.log(0.5)] * 2, [math.log(0.25)] * 2  # r = 2, above the default 1.2
    loss, grad = run("ppo", lp, logprobs=q, advantages=[1.5, -1.0])
    # A > 0: min(2 * 1.5, 1.2 * 1.5) = 1.8, clipped, no gradient; A < 0: min(-2, -1.2) = -2, unclipped, gradient -r A
    assert loss == pytest.approx(-1.8 + 2.0) and grad == pytest.approx([0.0, 2.0])
    loss, grad = run("ppo", lp, {"clip_low_threshold": 0.5, "clip_high_threshold": 3.0}, logprobs=q,
                     advantages=[1.5, -1.0])
    assert loss == pytest.approx(-3.0 + 2.0) and grad == pytest.approx([-3.0, 2.0])  # r = 2 inside [0.5, 3]


def test_cispo_weighs_a_reinforce_gradient_by_the_clipped_ratio():
    loss, grad = run("cispo", [math.log(0.5)], logprobs=[math.log(0.25)], advantages=[2.0])
    assert loss == pytest.approx(-1.2 * 2.0 * math.log(0.5)) and grad == pytest.approx([-1.2 * 2.0])


def test_dro_adds_a_quadratic_penalty_on_the_log_ratio():
    loss, grad = run("dro", [-1.0], {"beta": 0.1}, logprobs=[-1.5], advantages=[2.0])
    assert loss == pytest.approx(-(-1.0 * 2.0 - 0.05 * 0.25)) and grad == pytest.approx([-(2.0 - 0.1 * 0.5)])
    assert run("dro", [-1.0], logprobs=[-1.5], advantages=[2.0])[0] == pytest.approx(2.0 + 0.025 * 0.25)  # beta 0.05


@pytest.mark.parametrize("loss_fn", ["cross_entropy", "importance_sampling", "ppo", "cispo", "dro"])
def test_padding_adds_nothing(loss_fn):
    """Positions outside a Datum: lp, weights, sampler logprobs and advantages all zero."""
    inputs = {k: [0.3, 0.0] if k == "weights" else [-0.7, 0.0] if k == "logprobs" else [1.0, 0.0]
              for k in needed_inputs(loss_fn)[1:]}
    one, grad_one = run(loss_fn, [-0.4], **{k: v[:1] for k, v in inputs.items()})
    padded, grad = run(loss_fn, [-0.4, 0.0], **inputs)
    assert padded == pytest.approx(one) and grad == pytest.approx([grad_one[0], 0.0])


def test_unknown_losses_and_settings_are_refused_by_name():
    with pytest.raises(ValueError, match="the losses served are"):
        needed_inputs("gspo")
    with pytest.raises(ValueError, match=r"\['clip'\]: 'ppo' takes"):
        run("ppo", [0.0], {"clip": 0.2}, logprobs=[0.0], advantages=[1.0])
    with pytest.raises(ValueError, match="0 <= low < 1 < high"):
        run("cispo", [0.0], {"clip_high_threshold": 0.9}, logprobs=[0.0], advantages=[1.0])
    with pytest.raises(ValueError, match="a number"):
        run("dro", [0.0], {"beta": "big"}, logprobs=[0.0], advantages=[1.0])
