"""RLTrainer in a real monarch proc with TorchForge-signature losses: the skill card's CustomLoss and DAPOLoss.

Reuses tests/actors/test_trainer.py's module mesh fixture, batch builder and spawn helper.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from forge_nb.rl.loss import DAPOLoss, GRPOLoss
from tests.actors import test_trainer as shared
from tests.actors.test_trainer import differs, first, make_batch, on_module_loop, spawn
from tests.actors_for_tests import CustomLoss

env = shared.env  # test_trainer's module-scoped fixture: a 1-proc mesh, the tiny model and torchstore

pytestmark = pytest.mark.timeout(180)


async def step(trainer: Any, batch: Any) -> dict[str, float]:
    """Rank 0's metrics of one train_step (a ForwardBackwardResult's metrics, or the metrics dict)."""
    result = first(await trainer.train_step.call(batch))
    return getattr(result, "metrics", result)


def off_policy(batch: Any, seed: int = 3) -> Any:
    """The batch with generator logprobs that differ from the policy's, so ratios and clipping matter."""
    g = torch.Generator().manual_seed(seed)
    gen = (-2.5 * torch.rand(batch.response.shape, generator=g)).masked_fill(~batch.response_mask, 0.0)
    return dataclasses.replace(batch, generator_logprobs=gen, has_generator_logprobs=True)


@on_module_loop
async def test_custom_loss_trains_and_its_metrics_come_back(env: Any) -> None:
    trainer = await spawn(env.mesh, "custom", env.model, loss=CustomLoss(clip_range=0.2, beta=0.1))
    initial = first(await trainer.state_dict.call())["model"]

    on_policy = [await step(trainer, make_batch()) for _ in range(3)]
    for metrics in on_policy:
        assert {"pg_loss", "kl", "ratio_mean", "loss", "grad_norm", "entropy"} <= metrics.keys()
        assert metrics["ratio_mean"] == pytest.approx(1.0)  # no generator logprobs: on-policy, padding too
    assert on_policy[0]["kl"] != on_policy[2]["kl"] and on_policy[0]["loss"] != on_policy[2]["loss"]
    assert differs(initial, first(await trainer.state_dict.call())["model"])

    batch = off_policy(make_batch())
    steps = [await step(trainer, batch) for _ in range(3)]
    assert all(abs(m["ratio_mean"] - 1.0) > 0.01 for m in steps)
    assert len({round(m["pg_loss"], 7) for m in steps}) == 3 and steps[0]["loss"] != steps[2]["loss"]


@on_module_loop
async def test_custom_loss_sees_what_forge_nb_grpo_sees(env: Any) -> None:
    """The card's loss (token mean, symmetric clip 0.2, beta 0.1) equals GRPOLoss configured the same way,
    so the trainer hands it the aligned logits, targets, masks and logprobs."""
    batch = off_policy(make_batch(seed=5))
    custom = await spawn(env.mesh, "card", env.model, loss=CustomLoss(clip_range=0.2, beta=0.1))
    ours = await spawn(env.mesh, "card-ours", env.model, loss=GRPOLoss(clip_eps=0.2, beta=0.1, agg_type="token_mean"))
    a = await step(custom, batch)
    b = await step(ours, batch)
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
    assert a["pg_loss"] == pytest.approx(b["loss/policy"], rel=1e-5)
    assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)


@on_module_loop
async def test_batch_without_ref_logprobs_is_refused_for_a_kl_loss(env: Any) -> None:
    trainer = await spawn(env.mesh, "no-ref", env.model, loss=CustomLoss(beta=0.1))
    no_ref = dataclasses.replace(make_batch(), has_ref_logprobs=False)
    with pytest.raises(Exception, match="beta=0.1 but this batch has no reference logprobs"):
        await trainer.train_step.call(no_ref)
    assert (await step(trainer, make_batch()))["step"] == 1.0  # nothing was trained
    without_kl = await spawn(env.mesh, "no-ref-beta0", env.model, loss=CustomLoss(beta=0.0))
    with pytest.raises(Exception, match="ref_logprobs is None"):  # the card's loss calls compute_kl anyway
        await without_kl.train_step.call(no_ref)


@on_module_loop
async def test_dapo_adaptive_kl_adapts_inside_the_trainer(env: Any) -> None:
    trainer = await spawn(env.mesh, "dapo-akl", env.model,
                          loss=DAPOLoss(clip_range=0.2, adaptive_kl=True, kl_target=0.01))
    steps = [await step(trainer, make_batch()) for _ in range(3)]
    assert steps[0]["kl/beta"] == pytest.approx(0.1)
    for before, after in zip(steps, steps[1:], strict=False):
        kl = before["kl/k3"]
        factor = 2.0 if kl > 0.015 else 0.5 if kl < 0.01 / 1.5 else 1.0
        assert after["kl/beta"] == pytest.approx(before["kl/beta"] * factor)
    assert steps[2]["kl/beta"] != steps[0]["kl/beta"]


def test_text_train_batch_loss_in_process() -> None:
    """text_loss (the skill card's TextTrainBatch): whole-sequence logits aligned with target_ids, target_weights
    as per-token advantages, no reference logprobs."""
    from forge_nb.actors.training.loss import text_loss
    from forge_nb.rl.types import TextTrainBatch

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 9, (2, 6), generator=g)
    mask = torch.tensor([[0, 0, 1, 1, 1, 0], [0, 1, 1, 1, 0, 0]], dtype=torch.bool)
    weights = torch.tensor([[1.0], [-0.5]]).expand(2, 6) * mask
    batch = TextTrainBatch(input_ids=ids, target_ids=torch.roll(ids, -1, dims=1), target_mask=mask,
                           target_weights=weights)
    logits = torch.randn(2, 6, 11, generator=g, requires_grad=True)
    tf_kind, tf_metrics = text_loss(PolicyGradient(), logits, batch, temperature=1.0)
    ours, _ = text_loss(GRPOLoss(beta=0.0, agg_type="token_mean"), logits, batch, temperature=1.0)
    lp = torch.log_softmax(logits, -1).gather(-1, batch.target_ids.unsqueeze(-1)).squeeze(-1)
    want = -(weights * torch.exp(lp - lp.detach()))[mask].mean()  # on-policy REINFORCE, token mean
    torch.testing.assert_close(tf_kind, want)
    torch.testing.assert_close(ours, want)
    assert tf_metrics["ratio_mean"] == pytest.approx(1.0) and "entropy" in tf_metrics
    (grad,) = torch.autograd.grad(tf_kind, logits)
    assert grad[~mask].abs().sum() == 0 and grad[mask].abs().sum() > 0
    for loss_fn in (CustomLoss(beta=0.1), GRPOLoss(beta=0.1)):
        with pytest.raises(ValueError, match="TextTrainBatch does not carry"):
            text_loss(loss_fn, logits, batch, temperature=1.0)
    with pytest.raises(ValueError, match="ref_logprobs is None"):  # the card's loss computes its KL anyway
        text_loss(CustomLoss(beta=0.0), logits, batch, temperature=1.0)


class PolicyGradient:
    """A TorchForge-signature loss without a KL term (no ref_logprobs parameter)."""

    def __call__(self, logits, target_ids, advantages, generator_logprobs, loss_mask):
        from forge_nb.rl.loss.ops import aggregate, compute_logprobs, compute_ratio

        ratio = compute_ratio(compute_logprobs(logits, target_ids), generator_logprobs, loss_mask)
        return aggregate(-ratio * advantages, loss_mask), {"ratio_mean": (ratio * loss_mask).sum() / loss_mask.sum()}
