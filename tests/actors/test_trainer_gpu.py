"""RLTrainer on CUDA: a few steps through whichever engine works there, and a weight push. Skipped without CUDA.

The trainer picks torchtitan where it can train and says why not otherwise (on torch 2.11,
``torchtitan.models.qwen3`` does not import); either way the steps must train and the push must hold the
trainer's weights under Hugging Face names.
"""

from __future__ import annotations

import math

import pytest
import torch

from forge_nb import weights
from forge_nb.models import build_tiny_model
from forge_nb.system.runtime import lifecycle, spawning
from tests.actors.test_trainer import METRIC_KEYS, assert_same, differs, first, make_batch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.timeout(300),
]


async def _train_and_push(model: str, procs: int, dtype: str) -> None:
    from forge_nb.actors.trainer import RLTrainer

    mesh = await spawning.spawn_mesh(f"trainer-gpu{procs}", procs, with_gpus=True)
    try:
        trainer = mesh.spawn(
            "trainer", RLTrainer, model=model, optimizer={"lr": 1e-3}, training={"dtype": dtype}
        )
        await trainer.setup.call()
        info = first(await trainer.info.call())
        assert info["device"].startswith("cuda") and info["world_size"] == procs
        assert info["engine"] == "torchtitan" or info["fallback_reason"], info

        initial = first(await trainer.state_dict.call())["model"]
        batch = make_batch(n=4 * procs)
        for i in range(3):
            result = first(await trainer.train_step.call(batch))  # a ForwardBackwardResult, as on CPU
            metrics = result.metrics
            assert METRIC_KEYS <= metrics.keys() and metrics["skipped"] == 0.0 and metrics["step"] == i + 1
            assert math.isfinite(result.loss) and result.loss == metrics["loss"]
        trained = first(await trainer.state_dict.call())["model"]
        assert differs(initial, trained)

        await trainer.push_weights.call(procs)
        pushed = {k: v.cpu() for k, v in (await weights.load_state_dict(procs)).items()}
        expected = {k: v.to(pushed[k].dtype) for k, v in trained.items()}
        assert_same(pushed, expected)
        await trainer.cleanup.call()
    finally:
        await mesh.stop()


async def test_train_steps_and_push_on_one_gpu(tmp_path) -> None:
    model = str(build_tiny_model(tmp_path / "tiny"))
    lifecycle.ensure_started()
    await weights.initialize_store()
    try:
        await _train_and_push(model, procs=1, dtype="bfloat16")
    finally:
        await weights.shutdown_store()


async def test_reference_model_on_a_gpu_scores_as_the_trainers_initial_policy(tmp_path) -> None:
    """tests/actors/test_reference.py's check where the two run on CUDA: the frozen logprobs are the
    trainer's initial ones, and stay so after a step."""
    from forge_nb.actors.reference_model import ReferenceModel
    from forge_nb.actors.trainer import RLTrainer

    model = str(build_tiny_model(tmp_path / "tiny"))
    lifecycle.ensure_started()
    mesh = await spawning.spawn_mesh("reference-gpu", 1, with_gpus=True)
    try:
        ref = mesh.spawn("ref", ReferenceModel, model=model)
        trainer = mesh.spawn("policy", RLTrainer, model=model, optimizer={"lr": 1e-3})
        await ref.setup.call()
        await trainer.setup.call()
        assert (await ref.info.call_one())["device"].startswith("cuda")
        batch = make_batch(n=4)
        ref_lp = await ref.forward.call_one(batch.tokens, batch.request_len, return_logprobs=True)
        assert ref_lp.shape == batch.response.shape and ref_lp.dtype == torch.float32
        torch.testing.assert_close(ref_lp, first(await trainer.forward.call(batch)).cpu(), atol=1e-5, rtol=0)
        await trainer.train_step.call(batch)
        assert torch.equal(ref_lp, await ref.forward.call_one(batch))
        assert not torch.allclose(ref_lp, first(await trainer.forward.call(batch)).cpu(), atol=1e-5, rtol=0)
    finally:
        await mesh.stop()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
async def test_fsdp_over_two_gpus(tmp_path) -> None:
    model = str(build_tiny_model(tmp_path / "tiny"))
    lifecycle.ensure_started()
    await weights.initialize_store()
    try:
        await _train_and_push(model, procs=2, dtype="float32")
    finally:
        await weights.shutdown_store()
