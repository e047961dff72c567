"""The mismatch measures and corrections against hand-computed ratios, on real tensors."""

from __future__ import annotations

import math

import pytest
import torch

from forge_nb.rl import LOSSES, GRPOLoss, make_loss
from forge_nb.rl.losses.mismatch import CORRECTIONS, importance_weights, mismatch_metrics

# one row of four trained tokens and a padded one; ratios trainer / generator of 1, 2, 0.25 and 4
RATIOS = [1.0, 2.0, 0.25, 4.0]


def _row() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.log(torch.tensor([[0.4, 0.2, 0.8, 0.1, 0.5]], dtype=torch.float64))
    logp = gen + torch.log(torch.tensor([[*RATIOS, 7.0]], dtype=torch.float64))
    mask = torch.tensor([[True, True, True, True, False]])
    return logp, gen, mask


def test_token_truncate_caps_each_ratio() -> None:
    logp, gen, mask = _row()
    w, changed = importance_weights(logp, gen, mask, "token_truncate", cap=2.0)
    assert w[0].tolist() == pytest.approx([1.0, 2.0, 0.25, 2.0, 0.0])
    assert changed[0].tolist() == [False, False, False, True, False]  # 2.0 is at the cap, not above it


def test_token_mask_drops_outside_the_band() -> None:
    logp, gen, mask = _row()
    w, changed = importance_weights(logp, gen, mask, "token_mask", cap=2.0, floor=0.5)
    assert w[0].tolist() == pytest.approx([1.0, 2.0, 0.0, 0.0, 0.0])
    assert changed[0].tolist() == [False, False, True, True, False]
    w, _ = importance_weights(logp, gen, mask, "token_mask", cap=3.0)  # floor 0: only the top is masked
    assert w[0].tolist() == pytest.approx([1.0, 2.0, 0.25, 0.0, 0.0])


def test_sequence_modes_use_the_geometric_mean() -> None:
    logp, gen, mask = _row()
    geo = math.prod(RATIOS) ** (1 / len(RATIOS))  # (1 * 2 * 0.25 * 4) ** 0.25 = 2 ** 0.25
    w, changed = importance_weights(logp, gen, mask, "sequence_truncate", cap=2.0)
    assert w[0].tolist() == pytest.approx([geo] * 4 + [0.0])
    assert not changed.any()
    w, changed = importance_weights(logp, gen, mask, "sequence_truncate", cap=1.1)
    assert w[0].tolist() == pytest.approx([1.1] * 4 + [0.0])
    w, changed = importance_weights(logp, gen, mask, "sequence_mask", cap=1.1)
    assert w[0].tolist() == pytest.approx([0.0] * 5)
    assert changed[0].tolist() == [True] * 4 + [False]


def test_metrics_k3_quantiles_and_band() -> None:
    logp, gen, mask = _row()
    m = mismatch_metrics(logp, gen, mask, cap=2.0)
    k3 = [r - 1 - math.log(r) for r in RATIOS]
    assert m["mismatch/kl"] == pytest.approx(sum(k3) / 4)
    assert m["mismatch/ratio_min"] == pytest.approx(0.25) and m["mismatch/ratio_max"] == pytest.approx(4.0)
    ordered = torch.tensor(sorted(RATIOS), dtype=torch.float64)
    for q, name in ((0.01, "p1"), (0.5, "p50"), (0.99, "p99")):
        assert m[f"mismatch/ratio_{name}"] == pytest.approx(float(torch.quantile(ordered, q)))
    assert m["mismatch/frac_outside"] == pytest.approx(0.5)  # 0.25 and 4 lie outside [0.5, 2]
    assert "mismatch/kl_same_version" not in m
    m = mismatch_metrics(logp, gen, mask, cap=2.0, rows=torch.tensor([False]))
    assert "mismatch/kl_same_version" not in m


def test_k3_is_an_unbiased_kl_estimate() -> None:
    """Averaged over samples of the generator, k3 is KL(generator || trainer), computed exactly here."""
    g = torch.Generator().manual_seed(0)
    p_gen = torch.softmax(torch.randn(6, generator=g, dtype=torch.float64), 0)
    p_train = torch.softmax(torch.log(p_gen) + 0.3 * torch.randn(6, generator=g, dtype=torch.float64), 0)
    exact = float((p_gen * (p_gen.log() - p_train.log())).sum())
    # every outcome weighted by its probability: the expectation of k3, enumerated
    k3 = p_train / p_gen - 1 - (p_train.log() - p_gen.log())
    assert float((p_gen * k3).sum()) == pytest.approx(exact)
    tokens = torch.multinomial(p_gen, 200_000, replacement=True, generator=g).reshape(1, -1)
    m = mismatch_metrics(p_train.log()[tokens], p_gen.log()[tokens], torch.ones_like(tokens, dtype=torch.bool), 2.0)
    assert m["mismatch/kl"] == pytest.approx(exact, rel=0.05)


@pytest.mark.parametrize("name", sorted(LOSSES))
@pytest.mark.parametrize("correction", CORRECTIONS[1:])
def test_every_loss_weights_its_policy_terms(name: str, correction: str) -> None:
    """With a correction, each loss is its on-policy loss with each token's term times its weight: checked
    by giving the same loss the weights as advantages per token (the ratio against the trainer is 1)."""
    g = torch.Generator().manual_seed(1)
    logp = torch.log(torch.rand(3, 5, generator=g, dtype=torch.float64) * 0.8 + 0.1).requires_grad_()
    gen = logp.detach() + 0.6 * torch.randn(3, 5, generator=g, dtype=torch.float64)
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[1, 3:] = False
    adv = torch.tensor([[1.0], [-0.5], [2.0]], dtype=torch.float64)
    loss = make_loss(name, beta=0.0, mismatch_correction=correction, mismatch_cap=1.5, mismatch_floor=0.5)
    value, metrics = loss(logp, None, gen, adv, mask)
    w, changed = importance_weights(logp, gen, mask, correction, 1.5, 0.5)
    plain = make_loss(name, beta=0.0)
    terms = plain._policy_terms(logp, logp.detach(), adv.expand(3, 5), mask).per_token
    from forge_nb.rl import aggregate

    expected = aggregate(terms * w, mask, plain.agg, plain.norm_len)
    assert float(value.detach()) == pytest.approx(float(expected.detach()), abs=1e-12)
    grad, = torch.autograd.grad(value, logp)
    grad_expected, = torch.autograd.grad(expected, logp)
    assert torch.allclose(grad, grad_expected, atol=1e-12)
    what = "truncated" if correction.endswith("truncate") else "masked"
    assert metrics[f"mismatch/frac_{what}"] == pytest.approx(float(changed.sum() / mask.sum()))
    assert metrics["mismatch/kl"] > 0


def test_off_keeps_the_ratio_against_the_generator() -> None:
    logp, gen, mask = _row()
    adv = torch.ones(1, 1, dtype=torch.float64)
    with_metrics, metrics = GRPOLoss(beta=0.0)(logp, None, gen, adv, mask)
    assert metrics["ratio/max"] == pytest.approx(4.0)  # the loss's own ratio is against the generator
    assert "mismatch/frac_truncated" not in metrics and metrics["mismatch/frac_outside"] == pytest.approx(0.5)
    _, on = GRPOLoss(beta=0.0, mismatch_correction="token_truncate")(logp, None, gen, adv, mask)
    assert on["ratio/max"] == pytest.approx(1.0)  # against the trainer's own logprobs: 1 in value


@pytest.mark.parametrize(("field", "value", "words"), [
    ("mismatch_cap", 0.8, "mismatch_cap=0.8: must be a finite number >= 1"),
    ("mismatch_cap", math.inf, "mismatch_cap=inf"),
    ("mismatch_floor", 1.0, "mismatch_floor=1.0: must be in [0, 1)"),
    ("mismatch_correction", "tis", "mismatch_correction='tis': choose one of"),
])
def test_bad_settings_are_refused_with_the_field(field: str, value: object, words: str) -> None:
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        GRPOLoss(**{field: value})


def test_a_correction_is_hot_changeable_like_other_loss_fields() -> None:
    from forge_nb.actors.training.config import with_hparams
    from forge_nb.config.trainer_sections import OptimizerConfig, TrainingConfig

    opt, train, loss = with_hparams(OptimizerConfig(), TrainingConfig(), GRPOLoss(),
                                    {"mismatch_correction": "sequence_mask", "mismatch_cap": 3.0})
    assert (loss.mismatch_correction, loss.mismatch_cap) == ("sequence_mask", 3.0)
    with pytest.raises(ValueError, match="mismatch_cap=0.5"):
        with_hparams(opt, train, loss, {"mismatch_cap": 0.5})


def test_per_row_ratios_travel_apart_from_the_metrics_and_the_explorer_colours_them() -> None:
    from forge_nb.rl.losses.mismatch import TOKEN_RATIOS, token_ratios
    from forge_nb.rl.types import ForwardBackwardResult
    from forge_nb.widgets.explorer import render_episodes

    logp, gen, mask = _row()
    rows = token_ratios(logp, gen, mask)
    assert [float(v) for v in rows[0]] == pytest.approx(RATIOS, rel=1e-3)  # float16, trained tokens only
    result = ForwardBackwardResult(loss=0.5, metrics={"loss": 0.5, TOKEN_RATIOS: rows})
    assert result.metrics == {"loss": 0.5} and result.rows[TOKEN_RATIOS] is rows
    html = render_episodes([{"episode_id": "e1", "token_ratios": RATIOS}])
    assert "ratio trainer / generator" in html and html.count("#d62728") == 2  # 0.25 and 4 are far off
