"""Every policy loss against a plain float64 loop reference: values, gradients and limiting cases."""

from __future__ import annotations

import math

import pytest
import torch

from forge_nb.rl import (
    AGG_MODES,
    LOSSES,
    CISPOLoss,
    DAPOLoss,
    DrGRPOLoss,
    GRPOLoss,
    GSPOLoss,
    SAPOLoss,
    aggregate,
    group_relative,
    make_loss,
)

B, T = 4, 6


def make_inputs(seed: int, noise: float = 0.25) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logprobs = torch.log(torch.rand(B, T, generator=g, dtype=torch.float64) * 0.9 + 0.05)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, 4:] = False
    mask[2, 2:] = False
    return {
        "logprobs": logprobs,
        "generator_logprobs": logprobs + noise * torch.randn(B, T, generator=g, dtype=torch.float64),
        "ref_logprobs": logprobs + noise * torch.randn(B, T, generator=g, dtype=torch.float64),
        "advantages": torch.randn(B, 1, generator=g, dtype=torch.float64),
        "mask": mask,
    }


# ---- the reference: scalar loops, written from the papers' formulas, sharing nothing with the code ----


def clip(x: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    return min(max(x, torch.tensor(lo, dtype=x.dtype)), torch.tensor(hi, dtype=x.dtype))


def ref_aggregate(rows: list[list[torch.Tensor]], mode: str, norm_len: int) -> torch.Tensor:
    """rows[b] holds the per-token losses of the valid tokens of sequence b."""
    zero = torch.zeros((), dtype=torch.float64)
    if mode == "token-mean":
        tokens = [x for row in rows for x in row]
        return sum(tokens, zero) / max(len(tokens), 1)
    if mode == "seq-mean-token-mean":
        return sum((sum(row, zero) / max(len(row), 1) for row in rows), zero) / len(rows)
    if mode == "seq-mean-token-sum":
        return sum((sum(row, zero) for row in rows), zero) / len(rows)
    if mode == "seq-mean-token-sum-norm":
        return sum((x for row in rows for x in row), zero) / (len(rows) * norm_len)
    raise AssertionError(mode)


def reference_loss(loss_fn, logprobs, ref_logprobs, generator_logprobs, advantages, mask) -> torch.Tensor:
    policy_rows: list[list[torch.Tensor]] = []
    kl_rows: list[list[torch.Tensor]] = []
    for b in range(logprobs.shape[0]):
        a = advantages[b, 0]
        valid = [t for t in range(logprobs.shape[1]) if mask[b, t]]
        old = [
            generator_logprobs[b, t] if generator_logprobs is not None else logprobs[b, t].detach()
            for t in valid
        ]
        lps = [logprobs[b, t] for t in valid]
        if ref_logprobs is not None:
            kl_rows.append(
                [
                    torch.exp(ref_logprobs[b, t] - lp) - (ref_logprobs[b, t] - lp) - 1
                    for t, lp in zip(valid, lps, strict=True)
                ]
            )
        if isinstance(loss_fn, GSPOLoss):
            if valid:
                s = torch.exp(sum(lp - o for lp, o in zip(lps, old, strict=True)) / len(valid))
                per_seq = -min(s * a, clip(s, 1 - loss_fn.clip_low, 1 + loss_fn.clip_high) * a)
            else:
                per_seq = torch.zeros((), dtype=torch.float64)
            policy_rows.append([per_seq] * len(valid))
            continue
        row = []
        for lp, o in zip(lps, old, strict=True):
            r = torch.exp(lp - o)
            if isinstance(loss_fn, (GRPOLoss, DrGRPOLoss)):
                row.append(-min(r * a, clip(r, 1 - loss_fn.clip_eps, 1 + loss_fn.clip_eps) * a))
            elif isinstance(loss_fn, DAPOLoss):
                row.append(-min(r * a, clip(r, 1 - loss_fn.clip_low, 1 + loss_fn.clip_high) * a))
            elif isinstance(loss_fn, CISPOLoss):
                lo = -math.inf if loss_fn.clip_low is None else 1 - loss_fn.clip_low
                w = clip(r.detach(), lo, 1 + loss_fn.clip_high)
                row.append(-w * a * lp)
            elif isinstance(loss_fn, SAPOLoss):
                tau = loss_fn.tau_pos if a > 0 else loss_fn.tau_neg
                gate = 1 / (1 + torch.exp(-tau * (r - 1)))
                row.append(-(4 / tau) * gate * a)
            else:
                raise AssertionError(type(loss_fn))
        policy_rows.append(row)
    norm = loss_fn.norm_len or logprobs.shape[1]
    total = ref_aggregate(policy_rows, loss_fn.agg, norm)
    if loss_fn.beta > 0:
        total = total + loss_fn.beta * ref_aggregate(kl_rows, loss_fn.agg, norm)
    return total


CONFIGS = [
    GRPOLoss(),
    GRPOLoss(beta=0.0, clip_eps=0.1, agg="token-mean"),
    DrGRPOLoss(beta=0.05),
    DrGRPOLoss(norm_len=16),
    DAPOLoss(),
    DAPOLoss(beta=0.2, agg="seq-mean-token-sum"),
    CISPOLoss(),
    CISPOLoss(clip_low=0.1, clip_high=0.1, beta=0.1),
    GSPOLoss(clip_low=0.02, clip_high=0.03),
    GSPOLoss(beta=0.1),
    SAPOLoss(),
    SAPOLoss(tau_pos=2.0, tau_neg=5.0, beta=0.1, agg="token-mean"),
]


@pytest.mark.parametrize("loss_fn", CONFIGS, ids=lambda c: repr(c))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_loss_and_grad_match_reference(loss_fn, seed: int) -> None:
    inputs = make_inputs(seed)
    lp = inputs["logprobs"].clone().requires_grad_()
    lp_ref = inputs["logprobs"].clone().requires_grad_()
    others = {k: v for k, v in inputs.items() if k != "logprobs"}

    loss, metrics = loss_fn(lp, **others)
    expected = reference_loss(loss_fn, lp_ref, **others)
    torch.testing.assert_close(loss, expected, rtol=1e-10, atol=1e-12)

    loss.backward()
    expected.backward()
    torch.testing.assert_close(lp.grad, lp_ref.grad, rtol=1e-9, atol=1e-12)
    assert lp.grad.abs().sum() > 0
    assert lp.grad[~inputs["mask"]].abs().sum() == 0  # padding never gets gradient
    assert all(isinstance(v, float) for v in metrics.values())


@pytest.mark.parametrize("mode", AGG_MODES)
def test_grpo_every_aggregation_matches_reference(mode: str) -> None:
    inputs = make_inputs(7)
    loss_fn = GRPOLoss(agg=mode)
    lp = inputs["logprobs"].clone().requires_grad_()
    lp_ref = inputs["logprobs"].clone().requires_grad_()
    others = {k: v for k, v in inputs.items() if k != "logprobs"}
    loss, _ = loss_fn(lp, **others)
    expected = reference_loss(loss_fn, lp_ref, **others)
    torch.testing.assert_close(loss, expected, rtol=1e-10, atol=1e-12)
    loss.backward()
    expected.backward()
    torch.testing.assert_close(lp.grad, lp_ref.grad, rtol=1e-9, atol=1e-12)


def test_aggregate_by_hand() -> None:
    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[True, True, True], [True, False, False]])
    assert aggregate(per_token, mask, "token-mean").item() == pytest.approx(10 / 4)
    assert aggregate(per_token, mask, "seq-mean-token-mean").item() == pytest.approx((2 + 4) / 2)
    assert aggregate(per_token, mask, "seq-mean-token-sum").item() == pytest.approx((6 + 4) / 2)
    assert aggregate(per_token, mask, "seq-mean-token-sum-norm").item() == pytest.approx(10 / (2 * 3))
    assert aggregate(per_token, mask, "seq-mean-token-sum-norm", norm_len=5).item() == pytest.approx(1.0)
    assert aggregate(per_token, torch.zeros_like(mask), "token-mean").item() == 0.0


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_beta_zero_removes_kl(name: str) -> None:
    inputs = make_inputs(3)
    with_ref, _ = make_loss(name, beta=0.0)(**inputs)
    without_ref, metrics = make_loss(name, beta=0.0)(**{**inputs, "ref_logprobs": None})
    torch.testing.assert_close(with_ref, without_ref)
    assert "kl/k3" not in metrics
    with_kl, _ = make_loss(name, beta=0.5)(**inputs)
    assert with_kl.item() > with_ref.item()  # k3 > 0 whenever ref differs from the policy


@pytest.mark.parametrize("name", sorted(LOSSES))
@pytest.mark.parametrize("on_policy", ["none", "equal"])
def test_ratio_one_gives_plain_policy_gradient(name: str, on_policy: str) -> None:
    """With generator == current policy every ratio is 1: no clipping, gradient = -A * aggregation weight."""
    inputs = make_inputs(4)
    loss_fn = make_loss(name, beta=0.0)
    lp = inputs["logprobs"].clone().requires_grad_()
    generator = None if on_policy == "none" else inputs["logprobs"].clone()
    loss, metrics = loss_fn(lp, None, generator, inputs["advantages"], inputs["mask"])
    loss.backward()

    lp_pg = inputs["logprobs"].clone().requires_grad_()
    aggregate(-inputs["advantages"] * lp_pg, inputs["mask"], loss_fn.agg, loss_fn.norm_len).backward()
    torch.testing.assert_close(lp.grad, lp_pg.grad, rtol=1e-10, atol=1e-12)
    assert metrics["clip/frac_low"] == metrics["clip/frac_high"] == 0.0
    assert metrics["ratio/mean"] == pytest.approx(1.0) and metrics["ratio/max"] == pytest.approx(1.0)


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_equal_rewards_give_zero_policy_loss(name: str) -> None:
    inputs = make_inputs(5)
    advantages = group_relative(torch.full((B,), 0.7, dtype=torch.float64)).unsqueeze(-1)
    lp = inputs["logprobs"].clone().requires_grad_()
    loss, metrics = make_loss(name, beta=0.0)(
        lp, None, inputs["generator_logprobs"], advantages, inputs["mask"]
    )
    loss.backward()
    assert loss.item() == 0.0 and metrics["loss/policy"] == 0.0
    assert lp.grad.abs().max().item() == 0.0


def test_grpo_defaults_reproduce_the_seed_simple_grpo_loss() -> None:
    inputs = make_inputs(6)
    lp, ref, adv, mask = inputs["logprobs"], inputs["ref_logprobs"], inputs["advantages"], inputs["mask"]
    # torchforge apps/grpo/main.py simple_grpo_loss, beta=0.1, restated
    kl = torch.exp(ref - lp) - (ref - lp) - 1
    per_token = -(torch.exp(lp - lp.detach()) * adv - 0.1 * kl)
    seed = ((per_token * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)).mean()
    loss, _ = GRPOLoss()(lp, ref, None, adv, mask)
    torch.testing.assert_close(loss, seed)


def test_clip_metrics_count_active_clips() -> None:
    inputs = make_inputs(8, noise=0.6)
    _, metrics = GRPOLoss(beta=0.0)(**inputs)
    r = torch.exp(inputs["logprobs"] - inputs["generator_logprobs"])
    a = inputs["advantages"].expand_as(r)
    m = inputs["mask"]
    n = m.sum().item()
    high = ((a > 0) & (r > 1.2) & m).sum().item() / n
    low = ((a < 0) & (r < 0.8) & m).sum().item() / n
    assert high + low > 0  # the inputs exercise clipping
    assert metrics["clip/frac_high"] == pytest.approx(high)
    assert metrics["clip/frac_low"] == pytest.approx(low)
    assert metrics["ratio/max"] == pytest.approx(r[m].max().item())
    assert metrics["ratio/mean"] == pytest.approx(r[m].mean().item())


def test_kl_and_entropy_metrics() -> None:
    inputs = make_inputs(9)
    logits = torch.randn(B, T, 11, dtype=torch.float64)
    _, metrics = DAPOLoss()(**inputs, logits=logits)
    m = inputs["mask"]
    diff = inputs["logprobs"] - inputs["ref_logprobs"]
    assert metrics["kl/k1"] == pytest.approx(diff[m].mean().item())
    assert metrics["kl/k3"] == pytest.approx((torch.exp(-diff) + diff - 1)[m].mean().item())
    p = torch.softmax(logits, -1)
    entropy = -(p * torch.log(p)).sum(-1)
    assert metrics["entropy"] == pytest.approx(entropy[m].mean().item())
    assert {"loss/policy", "clip/frac_low", "clip/frac_high", "ratio/mean", "ratio/max"} <= metrics.keys()


def test_float32_inputs_and_1d_advantages() -> None:
    inputs = {k: (v.float() if v.is_floating_point() else v) for k, v in make_inputs(10).items()}
    loss_2d, _ = SAPOLoss()(**inputs)
    loss_1d, _ = SAPOLoss()(**{**inputs, "advantages": inputs["advantages"].squeeze(-1)})
    assert loss_2d.dtype == torch.float32
    torch.testing.assert_close(loss_2d, loss_1d)


def test_make_loss_registry_and_errors() -> None:
    assert set(LOSSES) == {"grpo", "dr_grpo", "dapo", "cispo", "gspo", "sapo"}
    assert isinstance(make_loss("Dr-GRPO"), DrGRPOLoss)
    assert make_loss("dapo", clip_high=0.3).clip_high == 0.3
    with pytest.raises(ValueError, match=r"unknown loss 'ppo'.*cispo.*grpo"):
        make_loss("ppo")
    with pytest.raises(ValueError, match="clip_eps"):
        make_loss("dapo", clip_eps=0.2)


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: GRPOLoss(clip_eps=0.0), "clip_eps"),
        (lambda: GRPOLoss(beta=-0.1), "beta"),
        (lambda: DAPOLoss(agg="mean"), "agg"),
        (lambda: DrGRPOLoss(norm_len=0), "norm_len"),
        (lambda: SAPOLoss(tau_neg=0.0), "tau_neg"),
        (lambda: GSPOLoss(clip_high=-1.0), "clip_high"),
    ],
)
def test_config_validation_names_the_field(build, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        build()


def test_call_validation() -> None:
    inputs = make_inputs(11)
    with pytest.raises(ValueError, match="needs ref_logprobs"):
        GRPOLoss(beta=0.1)(**{**inputs, "ref_logprobs": None})
    with pytest.raises(ValueError, match="mask has shape"):
        GRPOLoss()(**{**inputs, "mask": inputs["mask"][:, :3]})
    with pytest.raises(ValueError, match="advantages"):
        GRPOLoss()(**{**inputs, "advantages": torch.zeros(B + 1)})
