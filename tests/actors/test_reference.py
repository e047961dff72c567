"""ReferenceModel in a real monarch proc: frozen logprobs equal to the trainer's initial policy's."""

from __future__ import annotations

import os

import pytest
import torch

from forge_nb.models import build_tiny_model
from forge_nb.system.runtime import lifecycle, spawning
from tests.actors.test_trainer import first, make_batch

pytestmark = pytest.mark.timeout(120)


async def test_reference_logprobs_equal_the_initial_policy_and_ignore_padding(tmp_path) -> None:
    from transformers import AutoModelForCausalLM

    from forge_nb.actors.reference_model import ReferenceModel
    from forge_nb.actors.trainer import RLTrainer

    model = str(build_tiny_model(tmp_path / "tiny"))
    lifecycle.ensure_started()
    mesh = await spawning.spawn_mesh("reference-t", 1)
    try:
        ref = mesh.spawn("ref", ReferenceModel, model=model)
        trainer = mesh.spawn("policy", RLTrainer, model=model)
        await ref.setup.call()
        await trainer.setup.call()
        batch = make_batch(n=4)

        # torchforge's call: ref_model.forward.route(input_ids, max_req_tokens, return_logprobs=True)
        ref_lp = await ref.forward.call_one(batch.tokens, batch.request_len, return_logprobs=True)
        assert ref_lp.shape == batch.response.shape and ref_lp.dtype == torch.float32
        assert torch.equal(ref_lp, await ref.forward.call_one(batch))
        policy_lp = first(await trainer.forward.call(batch))
        torch.testing.assert_close(ref_lp, policy_lp, atol=1e-6, rtol=0)

        # Left padding is invisible: each row scores as the unpadded prompt + response would (vLLM's view).
        hf = AutoModelForCausalLM.from_pretrained(model, attn_implementation="sdpa").eval()
        for row in range(len(batch)):
            prompt = batch.tokens[row, : batch.request_len]
            prompt = prompt[(prompt != 0).cumsum(0) > 0]
            n = int(batch.response_mask[row].sum())
            ids = torch.cat([prompt, batch.response[row, :n]]).unsqueeze(0)
            with torch.no_grad():
                logp = torch.log_softmax(hf(ids).logits[0, len(prompt) - 1 : -1].float(), -1)
            expected = logp.gather(-1, batch.response[row, :n, None]).squeeze(-1)
            torch.testing.assert_close(ref_lp[row, :n], expected, atol=1e-5, rtol=0)

        logits = await ref.forward.call_one(batch.tokens, batch.request_len, return_logprobs=False)
        assert logits.shape == (*batch.tokens.shape, hf.config.vocab_size)
        with pytest.raises(Exception, match="max_req_tokens"):
            await ref.forward.call_one(batch.tokens)

        # Still the initial policy after the trainer has moved on.
        await trainer.train_step.call(batch)
        assert torch.equal(ref_lp, await ref.forward.call_one(batch))
        if not torch.cuda.is_available():
            info = await ref.info.call_one()
            assert info["engine"] == "transformers" and "no backward on CPU" in info["fallback_reason"]
            assert info["cpu_threads"] == int(os.environ.get("OMP_NUM_THREADS", "1"))
            assert info["flush_denormal"], "the steps compute with denormal floats (slow on CPU)"
    finally:
        await mesh.stop()
