"""The losses' entropy bonus (``entropy_coef``: loss - coef * entropy, and how the trainer feeds it) and the
per-prompt report."""

from __future__ import annotations

import pytest
import torch

from forge_nb.actors.training.loss import _aligned_loss, loss_function
from forge_nb.rl import DAPOLoss, GRPOLoss
from forge_nb.rl.report import per_prompt, unsolved

B, T, V = 4, 3, 6


def inputs(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    target_ids = torch.randint(0, V, (B, T), generator=g)
    target_ids[1, 2] = -100  # padding
    return {
        "logits": torch.randn(B, T, V, generator=g, dtype=torch.float64).requires_grad_(),
        "target_ids": target_ids,
        "advantages": torch.randn(B, 1, generator=g, dtype=torch.float64),
        "generator_logprobs": None,
        "loss_mask": torch.ones(B, T, dtype=torch.float64),
    }


def test_bonus_is_coef_times_token_mean_entropy() -> None:
    args = inputs()
    base, _ = GRPOLoss(beta=0.0)(**args)
    total, metrics = GRPOLoss(beta=0.0, entropy_coef=0.05)(**args)
    probs = torch.softmax(args["logits"].detach(), -1)
    h = -(probs * probs.log()).sum(-1)
    valid = args["target_ids"] != -100
    expected_h = h[valid].mean().item()
    assert metrics["entropy"] == pytest.approx(expected_h, rel=1e-6)
    assert metrics["loss/entropy_bonus"] == pytest.approx(0.05 * expected_h, rel=1e-6)
    assert total.item() == pytest.approx(base.item() - 0.05 * expected_h, rel=1e-6)
    assert metrics["loss/total"] == pytest.approx(total.item())


def test_bonus_gradient_raises_entropy_when_advantages_are_zero() -> None:
    """A group of identical answers (advantage 0) still gets a gradient: towards a flatter distribution."""
    args = inputs()
    args["advantages"] = torch.zeros(B, 1, dtype=torch.float64)
    logits = args["logits"]
    loss = DAPOLoss(entropy_coef=0.1)
    total, metrics = loss(**args)
    total.backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0
    with torch.no_grad():
        _, after = loss(**{**args, "logits": logits - 0.5 * logits.grad})
    assert after["entropy"] > metrics["entropy"]


def test_coef_zero_adds_nothing_and_no_bonus_metric() -> None:
    args = inputs(1)
    base, base_metrics = GRPOLoss(beta=0.0, clip_eps=0.3)(**args)
    assert "loss/entropy_bonus" not in base_metrics
    assert GRPOLoss(beta=0.0, clip_eps=0.3, entropy_coef=0.0)(**args)[0].item() == pytest.approx(base.item())


def test_the_trainer_passes_logits_with_gradients_only_when_entropy_is_trained() -> None:
    """forge_nb's per-token form: logprobs carry the policy gradient, the logits the entropy bonus. With
    zero advantages the policy term has no gradient, so any gradient on the logits is the bonus's."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(B, T, V, generator=g).requires_grad_()
    targets = torch.randint(0, V, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.bool)
    zeros = torch.zeros(B, 1)
    for coef, moved in ((0.0, False), (0.1, True)):
        logits.grad = None
        loss, metrics = _aligned_loss(loss_function("grpo", {"beta": 0.0, "entropy_coef": coef}),
                                      logits, targets, mask, zeros, None, None)
        loss.backward()
        assert bool(logits.grad.abs().sum() > 0) is moved, coef
        assert ("loss/entropy_bonus" in metrics) is moved and metrics["entropy"] > 0


@pytest.mark.parametrize("coef", [-0.1, float("nan"), True, "0.1"])
def test_bad_coef_is_refused(coef: object) -> None:
    with pytest.raises(ValueError, match="entropy_coef"):
        GRPOLoss(entropy_coef=coef)  # type: ignore[arg-type]


def test_the_bonus_without_logits_is_refused() -> None:
    args = inputs()
    logprobs = torch.log_softmax(args["logits"].detach(), -1)[..., 0]
    mask = torch.ones(B, T, dtype=torch.bool)
    with pytest.raises(ValueError, match="needs the logits"):
        GRPOLoss(beta=0.0, entropy_coef=0.1)(logprobs, None, None, args["advantages"], mask)


def test_per_prompt_lists_the_worst_first_from_the_newest_samples() -> None:
    rows = [{"prompt": "a", "target": "aaaa", "reward": 0.0}] * 10  # old failures, pushed out by `last`
    rows += [{"prompt": "a", "target": "aaaa", "reward": 1.0}] * 4
    rows += [{"prompt": "h", "target": "hhhh", "reward": 0.0}] * 3 + [{"prompt": "h", "target": "hhhh", "reward": 0.5}]
    rows += [{"prompt": "q", "target": "qqqq", "reward": None}]  # quarantined: skipped
    report = per_prompt(rows, last=4)
    assert [r["prompt"] for r in report] == ["h", "a"]
    assert report[0] == {"prompt": "h", "target": "hhhh", "samples": 4, "mean_reward": 0.125, "best": 0.5,
                         "solved": False}
    assert report[1]["mean_reward"] == 1.0 and report[1]["solved"]
    assert [r["prompt"] for r in unsolved(rows, last=4)] == ["h"]
    assert [r["prompt"] for r in unsolved(rows, last=20)] == ["h", "a"]  # "a" with its old failures too


def test_per_prompt_refuses_a_bad_window() -> None:
    with pytest.raises(ValueError, match="last=0"):
        per_prompt([], last=0)
