"""The defaults a Generator gives vLLM that need no engine to check: on CPU the KV cache's size and the dtype;
logprobs asked for flat, and read alike in either of vLLM's shapes."""

from __future__ import annotations

import json

import pytest

from forge_nb.actors._vllm_worker import (
    CPU_KV_MAX,
    CPU_KV_MIN,
    CPU_KV_SEQS,
    checkpoint_dtype,
    cpu_kv_cache_bytes,
    make_sampling_params,
    sampled_logprobs,
)
from forge_nb.models import TinyModelConfig, build_tiny_model


def test_the_tiny_model_gets_a_small_kv_cache_and_a_large_model_the_cap(tmp_path) -> None:
    tiny = build_tiny_model(tmp_path / "tiny", TinyModelConfig())
    assert cpu_kv_cache_bytes(str(tiny), 16) == CPU_KV_MIN  # 2 layers x 2 heads x 64: ~2 KiB a token

    # Qwen3-1.7B's shape (its config.json's fields; no weights needed): 28 layers, 8 KV heads of 128
    qwen = tmp_path / "qwen3-1.7b"
    qwen.mkdir()
    (qwen / "config.json").write_text(json.dumps({
        "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
        "hidden_size": 2048}))
    per_token = 2 * 28 * 8 * 128 * 4
    assert cpu_kv_cache_bytes(str(qwen), 8) == per_token * 8 * CPU_KV_SEQS  # between the bounds: counted
    assert cpu_kv_cache_bytes(str(qwen), 4096) == CPU_KV_MAX


def test_what_cannot_be_counted_gets_the_cap(tmp_path) -> None:
    assert cpu_kv_cache_bytes(str(tmp_path / "missing"), 16) == CPU_KV_MAX
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"num_hidden_layers": 2}}))
    assert cpu_kv_cache_bytes(str(tmp_path), 16) == CPU_KV_MAX
    tiny = build_tiny_model(tmp_path / "tiny", TinyModelConfig())
    assert cpu_kv_cache_bytes(str(tiny), None) == CPU_KV_MAX  # no context length: no count


def test_a_float32_checkpoint_is_named_so_others_are_left_to_vllm(tmp_path) -> None:
    """What make_engine_args reads to keep a float32 checkpoint in float32 on CPU (the engine that then
    samples with the trainer's logprobs: tests/actors/test_generator.py)."""
    assert checkpoint_dtype(str(build_tiny_model(tmp_path / "tiny", TinyModelConfig()))) == "float32"
    for name, config in (("old", {"torch_dtype": "float32"}), ("bf16", {"dtype": "bfloat16"}), ("none", {}),
                         ("odd", {"dtype": {"text": "float32"}})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config))
    assert [checkpoint_dtype(str(tmp_path / n)) for n in ("old", "bf16", "none", "odd", "missing")] == [
        "float32", "bfloat16", None, None, None]


def test_logprobs_are_asked_for_flat_unless_the_user_says() -> None:
    params = make_sampling_params({"max_tokens": 4})
    assert (params.logprobs, params.flat_logprobs) == (0, True)
    assert make_sampling_params({"flat_logprobs": False}).flat_logprobs is False


@pytest.mark.parametrize("alternatives", [0, 2])
def test_sampled_logprobs_read_both_of_vllms_shapes_alike(alternatives: int) -> None:
    """vLLM's own containers, filled as its LogprobsProcessor fills them: the sampled token, then its
    alternatives (``logprobs=k``), which may include the sampled token again."""
    from vllm.logprobs import FlatLogprobs, Logprob

    sampled = [5, 7, 5]
    steps = []
    for position, token in enumerate(sampled):
        step = {token: Logprob(logprob=-0.5 - position, rank=2)}
        for rank, other in enumerate([token, 9][:alternatives], start=1):
            step.setdefault(other, Logprob(logprob=-0.1 * rank, rank=rank))
        steps.append(step)
    flat = FlatLogprobs()
    flat.extend(steps)

    from_dicts, from_flat = sampled_logprobs(sampled, steps), sampled_logprobs(sampled, flat)
    assert from_dicts == from_flat
    logprobs, top = from_flat
    assert logprobs == [-0.5, -1.5, -2.5]
    if alternatives:
        assert top[0] == [(9, -0.2), (5, -0.5)]  # best first; the sampled token once
    else:
        assert top is None
