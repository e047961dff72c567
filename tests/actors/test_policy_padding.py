"""Columns that are left padding in every row are dropped before the policy's forward, and nothing changes.

The controller pads every request to ``max_req_tokens``; the quickstart's prompts are one token, padded to
four. ``PolicyModel.without_shared_padding`` drops what every row pads, so the trainer and the reference model
run narrower batches. These tests check, on the tiny model in this process, that the response logprobs and the
gradients of a loss over them are those of the full-width batch.
"""

from __future__ import annotations

import pytest
import torch

from forge_nb.actors.training.policy_model import PolicyModel, response_logprobs
from forge_nb.models import build_tiny_model

pytestmark = pytest.mark.timeout(120)

PAD = 0
REQUEST_LEN = 8


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> PolicyModel:
    path = str(build_tiny_model(tmp_path_factory.mktemp("padding") / "tiny"))
    return PolicyModel(path, "transformers", torch.device("cpu"), pad_id=PAD)


def padded_batch(pads: list[int], seed: int = 0) -> torch.Tensor:
    """Rows of REQUEST_LEN request columns (``pads[i]`` of them left padding) and 4 response tokens."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(2, 10, (len(pads), REQUEST_LEN + 4), generator=g)
    for row, n in enumerate(pads):
        tokens[row, :n] = PAD
    return tokens


def loss_and_grads(policy: PolicyModel, tokens: torch.Tensor, request_len: int) -> tuple[torch.Tensor, list]:
    policy.module.zero_grad(set_to_none=True)
    logprobs = response_logprobs(policy.logits(tokens, request_len), tokens, request_len)
    advantages = torch.tensor([[1.0], [-0.5], [0.25]])
    (logprobs * advantages).mean().backward()
    grads = [p.grad.clone() for p in policy.module.parameters()]
    policy.module.zero_grad(set_to_none=True)
    return logprobs.detach(), grads


def test_padding_every_row_shares_is_dropped_and_the_step_is_the_same(policy: PolicyModel) -> None:
    tokens = padded_batch([5, 3, 4])
    kept, request_len = policy.without_shared_padding(tokens, REQUEST_LEN)
    assert request_len == REQUEST_LEN - 3 and torch.equal(kept, tokens[:, 3:])

    full_logprobs, full_grads = loss_and_grads(policy, tokens, REQUEST_LEN)
    kept_logprobs, kept_grads = loss_and_grads(policy, kept, request_len)
    torch.testing.assert_close(kept_logprobs, full_logprobs, atol=1e-5, rtol=0)
    for kept_grad, full_grad in zip(kept_grads, full_grads, strict=True):
        torch.testing.assert_close(kept_grad, full_grad, atol=1e-5, rtol=1e-4)


def test_the_column_before_the_response_stays(policy: PolicyModel) -> None:
    """Prompts that are all padding still predict their first response token from one column."""
    tokens = padded_batch([REQUEST_LEN] * 3)
    kept, request_len = policy.without_shared_padding(tokens, REQUEST_LEN)
    assert request_len == 1 and torch.equal(kept, tokens[:, REQUEST_LEN - 1:])


def test_nothing_is_dropped_where_a_row_needs_every_column(policy: PolicyModel) -> None:
    tokens = padded_batch([0, 6, 2])
    kept, request_len = policy.without_shared_padding(tokens, REQUEST_LEN)
    assert request_len == REQUEST_LEN and kept is tokens


def test_a_model_without_a_pad_id_keeps_its_batches(policy: PolicyModel) -> None:
    unpadded = PolicyModel.__new__(PolicyModel)
    unpadded.__dict__.update(policy.__dict__, pad_id=None)
    tokens = padded_batch([5, 3, 4])
    kept, request_len = unpadded.without_shared_padding(tokens, REQUEST_LEN)
    assert request_len == REQUEST_LEN and kept is tokens
