"""compute_logprobs and entropy_from_logits against plain softmax arithmetic."""

from __future__ import annotations

import pytest
import torch

from forge_nb.rl import aligned_logits, compute_logprobs, entropy_from_logits


def plain_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    out = torch.empty(targets.shape, dtype=torch.float64)
    for b in range(targets.shape[0]):
        for t in range(targets.shape[1]):
            z = logits[b, t].double()
            out[b, t] = z[targets[b, t]] - torch.log(torch.exp(z).sum())
    return out


def test_compute_logprobs_aligned_and_full_sequence() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 7, 13, generator=g)
    targets = torch.randint(0, 13, (3, 4), generator=g)
    expected = plain_logprobs(logits[:, 2:6], targets)
    aligned = compute_logprobs(logits[:, 2:6], targets)
    torch.testing.assert_close(aligned.double(), expected, rtol=1e-5, atol=1e-5)
    assert aligned.dtype == torch.float32
    # full sequence: positions L-T-1 .. L-2 predict the T response tokens
    whole = compute_logprobs(aligned_logits(logits, 4), targets)
    torch.testing.assert_close(whole.double(), expected, rtol=1e-5, atol=1e-5)


def test_the_native_and_the_documents_compute_logprobs_are_one_function() -> None:
    from forge_nb.rl.loss.ops import compute_logprobs as documents

    assert documents is compute_logprobs
    logits, targets = torch.randn(2, 3, 5), torch.tensor([[1, -100, 2], [-100, -100, 4]])
    out = compute_logprobs(logits, targets)
    assert out[0, 1] == 0 and out[1, 0] == 0 and out[1, 1] == 0 and out[0, 0] < 0  # ignored targets give 0


def test_compute_logprobs_temperature_and_bf16() -> None:
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 5, 9, generator=g)
    targets = torch.randint(0, 9, (2, 5), generator=g)
    hot = compute_logprobs(logits, targets, temperature=2.0)
    torch.testing.assert_close(hot.double(), plain_logprobs(logits / 2.0, targets), rtol=1e-5, atol=1e-5)
    low = compute_logprobs(logits.bfloat16(), targets)
    assert low.dtype == torch.float32
    torch.testing.assert_close(low.double(), plain_logprobs(logits.bfloat16(), targets), rtol=1e-4, atol=1e-4)


def test_compute_logprobs_gradient_flows() -> None:
    logits = torch.randn(2, 4, 6, requires_grad=True)
    targets = torch.randint(0, 6, (2, 3))
    compute_logprobs(aligned_logits(logits, 3), targets).sum().backward()
    assert logits.grad is not None
    assert logits.grad[:, -1].abs().sum() == 0  # the last position predicts nothing in the response


def test_compute_logprobs_errors() -> None:
    with pytest.raises(ValueError, match="T \\+ 1"):
        aligned_logits(torch.randn(1, 3, 5), 3)
    with pytest.raises(ValueError, match="aligned with target_ids"):
        compute_logprobs(torch.randn(1, 4, 5), torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="temperature"):
        compute_logprobs(torch.randn(1, 3, 5), torch.zeros(1, 3, dtype=torch.long), temperature=0.0)


def test_entropy_from_logits() -> None:
    logits = torch.randn(2, 3, 8)
    p = torch.softmax(logits.double(), -1)
    expected = -(p * torch.log(p)).sum(-1)
    torch.testing.assert_close(entropy_from_logits(logits).double(), expected, rtol=1e-5, atol=1e-5)
    uniform = entropy_from_logits(torch.zeros(4, 10))
    torch.testing.assert_close(uniform, torch.full((4,), float(torch.log(torch.tensor(10.0)))))
    peaked = entropy_from_logits(torch.tensor([[1e4, 0.0, 0.0]]))
    assert peaked.item() == pytest.approx(0.0, abs=1e-6)


def test_large_logits_are_reduced_a_row_at_a_time_to_the_same_values(monkeypatch) -> None:
    from forge_nb.rl.losses import ops

    torch.manual_seed(0)
    logits = torch.randn(3, 6, 11, requires_grad=True)
    targets = torch.randint(0, 11, (3, 6))
    one_pass = compute_logprobs(logits, targets, temperature=0.7), entropy_from_logits(logits)
    (grad_one_pass,) = torch.autograd.grad(one_pass[0].sum(), logits)
    monkeypatch.setattr(ops, "WHOLE_BATCH_ELEMENTS", 0)  # as for a batch of a large vocabulary
    by_rows = compute_logprobs(logits, targets, temperature=0.7), entropy_from_logits(logits)
    (grad_by_rows,) = torch.autograd.grad(by_rows[0].sum(), logits)
    for a, b in zip(one_pass, by_rows, strict=True):
        assert a.shape == b.shape and torch.allclose(a, b, atol=1e-6)
    assert torch.allclose(grad_one_pass, grad_by_rows, atol=1e-6)
