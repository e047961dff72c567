"""The TorchForge documents' loss API on forge_nb: forge_nb.rl.loss, its ops, constructors and call form."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import forge_nb.rl.losses as losses
from forge_nb.rl import loss as tf_loss
from forge_nb.rl.loss import CISPOLoss, DAPOLoss, GRPOLoss, GSPOLoss, SAPOLoss
from forge_nb.rl.loss.ops import aggregate, compute_kl, compute_logprobs, compute_ratio, create_shifted_targets
from tests.actors_for_tests import CustomLoss  # the skill card's Workflow 2 loss

B, T, V = 4, 6, 9


def make_inputs(seed: int, noise: float = 0.3) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, T, V, generator=g, dtype=torch.float64)
    target_ids = torch.randint(0, V, (B, T), generator=g)
    mask = torch.ones(B, T)
    mask[1, 4:] = 0
    mask[2, 2:] = 0
    lp = torch.log_softmax(logits, -1).gather(-1, target_ids.unsqueeze(-1)).squeeze(-1)
    return {
        "logits": logits,
        "target_ids": target_ids,
        "loss_mask": mask,
        "generator_logprobs": lp + noise * torch.randn(B, T, generator=g, dtype=torch.float64),
        "ref_logprobs": lp + noise * torch.randn(B, T, generator=g, dtype=torch.float64),
        "advantages": torch.randn(B, 1, generator=g, dtype=torch.float64),
    }


def plain_logprobs(logits: torch.Tensor, target_ids: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits, -1).gather(-1, target_ids.unsqueeze(-1)).squeeze(-1)


# ---- the package ----------------------------------------------------------------------------------


def test_loss_package_exports_the_same_classes() -> None:
    for name in ("GRPOLoss", "DAPOLoss", "CISPOLoss", "GSPOLoss", "SAPOLoss", "make_loss", "PolicyLoss"):
        assert getattr(tf_loss, name) is getattr(losses, name)
    assert tf_loss.ops.compute_ratio is compute_ratio


# ---- ops ------------------------------------------------------------------------------------------


def test_compute_logprobs_is_aligned_and_ignores_minus_100() -> None:
    x = make_inputs(0)
    targets = x["target_ids"].clone()
    targets[0, 0] = -100
    got = compute_logprobs(x["logits"], targets)
    want = plain_logprobs(x["logits"].float(), targets.clamp(min=0))
    want[0, 0] = 0.0
    torch.testing.assert_close(got, want)
    assert got.dtype == torch.float32
    torch.testing.assert_close(compute_logprobs(x["logits"], x["target_ids"], temperature=2.0),
                               plain_logprobs(x["logits"].float() / 2, x["target_ids"]))
    with pytest.raises(ValueError, match="aligned with target_ids"):
        compute_logprobs(x["logits"], x["target_ids"][:, 1:])


def test_create_shifted_targets_follows_torchforge() -> None:
    ids = torch.tensor([[5, 6, 7, 8]])
    assert create_shifted_targets(ids).tolist() == [[6, 7, 8, -100]]
    mask = torch.tensor([[0, 1, 1, 1]])
    assert create_shifted_targets(ids, mask).tolist() == [[-100, 7, 8, -100]]


def test_compute_ratio_token_sequence_and_on_policy() -> None:
    x = make_inputs(1)
    lp = plain_logprobs(x["logits"], x["target_ids"]).requires_grad_()
    gen, mask = x["generator_logprobs"], x["loss_mask"]
    torch.testing.assert_close(compute_ratio(lp, gen, mask), torch.exp(lp - gen))
    seq = compute_ratio(lp, gen, mask, ratio_type="sequence")
    for b in range(B):
        n = int(mask[b].sum())
        s = torch.exp((lp[b, :n] - gen[b, :n]).mean())
        torch.testing.assert_close(seq[b, :n], s.expand(n))
    on = compute_ratio(lp, None, mask)
    assert torch.equal(on.detach(), torch.ones(B, T, dtype=lp.dtype))
    on.sum().backward()
    torch.testing.assert_close(lp.grad, torch.ones(B, T, dtype=lp.dtype))  # the policy gradient survives
    with pytest.raises(ValueError, match="ratio_type"):
        compute_ratio(lp, gen, mask, ratio_type="group")


def test_compute_kl_estimators_and_missing_ref() -> None:
    lp = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-1.5, -2.0]])
    d = ref - lp
    torch.testing.assert_close(compute_kl(lp, ref), torch.exp(d) - d - 1)
    torch.testing.assert_close(compute_kl(lp, ref, kl_type="k1"), lp - ref)
    torch.testing.assert_close(compute_kl(lp, ref, kl_type="k2"), 0.5 * (lp - ref) ** 2)
    assert compute_kl(torch.tensor([[-30.0]]), torch.tensor([[0.0]])).item() == 10.0  # torchforge's cap
    with pytest.raises(ValueError, match="ref_logprobs is None.*beta=0"):
        compute_kl(lp, None, torch.ones(1, 2))


def test_aggregate_torchforge_names_by_hand() -> None:
    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert aggregate(per_token, mask).item() == pytest.approx(10 / 4)  # token_mean by default
    assert aggregate(per_token, mask, "fixed_horizon").item() == pytest.approx(10 / 6)
    assert aggregate(per_token, mask, "sequence_mean").item() == pytest.approx((2 + 4) / 2)
    assert aggregate(per_token, mask, "seq-mean-token-sum").item() == pytest.approx(5.0)  # forge_nb's too
    assert aggregate(per_token, mask, "token_mean", loss_scale=20).item() == pytest.approx(0.5)
    with pytest.raises(ValueError, match="unknown aggregation 'mean'.*fixed_horizon"):
        aggregate(per_token, mask, "mean")


# ---- constructors ---------------------------------------------------------------------------------


def test_grpo_with_torchforge_names() -> None:
    loss_fn = GRPOLoss(clip_low=0.2, clip_high=0.28, beta=0.1, agg_type="fixed_horizon")
    assert loss_fn.agg == "seq-mean-token-sum-norm" and loss_fn.beta == 0.1
    x = make_inputs(2, noise=0.5)
    logits = x["logits"].clone().requires_grad_()
    loss, metrics = loss_fn(**{**x, "logits": logits})
    # torchforge's GRPOLoss, restated: per-token max(-rA, -clip(r, 0.8, 1.28)A) + 0.1 k3, / (B * T)
    lp = plain_logprobs(logits, x["target_ids"])
    r = torch.exp(lp - x["generator_logprobs"])
    a = x["advantages"]
    per_token = torch.maximum(-r * a, -r.clamp(0.8, 1.28) * a) + 0.1 * compute_kl(lp, x["ref_logprobs"])
    want = (per_token * x["loss_mask"]).sum() / (B * T)
    torch.testing.assert_close(loss, want.float())  # logprobs from logits are float32, as torchforge's
    assert metrics["clip/frac_high"] + metrics["clip/frac_low"] > 0  # the inputs exercise both clips
    (g1,) = torch.autograd.grad(loss, logits)
    (g2,) = torch.autograd.grad(want, logits)
    torch.testing.assert_close(g1, g2, rtol=1e-5, atol=1e-7)


def test_agg_type_and_clip_range_errors_and_set_hparams_replace() -> None:
    with pytest.raises(ValueError, match="agg_type.*unknown aggregation 'per_token'.*token_mean"):
        GRPOLoss(agg_type="per_token")
    with pytest.raises(ValueError, match="name different aggregations"):
        GRPOLoss(agg="token-mean", agg_type="fixed_horizon")
    assert GRPOLoss(agg="fixed_horizon").agg == "seq-mean-token-sum-norm"
    dapo = DAPOLoss(clip_range=0.2, adaptive_kl=True, kl_target=0.01)
    assert (dapo.clip_low, dapo.clip_high, dapo.kl_target, dapo.beta) == (0.2, 0.2, 0.01, 0.1)
    with pytest.raises(ValueError, match="clip_range=0.2 sets clip_low and clip_high, but clip_high=0.3"):
        DAPOLoss(clip_range=0.2, clip_high=0.3)
    with pytest.raises(ValueError, match="dual_clip_c"):
        DAPOLoss(dual_clip_c=0.5)
    # RLTrainer.set_hparams rebuilds the loss with dataclasses.replace: the aliases must not come back
    grpo = dataclasses.replace(GRPOLoss(agg_type="fixed_horizon"), agg="token-mean")
    assert grpo.agg == "token-mean"
    assert dataclasses.replace(dapo, clip_high=0.3).clip_high == 0.3


def test_other_losses_take_torchforge_arguments() -> None:
    x = make_inputs(3)
    for loss_fn in (
        CISPOLoss(clip_low=1.0, clip_high=4.0, agg_type="token_mean"),
        GSPOLoss(clip_low=0.2, clip_high=0.2, agg_type="sequence_mean"),
        SAPOLoss(tau_pos=1.0, tau_neg=1.05, agg_type="sequence_mean"),
        DAPOLoss(clip_low=0.2, clip_high=0.28, dual_clip_c=3.0, agg_type="token_mean"),
    ):
        loss, metrics = loss_fn(**x)
        assert torch.isfinite(loss) and metrics["loss/total"] == pytest.approx(loss.item())


def test_dapo_dual_clip_caps_negative_advantage_tokens() -> None:
    lp = torch.tensor([[0.0, 0.0]], dtype=torch.float64, requires_grad=True)
    gen = torch.tensor([[-3.0, 0.0]], dtype=torch.float64)  # token 0: ratio e^3 ~ 20
    adv = torch.tensor([[-1.0]], dtype=torch.float64)
    mask = torch.ones(1, 2, dtype=torch.bool)
    loss, metrics = DAPOLoss(dual_clip_c=3.0)(lp, None, gen, adv, mask)
    assert loss.item() == pytest.approx((3.0 + 1.0) / 2)  # min(20, 3) for token 0, ratio 1 for token 1
    assert metrics["clip/frac_dual"] == pytest.approx(0.5)
    loss.backward()
    assert lp.grad[0, 0].item() == 0.0 and lp.grad[0, 1].item() == pytest.approx(0.5)
    plain, _ = DAPOLoss()(lp, None, gen, adv, mask)
    assert plain.item() == pytest.approx((torch.e**3 + 1) / 2)


# ---- the TorchForge call form ---------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(losses.LOSSES))
def test_torchforge_call_form_equals_forge_nb_form(name: str) -> None:
    x = make_inputs(4)
    loss_fn = losses.make_loss(name, beta=0.05)
    logits = x["logits"].clone().requires_grad_()
    tf, tf_metrics = loss_fn(**{**x, "logits": logits})
    lp = plain_logprobs(logits, x["target_ids"])
    nb, nb_metrics = loss_fn(lp, x["ref_logprobs"], x["generator_logprobs"], x["advantages"], x["loss_mask"].bool(),
                             logits=logits)
    torch.testing.assert_close(tf, nb.float())
    assert tf_metrics.keys() == nb_metrics.keys()
    torch.testing.assert_close(torch.autograd.grad(tf, logits)[0], torch.autograd.grad(nb, logits)[0],
                               rtol=1e-5, atol=1e-7)
    positional, _ = loss_fn(x["logits"], x["target_ids"], x["advantages"], x["generator_logprobs"],
                            x["loss_mask"], x["ref_logprobs"])
    torch.testing.assert_close(positional, tf.detach())


@pytest.mark.parametrize("name", sorted(losses.LOSSES))
def test_per_token_advantages(name: str) -> None:
    x = make_inputs(5)
    loss_fn = losses.make_loss(name, beta=0.0)
    per_seq, _ = loss_fn(**x)
    per_token, _ = loss_fn(**{**x, "advantages": x["advantages"].expand(B, T).clone()})
    torch.testing.assert_close(per_token, per_seq)
    # tokens of one sequence with different advantages: only a token's own advantage moves it
    logits = x["logits"].clone().requires_grad_()
    adv = torch.zeros(B, T, dtype=torch.float64)
    adv[0, 1] = 1.0
    loss, _ = loss_fn(**{**x, "logits": logits, "advantages": adv, "generator_logprobs": None})
    (grad,) = torch.autograd.grad(loss, logits)
    assert grad[0, 1].abs().sum() > 0
    moved = grad.abs().sum(-1) > 0
    assert moved.sum() == 1


def test_card_custom_loss_computes_like_grpo() -> None:
    x = make_inputs(6, noise=0.5)
    logits = x["logits"].clone().requires_grad_()
    loss, metrics = CustomLoss(clip_range=0.2, beta=0.1)(**{**x, "logits": logits})
    ours, ours_metrics = GRPOLoss(clip_eps=0.2, beta=0.1, agg_type="token_mean")(**{**x, "logits": logits})
    torch.testing.assert_close(loss.float(), ours)  # ops' logprobs are float32, as torchforge's
    torch.testing.assert_close(torch.autograd.grad(loss, logits)[0], torch.autograd.grad(ours, logits)[0],
                               rtol=1e-5, atol=1e-7)
    assert metrics["pg_loss"] == pytest.approx(ours_metrics["loss/policy"], rel=1e-5)
    assert set(metrics) == {"pg_loss", "kl", "ratio_mean"}


def test_missing_ref_with_beta_is_refused_in_both_forms() -> None:
    x = {**make_inputs(7), "ref_logprobs": None}
    with pytest.raises(ValueError, match="beta=0.1 needs ref_logprobs"):
        GRPOLoss(beta=0.1)(**x)
    with pytest.raises(ValueError, match="ref_logprobs is None"):
        CustomLoss()(**x)
    loss, metrics = GRPOLoss(beta=0.0)(**x)
    assert torch.isfinite(loss) and "kl/k3" not in metrics


# ---- adaptive KL ----------------------------------------------------------------------------------


def test_adaptive_kl_follows_ppo_rule() -> None:
    x = make_inputs(8, noise=0.6)
    lp = plain_logprobs(x["logits"], x["target_ids"])
    loss_fn = DAPOLoss(clip_range=0.2, adaptive_kl=True, kl_target=0.01)
    betas = []
    for _ in range(3):  # ref far from the policy: KL ~ 0.05 > 0.015, beta doubles
        _, metrics = loss_fn(**x)
        betas.append(metrics["kl/beta"])
        assert metrics["kl/k3"] > 0.015
    assert betas == pytest.approx([0.1, 0.2, 0.4]) and loss_fn.beta == pytest.approx(0.8)
    with torch.no_grad():  # evaluation does not move it
        loss_fn(**x)
    assert loss_fn.beta == pytest.approx(0.8)
    for _ in range(2):  # ref == policy: KL 0 < 0.0067, beta halves
        loss_fn(**{**x, "ref_logprobs": lp.clone()})
    assert loss_fn.beta == pytest.approx(0.2)
    assert not GRPOLoss(beta=0.1).adaptive_kl
    fixed = GRPOLoss(beta=0.1)
    fixed(**x)
    assert fixed.beta == 0.1


def test_adaptive_kl_steers_training_towards_the_target() -> None:
    """Closed loop: a policy pushed away from its reference by a constant advantage. A fixed tiny beta lets
    the KL run away; the adaptive coefficient holds it near kl_target."""

    def train(loss_fn: losses.PolicyLoss) -> float:
        g = torch.Generator().manual_seed(9)
        logits = torch.randn(B, T, V, generator=g, dtype=torch.float64)
        target_ids = torch.randint(0, V, (B, T), generator=g)
        ref = plain_logprobs(logits, target_ids)
        param = logits.clone().requires_grad_()
        opt = torch.optim.SGD([param], lr=0.5)
        x = {"target_ids": target_ids, "loss_mask": torch.ones(B, T), "ref_logprobs": ref,
             "generator_logprobs": None, "advantages": torch.ones(B, 1, dtype=torch.float64)}
        kls = []
        for _ in range(150):
            loss, metrics = loss_fn(logits=param, **x)
            opt.zero_grad()
            loss.backward()
            opt.step()
            kls.append(metrics["kl/k3"])
        return sum(kls[-30:]) / 30

    target = 0.05
    adaptive = train(DAPOLoss(adaptive_kl=True, kl_target=target, agg_type="token_mean"))
    fixed = train(DAPOLoss(beta=1e-4, agg_type="token_mean"))
    assert target / 3 < adaptive < target * 3, adaptive
    assert fixed > 10 * target, fixed
