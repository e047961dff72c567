"""The trainer's Tinker-shaped calls in a real monarch proc on CPU: forward_backward adds the gradients of a loss over
Datums (their logprobs are the trainer's own), optim_step applies them with Adam's parameters; on a LoRA trainer too."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.actors import test_trainer as shared
from tests.actors.test_trainer import first

pytestmark = [pytest.mark.timeout(180), pytest.mark.asyncio(loop_scope="module")]

env = shared.env  # test_trainer's module-scoped fixture: a 1-proc mesh, the tiny model and torchstore
PROMPT, COMPLETION = [2, 3, 4, 2], [5, 5, 5, 5]  # token ids of the tiny model's letters


def sft_datum(prompt: list[int] = PROMPT, completion: list[int] = COMPLETION, weight: float = 1.0) -> dict[str, Any]:
    """A cross-entropy Datum as Tinker's docs build one: the input all but the last token, the targets shifted."""
    full = prompt + completion
    weights = [0.0] * (len(prompt) - 1) + [weight] * len(completion)
    return {"tokens": full[:-1], "inputs": {"target_tokens": full[1:], "weights": weights}}


async def test_forward_backward_gives_the_trainer_s_logprobs_and_the_weighted_loss(env: Any) -> None:
    trainer = await shared.spawn(env.mesh, "tinker-fb", env.model)
    full = torch.tensor([PROMPT + COMPLETION])
    theirs = first(await trainer.forward.call(full, len(PROMPT)))[0]  # the response's logprobs, as the loop computes
    out = first(await trainer.forward_backward.call([sft_datum()], "cross_entropy", backward=False))
    (lp,) = out["logprobs"]
    assert lp.shape == (len(PROMPT) + len(COMPLETION) - 1,)
    torch.testing.assert_close(lp[len(PROMPT) - 1:], theirs, atol=1e-6, rtol=0)
    assert out["metrics"]["loss:sum"] == pytest.approx(-float(theirs.sum()), abs=1e-5)
    # two Datums of other lengths in one call: each as it is alone (left padding adds nothing)
    short = sft_datum(PROMPT[:2], COMPLETION[:2])
    both = first(await trainer.forward_backward.call([short, sft_datum()], "cross_entropy", backward=False))
    alone = first(await trainer.forward_backward.call([short], "cross_entropy", backward=False))
    torch.testing.assert_close(both["logprobs"][0], alone["logprobs"][0], atol=1e-6, rtol=0)
    torch.testing.assert_close(both["logprobs"][1], lp, atol=1e-6, rtol=0)


async def test_gradients_add_up_until_optim_step_applies_them(env: Any) -> None:
    once = await shared.spawn(env.mesh, "tinker-once", env.model)
    twice = await shared.spawn(env.mesh, "tinker-twice", env.model)
    adam = {"learning_rate": 1e-2, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8}
    await once.forward_backward.call([sft_datum(weight=2.0)], "cross_entropy")
    for _ in range(2):  # the same loss in two calls: the gradients sum
        await twice.forward_backward.call([sft_datum()], "cross_entropy")
    a, b = first(await once.optim_step.call(**adam)), first(await twice.optim_step.call(**adam))
    assert a["grad_norm:mean"] == pytest.approx(b["grad_norm:mean"], rel=1e-5) and a["step:max"] == 1.0
    before = -first(await once.forward_backward.call([sft_datum()], "cross_entropy", backward=False))["metrics"][
        "loss:sum"]
    after_once = first(await once.forward.call(torch.tensor([PROMPT + COMPLETION]), len(PROMPT)))
    after_twice = first(await twice.forward.call(torch.tensor([PROMPT + COMPLETION]), len(PROMPT)))
    torch.testing.assert_close(after_once, after_twice, atol=1e-6, rtol=0)
    assert float(after_once.sum()) == pytest.approx(before, abs=1e-5)  # forward_backward(backward=False) is forward
    # a step of gradient descent on the completion's cross-entropy made the completion likelier, and cleared the
    # gradients: an optim_step with none added moves nothing
    fresh = await shared.spawn(env.mesh, "tinker-fresh", env.model)
    untrained = first(await fresh.forward.call(torch.tensor([PROMPT + COMPLETION]), len(PROMPT)))
    assert float(after_once.sum()) > float(untrained.sum())
    assert first(await once.optim_step.call(**adam))["grad_norm:mean"] == 0.0


async def test_rl_losses_and_clipping_on_a_lora_trainer(env: Any) -> None:
    trainer = await shared.spawn(env.mesh, "tinker-lora", env.model, optimizer={"lr": 1e-3},
                                 lora={"rank": 4, "alpha": 8}, weights_namespace="tinker-lora")
    datum = sft_datum()
    lp = first(await trainer.forward_backward.call([datum], "cross_entropy", backward=False))["logprobs"][0]
    n = len(lp)
    advantages = [0.0] * (len(PROMPT) - 1) + [1.0] * len(COMPLETION)
    rl = {"tokens": datum["tokens"], "inputs": {"target_tokens": datum["inputs"]["target_tokens"],
                                                 "logprobs": lp.tolist(), "advantages": advantages}}
    reinforce = -float((lp * torch.tensor(advantages)).sum())
    # the sampler's logprobs are the trainer's own: every ratio is 1
    expected = {"importance_sampling": -sum(advantages), "ppo": -sum(advantages), "cispo": reinforce, "dro": reinforce}
    for loss_fn, loss in expected.items():
        out = first(await trainer.forward_backward.call([rl], loss_fn, backward=False))
        assert len(out["logprobs"][0]) == n and out["metrics"]["loss:sum"] == pytest.approx(loss, abs=1e-4), loss_fn
    await trainer.forward_backward.call([rl], "importance_sampling")
    step = first(await trainer.optim_step.call(learning_rate=1e-2, grad_clip_norm=1e-3))
    assert step["grad_norm:mean"] > 1e-3 and step["skipped:sum"] == 0.0  # the norm before clipping
    with pytest.raises(Exception, match="loss_fn_inputs"):
        await trainer.forward_backward.call([{"tokens": [1, 2], "inputs": {"target_tokens": [2]}}], "cross_entropy")
    with pytest.raises(Exception, match="the losses served are"):
        await trainer.forward_backward.call([datum], "gspo")
    with pytest.raises(Exception, match=r"adam_params.beta1=1.5"):
        await trainer.optim_step.call(beta1=1.5)
